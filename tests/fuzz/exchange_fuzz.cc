// libFuzzer driver: the HTTP/1 client exchange given a random response, delivered whole and
// then cut into random pieces (each read by the client before the next is written), must tell
// the same story both times: the same status, fields, body and trailers, or the same error.
// The input's first two bytes seed the cuts; the rest is the response.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "spindle/client/exchange.h"
#include "testing/scripted_upstream.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;

namespace {

// What the client saw of one exchange (its whole story, as text).
std::string outcome(UpstreamConnections& pools, const Endpoint& endpoint) {
  RequestHead head;
  head.method = "GET";
  head.target = "/";
  auto ex = pools.open(endpoint, head, "upstream", ExchangeTimeouts{.first_byte = 2s, .read = 2s},
                       PoolLimits{}, /*fresh=*/true);
  if (!ex) return "open: " + ex.error().message();
  std::string text;
  (*ex)->on_informational(
      [&](const ClientResponseHead& h) { text += fmt::format("interim {}\n", h.status); });
  auto got = (*ex)->read_head();
  if (!got) return text + "head: " + got.error().message();
  text += fmt::format("{} {}\n", (*got)->status, (*got)->version);
  for (const Field& f : (*got)->headers) text += fmt::format("{}: {}\n", f.name, f.value);
  std::string buffer(1000, '\0');
  for (;;) {
    auto n = (*ex)->read(buffer);
    if (!n) return text + "body: " + n.error().message();
    if (*n == 0) break;
    text.append(buffer, 0, *n);
  }
  for (const Field& f : (*ex)->trailers()) text += fmt::format("\ntrailer {}: {}", f.name, f.value);
  return text;
}

struct World {
  spindle::testing::ScriptedUpstream upstream;
  Runtime runtime{RuntimeOptions{.workers = 1}};
  UpstreamConnections pools{runtime};
  Endpoint endpoint;
  World() { endpoint.address = *Address::parse(upstream.address()); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // For the process: its threads outlive any one input. Stopped at exit, before the leak
  // check: the upstream's threads may still be writing the last scripts (up to 2 s a piece for
  // a client that stopped reading), and what their frames held was reported as leaked.
  static World* world = [] {
    std::atexit([] { delete world; });
    return new World;
  }();
  if (size < 3 || size > 64 * 1024) return 0;
  std::string response(reinterpret_cast<const char*>(data) + 2, size - 2);
  std::mt19937 rng(data[0] | (data[1] << 8));
  std::vector<std::string> pieces;
  std::size_t at = 0;
  while (at < response.size()) {
    std::size_t n = std::uniform_int_distribution<std::size_t>(1, 64)(rng);
    pieces.push_back(response.substr(at, n));
    at += n;
  }
  std::string whole, cut;
  world->runtime.block_on([&] {
    world->upstream.push({{response}, /*close=*/true});
    whole = outcome(world->pools, world->endpoint);
    world->upstream.push({pieces, /*close=*/true});
    cut = outcome(world->pools, world->endpoint);
  });
  if (whole != cut) {
    std::fprintf(stderr, "whole delivery:\n%s\n---\nin %zu pieces:\n%s\n", whole.c_str(),
                 pieces.size(), cut.c_str());
    std::abort();
  }
  return 0;
}
