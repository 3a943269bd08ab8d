// fetch: GETs a URL with spindle's HttpClient, N times from N fibers at once, and prints one
// JSON line: {"status":200,"version":20,"bytes":1234,"ok":N}.
//
//   fetch [--h2c] [--ca FILE] [--insecure] [--parallel N] URL
#include <fmt/format.h>

#include <cstring>
#include <string>

#include "spindle/client/client.h"
#include "spindle/fiber/spawn.h"
#include "spindle/sync/wait_group.h"

using namespace spindle;

int main(int argc, char** argv) {
  http::ClientOptions options;
  TlsClientOptions tls{.alpn = {"h2", "http/1.1"}};
  std::string url;
  int parallel = 1;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--h2c")
      options.h2c_prior_knowledge = true;
    else if (arg == "--insecure")
      tls.insecure = true;
    else if (arg == "--ca" && i + 1 < argc)
      tls.ca_file = argv[++i];
    else if (arg == "--parallel" && i + 1 < argc)
      parallel = std::atoi(argv[++i]);
    else
      url = arg;
  }
  if (url.empty() || parallel < 1) {
    fmt::print(stderr, "usage: fetch [--h2c] [--ca FILE] [--insecure] [--parallel N] URL\n");
    return 2;
  }
  auto context = TlsClientContext::create(tls);
  if (!context) {
    fmt::print(stderr, "fetch: {}\n", context.error());
    return 1;
  }
  options.tls = *context;
  Runtime runtime(RuntimeOptions{.workers = 1});
  http::HttpClient client(runtime, options);
  int ok = 0;
  http::ClientResponse last;
  std::string error;
  runtime.block_on([&] {
    WaitGroup all;
    for (int i = 0; i < parallel; ++i) {
      all.add();
      spawn([&] {
        auto r = client.send({.url = url});
        if (r) {
          ++ok;
          last = std::move(*r);
        } else {
          error = r.error().message();
        }
        all.done();
      }).detach();
    }
    (void)all.wait();
  });
  if (ok == 0) {
    fmt::print(stderr, "fetch: {}\n", error);
    return 1;
  }
  fmt::print("{{\"status\":{},\"version\":{},\"bytes\":{},\"ok\":{}}}\n", last.status, last.version,
             last.body.size(), ok);
  return ok == parallel ? 0 : 1;
}
