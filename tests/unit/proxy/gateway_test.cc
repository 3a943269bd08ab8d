#include "spindle/proxy/gateway.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "spindle/client/client.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/server/server.h"
#include "spindle/sync/event.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::proxy;

namespace {

// An upstream that names itself, and answers /slow after 300 ms.
std::unique_ptr<http::HttpServer> named_upstream(Runtime& runtime, std::string name) {
  http::Router router;
  router.get("/fast", [name](http::Request&) { return http::Response::text(name); });
  router.get("/slow", [name](http::Request&) {
    (void)this_fiber::sleep_for(300ms);
    return http::Response::text(name);
  });
  auto server = http::HttpServer::start(runtime, Address::loopback_v4(0), std::move(router));
  EXPECT_TRUE(server.has_value());
  return std::move(*server);
}

// A configuration sending every request to `upstream`.
Config config_for(const http::HttpServer& upstream) {
  return parse_config(fmt::format("servers:\n"
                                  "  - {{name: public, listen: 127.0.0.1:0}}\n"
                                  "routes:\n"
                                  "  - {{name: all, match: {{path_prefix: /}}, service: s}}\n"
                                  "services:\n"
                                  "  s: {{url: \"http://127.0.0.1:{}\"}}\n",
                                  upstream.address().port()),
                      "test.yaml");
}

TEST(Gateways, ARequestKeepsTheSnapshotItStartedWithWhileNewOnesTakeTheNext) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  runtime.start();
  auto a = named_upstream(runtime, "a");
  auto b = named_upstream(runtime, "b");
  HealthRegistry health;
  http::UpstreamConnections connections(runtime);
  Gateways gateways(runtime);
  Proxy proxy(gateways, connections);
  auto first = Gateway::build(config_for(*a), runtime.size(), health);
  std::weak_ptr<Gateway> first_alive = first;
  gateways.publish(std::move(first));

  http::Router router;
  router.use(proxy.middleware("public"));
  auto gateway = http::HttpServer::start(runtime, Address::loopback_v4(0), std::move(router));
  ASSERT_TRUE(gateway.has_value());
  http::HttpClient client(runtime);
  std::string base = fmt::format("http://127.0.0.1:{}", (*gateway)->address().port());

  runtime.block_on([&] {
    // A slow request starts on the first snapshot...
    auto slow = spawn([&] { return client.send({.url = base + "/slow"}); });
    (void)this_fiber::sleep_for(100ms);
    // ...the second is published meanwhile (from a thread outside the workers, as a reload
    // does)...
    // (The fiber parks on an event meanwhile: blocking its worker would deadlock the post.)
    Event published;
    std::thread reloader([&] {
      gateways.publish(Gateway::build(config_for(*b), runtime.size(), health));
      published.set();
    });
    ASSERT_FALSE(published.wait(Deadline::after(5s)));
    reloader.join();
    auto fresh = client.send({.url = base + "/fast"});
    ASSERT_TRUE(fresh.has_value());
    EXPECT_EQ(fresh->body, "b") << "a new request takes the new snapshot";
    EXPECT_FALSE(first_alive.expired()) << "the slow request still holds the first";
    auto done = slow.join();
    ASSERT_TRUE(done.has_value());
    EXPECT_EQ(done->body, "a") << "the request in flight finished on the snapshot it began on";
  });
  EXPECT_TRUE(first_alive.expired()) << "and let go of it when it was done";
  (*gateway)->drain(Deadline::after(5s));
  a->drain(Deadline::after(5s));
  b->drain(Deadline::after(5s));
}

TEST(Gateways, AnUnresolvableTargetIsAConfigurationError) {
  Config config = parse_config(
      "servers:\n"
      "  - {name: public, listen: 127.0.0.1:0}\n"
      "routes:\n"
      "  - {name: all, match: {path_prefix: /}, service: s}\n"
      "services:\n"
      "  s: {url: \"http://no-such-host.invalid:80\"}\n",
      "test.yaml");
  HealthRegistry health;
  try {
    (void)Gateway::build(std::move(config), 1, health);
    FAIL() << "built a gateway whose target has no address";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
}

TEST(TargetHealth, MaxFailsWithinFailTimeoutMakesAnEjectionDue) {
  TargetHealth health;
  PassiveHealthConfig config{.max_fails = 3, .fail_timeout = 10s};
  auto t0 = Clock::now();
  EXPECT_FALSE(health.note_failure(config, t0));
  EXPECT_FALSE(health.note_failure(config, t0 + 1s));
  EXPECT_TRUE(health.note_failure(config, t0 + 2s)) << "the third failure within 10 s";
  health.eject(t0 + 12s);
  EXPECT_FALSE(health.healthy(t0 + 11s));
  EXPECT_TRUE(health.healthy(t0 + 13s)) << "back after fail_timeout";
  // Failures spread wider than fail_timeout never add up.
  TargetHealth spread;
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(spread.note_failure(config, t0 + i * 11s));
}

// An upstream of `n` targets with the passive settings given.
struct TestUpstream {
  UpstreamConfig config;
  Gateway::Upstream upstream;
  TestUpstream(std::size_t n, unsigned max_ejection_percent) {
    config.passive_health = {
        .max_fails = 1, .fail_timeout = 10s, .max_ejection_percent = max_ejection_percent};
    upstream.config = &config;
    for (std::size_t i = 0; i < n; ++i) {
      Gateway::Target t;
      t.health = std::make_shared<TargetHealth>();
      upstream.targets.push_back(std::move(t));
    }
  }
};

TEST(UpstreamHealth, EjectsAtMostMaxEjectionPercentAndNeverTheLastTarget) {
  using Verdict = Gateway::Upstream::Verdict;
  auto t0 = Clock::now();
  TestUpstream ten(10, 10);  // 10% of 10: one out at a time
  EXPECT_EQ(ten.upstream.record_failure(0, t0), Verdict::kEjected);
  EXPECT_EQ(ten.upstream.record_failure(1, t0), Verdict::kWithheld);
  EXPECT_TRUE(ten.upstream.targets[1].health->healthy(t0));
  // Once the first is back, another may go.
  EXPECT_EQ(ten.upstream.record_failure(1, t0 + 11s), Verdict::kEjected);
  TestUpstream three(3, 100);  // all but one
  EXPECT_EQ(three.upstream.record_failure(0, t0), Verdict::kEjected);
  EXPECT_EQ(three.upstream.record_failure(1, t0), Verdict::kEjected);
  EXPECT_EQ(three.upstream.record_failure(2, t0), Verdict::kWithheld);
  TestUpstream one(1, 100);  // nowhere else to go
  EXPECT_EQ(one.upstream.record_failure(0, t0), Verdict::kWithheld);
  TestUpstream two(2, 10);  // 10% of 2 rounds down, but one may always be
  EXPECT_EQ(two.upstream.record_failure(0, t0), Verdict::kEjected);
}

}  // namespace

// Idle connections kept follow the busy ones allowed, unless given: fewer would close and
// open a connection at every request beyond them.
TEST(UpstreamConfig, MaxIdleFollowsMaxConnectionsUnlessGiven) {
  auto max_idle = [](std::string upstream) {
    Config config = parse_config(
        "servers:\n"
        "  - {name: public, listen: 127.0.0.1:0}\n"
        "routes:\n"
        "  - {name: all, match: {path_prefix: /}, service: s}\n"
        "services:\n"
        "  s: {upstream: pool}\n"
        "upstreams:\n"
        "  pool: {targets: [{address: 127.0.0.1:9}]" +
            upstream + "}\n",
        "test.yaml");
    return config.upstreams.at(0).keepalive.max_idle;
  };
  EXPECT_EQ(max_idle(""), 256u);
  EXPECT_EQ(max_idle(", limits: {max_connections: 1024}"), 1024u);
  EXPECT_EQ(max_idle(", limits: {max_connections: 16}"), 16u);
  EXPECT_EQ(max_idle(", limits: {max_connections: 0}"), 256u);
  EXPECT_EQ(max_idle(", limits: {max_connections: 1024}, keepalive: {max_idle: 8}"), 8u);
  EXPECT_EQ(max_idle(", keepalive: {max_idle: 8}, limits: {max_connections: 1024}"), 8u);
}
