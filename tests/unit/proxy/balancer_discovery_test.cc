// Every balancer over every way targets are found (configured addresses, a name's addresses,
// SRV records with priorities and weights, SRV hosts with several addresses): a pick always
// lands on a target of the lowest priority that is up, every such target takes some, and the
// backups take the load while every primary is down (RFC 2782). consistent_hash once built its
// ring from the configured targets only: over SRV records it had none and answered 503.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "../../../src/proxy/gateway/targets.h"
#include "spindle/fiber/runtime.h"
#include "spindle/proxy/discovery.h"
#include "spindle/proxy/gateway.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::proxy;

namespace balancer_discovery {

// One way of finding targets: the upstream's YAML and what discovery answered.
struct Kind {
  std::string name;
  std::string upstream;  ///< the `pool` upstream's body, without its balancer
  DnsAnswers answers;
};

std::vector<Kind> kinds() {
  std::vector<Kind> all;
  all.push_back({"static",
                 "targets: [{address: 127.0.0.1:9001, weight: 3}, "
                 "{address: 127.0.0.1:9002}, {address: 127.0.0.1:9003}]",
                 {}});
  Kind name{
      "name", "targets: [{address: api.test:9001, weight: 2}, {address: 127.0.0.1:9002}]", {}};
  name.answers.addresses["api.test"] = {"10.0.0.1", "10.0.0.2", "::1"};
  all.push_back(name);
  // Primaries a (weight 3) and b (weight 1) at priority 10; c and d the backups at 20.
  Kind srv{"srv", "srv: _http._tcp.api.test", {}};
  srv.answers.services["_http._tcp.api.test"] = {{"a.test", 9001, 3, 10},
                                                 {"b.test", 9002, 1, 10},
                                                 {"c.test", 9003, 1, 20},
                                                 {"d.test", 9004, 1, 20}};
  srv.answers.addresses = {{"a.test", {"10.0.0.1"}},
                           {"b.test", {"10.0.0.2"}},
                           {"c.test", {"10.0.0.3"}},
                           {"d.test", {"10.0.0.4"}}};
  all.push_back(srv);
  // One SRV host with two addresses among the primaries; heavy weights (scaled rings).
  Kind several{"srv_several_addresses", "srv: _http._tcp.api.test", {}};
  several.answers.services["_http._tcp.api.test"] = {
      {"a.test", 9001, 1000, 0}, {"b.test", 9002, 500, 0}, {"c.test", 9003, 1000, 5}};
  several.answers.addresses = {
      {"a.test", {"10.0.0.1", "10.0.0.11"}}, {"b.test", {"10.0.0.2"}}, {"c.test", {"10.0.0.3"}}};
  all.push_back(several);
  return all;
}

const std::vector<std::string> kBalancers = {"round_robin", "weighted", "least_connections",
                                             "random_two",
                                             "{consistent_hash: {by: header, key: x-user}}"};

Config config_for(const std::string& balancer, const Kind& kind) {
  return parse_config(fmt::format("servers:\n"
                                  "  - {{listen: 127.0.0.1:0}}\n"
                                  "routes:\n"
                                  "  - {{match: {{path_prefix: /}}, service: s}}\n"
                                  "services:\n"
                                  "  s: {{upstream: pool}}\n"
                                  "upstreams:\n"
                                  "  pool: {{balancer: {}, {}}}\n",
                                  balancer, kind.upstream),
                      "test.yaml");
}

// How many of `picks` requests (keys user0, user1, ...) each target took; -1 counts none.
std::map<long, int> spread(Gateway& g, int picks) {
  const Gateway::Upstream& u = *g.service("s")->upstream;
  std::map<long, int> taken;
  for (int i = 0; i < picks; ++i) {
    auto at = spindle::proxy::detail::pick_target(g.worker_state(), u, {},
                                                  hash_key(fmt::format("user{}", i)), nullptr);
    ++taken[at ? static_cast<long>(*at) : -1];
  }
  return taken;
}

// The targets of the lowest priority among those up.
std::set<long> lowest_up(const Gateway::Upstream& u, const std::set<long>& down) {
  unsigned lowest = ~0u;
  for (std::size_t i = 0; i < u.targets.size(); ++i) {
    if (!down.contains(static_cast<long>(i)))
      lowest = std::min(lowest, u.targets[i].config.priority);
  }
  std::set<long> out;
  for (std::size_t i = 0; i < u.targets.size(); ++i) {
    if (!down.contains(static_cast<long>(i)) && u.targets[i].config.priority == lowest) {
      out.insert(static_cast<long>(i));
    }
  }
  return out;
}

}  // namespace balancer_discovery

using namespace balancer_discovery;

TEST(BalancerDiscovery, EveryBalancerOverEveryKindOfTargetsPicksTheLowestPriorityUp) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  int cases = 0;
  for (const std::string& balancer : kBalancers) {
    for (const Kind& kind : kinds()) {
      SCOPED_TRACE(fmt::format("balancer {} over {}", balancer, kind.name));
      HealthRegistry health;
      auto g = Gateway::build(config_for(balancer, kind), 1, health, nullptr, nullptr,
                              kind.answers.addresses.empty() ? nullptr : &kind.answers);
      const Gateway::Upstream& u = *g->service("s")->upstream;
      ASSERT_GE(u.targets.size(), 3u);
      runtime.block_on([&] {
        // All up: the lowest priority's targets take every request, each some.
        auto all_up = spread(*g, 4000);
        std::set<long> primaries = lowest_up(u, {});
        for (const auto& [target, n] : all_up) EXPECT_TRUE(primaries.contains(target)) << target;
        for (long p : primaries) EXPECT_GT(all_up[p], 0) << u.targets[p].label;
        // Every primary down (or, with one priority, one target out): the rest take it all.
        std::set<long> down;
        if (primaries.size() == u.targets.size()) {
          down.insert(0);
        } else {
          down = primaries;
        }
        for (long d : down) u.targets[d].health->eject(Clock::now() + 1h);
        auto failover = spread(*g, 4000);
        std::set<long> rest = lowest_up(u, down);
        for (const auto& [target, n] : failover) EXPECT_TRUE(rest.contains(target)) << target;
        for (long r : rest) EXPECT_GT(failover[r], 0) << u.targets[r].label;
      });
      ++cases;
    }
  }
  EXPECT_EQ(cases, static_cast<int>(kBalancers.size() * kinds().size()));
}

TEST(BalancerDiscovery, ConsistentHashOverSrvFollowsWeightsAndKeepsKeysWhereTheyWere) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  const Kind srv = kinds()[2];
  HealthRegistry health;
  auto g =
      Gateway::build(config_for(kBalancers.back(), srv), 1, health, nullptr, nullptr, &srv.answers);
  const Gateway::Upstream& u = *g->service("s")->upstream;
  runtime.block_on([&] {
    auto first = spread(*g, 8000);
    // a (weight 3) against b (weight 1): about three quarters.
    double share = static_cast<double>(first[0]) / (first[0] + first[1]);
    EXPECT_GT(share, 0.65);
    EXPECT_LT(share, 0.85);
    // The same keys land on the same targets again, and after a rebuild (a reload).
    EXPECT_EQ(spread(*g, 8000), first);
    auto again = Gateway::build(config_for(kBalancers.back(), srv), 1, health, nullptr, nullptr,
                                &srv.answers);
    EXPECT_EQ(spread(*again, 8000), first);
    (void)u;
  });
}
