// The HTTP/1 client exchange with every response cut every way a network may cut it: one byte
// per read, in two at every offset (every head, chunk-size line and field split everywhere),
// and random cuts. Each delivery must give exactly what the whole delivery gives, and the
// next exchange on the same pooled connection must get its own response and nothing else.
//
// What this guards: a head or chunk-size line arriving in two reads once landed the second
// read 16 KiB into the buffer (libstdc++ 12's resize_and_overwrite passes the grown capacity
// to its callback), so that stale bytes — another client's response — were read as this one.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "spindle/client/exchange.h"
#include "testing/scripted_upstream.h"
#include "testing/segmented.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;
using spindle::testing::ScriptedUpstream;
using spindle::testing::Segmentation;
using spindle::testing::segmentations;

namespace {

// What a client saw of one exchange: status, fields, body and trailers, or the error.
std::string outcome(UpstreamConnections& pools, const Endpoint& endpoint,
                    std::string_view method = "GET") {
  RequestHead head;
  head.method = method;
  head.target = "/";
  auto ex = pools.open(endpoint, head, "upstream", ExchangeTimeouts{.first_byte = 5s, .read = 5s});
  if (!ex) return "open: " + ex.error().message();
  std::vector<std::string> interim;
  (*ex)->on_informational([&](const ClientResponseHead& h) {
    interim.push_back(fmt::format("{} ({} fields)", h.status, h.headers.size()));
  });
  auto got = (*ex)->read_head();
  if (!got) return "head: " + got.error().message();
  std::string text = fmt::format("{} {}\n", (*got)->status, fmt::join(interim, ","));
  for (const Field& f : (*got)->headers) text += fmt::format("{}: {}\n", f.name, f.value);
  text += "\n";
  std::string buffer(7, '\0');  // small reads: the body is handed out piece by piece too
  for (;;) {
    auto n = (*ex)->read(buffer);
    if (!n) return text + "body: " + n.error().message();
    if (*n == 0) break;
    text.append(buffer, 0, *n);
  }
  for (const Field& f : (*ex)->trailers()) text += fmt::format("\n{}: {}", f.name, f.value);
  return text;
}

// A response whose head spans more than one TCP segment, and a session cookie in it.
std::string long_head_response() {
  return fmt::format(
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Pad: {}\r\nSet-Cookie: session=alice\r\n\r\n"
      "alice",
      std::string(1800, 'p'));
}

constexpr std::string_view kChunked =
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nSet-Cookie: session=alice\r\n\r\n"
    "5;name=value\r\nalice\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: t\r\n\r\n";

constexpr std::string_view kInterimThenFinal =
    "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

// The next client's answer: it must get exactly this.
constexpr std::string_view kBob =
    "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nSet-Cookie: session=bob\r\n\r\nbob";

// Pieces as owned strings, for a script.
std::vector<std::string> owned(const Segmentation& s) { return {s.pieces.begin(), s.pieces.end()}; }

// Every segmentation of `response`, each followed on the same pooled connection by kBob cut
// in two inside its head; both must give what the whole deliveries give.
void check_every_cut(std::string_view response, std::size_t random = 24,
                     std::string_view method = "GET") {
  ScriptedUpstream upstream;
  ASSERT_TRUE(upstream.ok());
  Runtime runtime(RuntimeOptions{.workers = 1});
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    Endpoint endpoint;
    endpoint.address = *Address::parse(upstream.address());
    upstream.push({{std::string(response)}});
    const std::string expected = outcome(pools, endpoint, method);
    upstream.push({{std::string(kBob)}});
    const std::string expected_bob = outcome(pools, endpoint);
    ASSERT_TRUE(expected_bob.ends_with("\nbob")) << expected_bob;
    int checked = 0;
    for (const Segmentation& cut : segmentations(response, static_cast<int>(random))) {
      upstream.push({owned(cut)});
      std::string got = outcome(pools, endpoint, method);
      ASSERT_EQ(got, expected) << cut.name;
      upstream.push({{std::string(kBob.substr(0, 20)), std::string(kBob.substr(20))}});
      std::string bob = outcome(pools, endpoint);
      ASSERT_EQ(bob, expected_bob) << "the exchange after " << cut.name;
      ++checked;
    }
    EXPECT_GT(checked, static_cast<int>(response.size()));
  });
}

}  // namespace

TEST(ExchangeSplit, ALongHeadCutAnywhereIsReadWhole) {
  // A head longer than one TCP segment is the common way to get it in two reads.
  check_every_cut(long_head_response());
}

TEST(ExchangeSplit, AChunkedBodyCutAnywhereIsReadWhole) { check_every_cut(kChunked); }

TEST(ExchangeSplit, AnInterimResponseCutAnywhereIsPassedOnAndTheFinalOneRead) {
  check_every_cut(kInterimThenFinal);
}

TEST(ExchangeSplit, AResponseToHeadCutAnywhereHasNoBody) {
  check_every_cut("HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nX-A: b\r\n\r\n", 24, "HEAD");
}

TEST(ExchangeSplit, AnotherClientNeverGetsTheLastOnesResponse) {
  // As it was found: a chunked answer cut inside a chunk-size line, then an unrelated request
  // whose answer's head is cut in two. The second client must see its own cookie only.
  ScriptedUpstream upstream;
  ASSERT_TRUE(upstream.ok());
  Runtime runtime(RuntimeOptions{.workers = 1});
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    Endpoint endpoint;
    endpoint.address = *Address::parse(upstream.address());
    std::string first(kChunked);
    std::size_t in_size_line = first.find("1A\r\n") + 1;
    upstream.push({{first.substr(0, in_size_line), first.substr(in_size_line)}});
    std::string alice = outcome(pools, endpoint);
    EXPECT_NE(alice.find("session=alice"), std::string::npos) << alice;
    for (std::size_t cut = 1; cut < kBob.size(); ++cut) {
      upstream.push({{std::string(kBob.substr(0, cut)), std::string(kBob.substr(cut))}});
      std::string bob = outcome(pools, endpoint);
      EXPECT_EQ(bob.find("alice"), std::string::npos) << "cut at " << cut << ": " << bob;
      EXPECT_TRUE(bob.starts_with("200 ") && bob.ends_with("\nbob")) << "cut at " << cut << bob;
    }
    EXPECT_EQ(upstream.accepted(), 1u);  // every exchange on the one pooled connection
  });
}
