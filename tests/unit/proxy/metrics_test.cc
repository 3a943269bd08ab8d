// The pieces of the admin listener that need no socket: the Prometheus text writer, the
// metrics shards added up over workers, and the redacted configuration.
#include "spindle/proxy/metrics.h"

#include <gtest/gtest.h>

#include "spindle/fiber/spawn.h"
#include "spindle/proxy/config.h"

using namespace spindle;
using namespace spindle::proxy;

TEST(Prometheus, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(prometheus::escape(R"(a\b"c)"
                               "\n"),
            R"(a\\b\"c\n)");
  EXPECT_EQ(prometheus::escape("plain"), "plain");
}

TEST(Prometheus, HistogramBucketsAreCumulativeAndEndAtInf) {
  Histogram h;
  h.observe(0.0005);  // first bucket
  h.observe(0.001);   // on a bound: that bucket (le is "less or equal")
  h.observe(0.3);     // 0.5
  h.observe(60);      // +Inf
  std::string out;
  prometheus::histogram(out, "x", R"(a="1")", h);
  EXPECT_NE(out.find("x_bucket{a=\"1\",le=\"0.001\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{a=\"1\",le=\"0.25\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{a=\"1\",le=\"0.5\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{a=\"1\",le=\"10\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{a=\"1\",le=\"+Inf\"} 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_count{a=\"1\"} 4\n"), std::string::npos) << out;
}

TEST(Metrics, EachWorkerCountsApartAndAScrapeAddsThemUp) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  runtime.start();
  Metrics metrics(runtime);
  auto api = metrics.request_series("public", "api");
  EXPECT_EQ(metrics.request_series("public", "api"), api);  // the same labels, the same number
  auto other = metrics.request_series("public", "");
  EXPECT_NE(other, api);
  for (std::size_t w = 0; w < 2; ++w) {
    spawn_on(runtime.worker(w), [&] {
      for (std::size_t i = 0; i < 3 * (w + 1); ++i) metrics.record_request(api, 200, 0.002);
      metrics.record_request(api, 503, 0.2);
      metrics.record_request(other, 404, 0.0001);
    }).join();
  }
  std::string text = runtime.block_on([&] { return metrics.expose(); });
  EXPECT_NE(text.find(R"(spindle_requests_total{server="public",route="api",code="2xx"} 9)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(spindle_requests_total{server="public",route="api",code="5xx"} 2)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(spindle_requests_total{server="public",route="",code="4xx"} 2)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(spindle_request_duration_seconds_count{server="public",route="api"} 11)"),
            std::string::npos)
      << text;
}

TEST(RedactedSource, SecretValuesAreHiddenAndTheRestKept) {
  Config config;
  config.source = R"(# a comment
servers:
  - listen: 127.0.0.1:80
redis: {address: 127.0.0.1:6379, password: hunter2}
auth:
  - {user: a, client_secret: s3cret, token: t0ken}
  - {api_key: k3y, keyword: kept}
)";
  std::string shown = redacted_source(config);
  for (const char* secret : {"hunter2", "s3cret", "t0ken", "k3y"}) {
    EXPECT_EQ(shown.find(secret), std::string::npos) << secret << " in:\n" << shown;
  }
  EXPECT_NE(shown.find("listen: 127.0.0.1:80"), std::string::npos) << shown;
  EXPECT_NE(shown.find("keyword: kept"), std::string::npos) << shown;
  EXPECT_NE(shown.find("password: <redacted>"), std::string::npos) << shown;
}

TEST(RedactedSource, ValuesAreHiddenByWhereTheyAreUsed) {
  Config config;
  config.source = R"(routes:
  - match: {path_prefix: /a, headers: {X-Plain: m4tch}}
    middlewares:
      - headers: {request: {set: {Accept: s3t}, add: {X-B: 4dd}, remove: [X-Gone]},
                  response: {set: {X-C: r3s}}}
      - cors: {origins: ["https://a.example"], headers: [X-Shown]}
services:
  s: {url: "http://us3r:p4ss@10.0.0.1:80/x@y"}
  t: {url: "http://10.0.0.2:80"}
)";
  std::string shown = redacted_source(config);
  for (const char* secret : {"m4tch", "s3t", "4dd", "r3s", "us3r", "p4ss"}) {
    EXPECT_EQ(shown.find(secret), std::string::npos) << secret << " in:\n" << shown;
  }
  for (const char* kept : {"X-Plain", "X-Gone", "X-Shown", "http://<redacted>@10.0.0.1:80/x@y",
                           "http://10.0.0.2:80", "path_prefix: /a"}) {
    EXPECT_NE(shown.find(kept), std::string::npos) << kept << " not in:\n" << shown;
  }
}
