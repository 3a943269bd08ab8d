// TLS settings belong to the service that declared them: an upstream shared by services whose
// settings differ is spoken to with each one's own, whatever order they come in; and the
// settings are known by content, so that a configuration built again (a reload) finds the
// connections and the health of the one before.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "spindle/proxy/gateway.h"
#include "testing/testing.h"

using namespace spindle;
using namespace spindle::proxy;

namespace {

const std::string& test_ca_pem() {
  static const std::string path = spindle::testing::test_cert_dir() + "/ca.pem";
  return path;
}

// `lax` (unverified) and `strict` (verified against the test CA, with a server name) on one
// upstream, in the order asked.
Config shared_upstream(bool strict_first, const std::string& ca = test_ca_pem()) {
  std::string lax = "  lax: {upstream: pool, tls: {verify: false}}\n";
  std::string strict =
      fmt::format("  strict: {{upstream: pool, tls: {{ca: {}, server_name: localhost}}}}\n", ca);
  return parse_config(fmt::format("servers:\n"
                                  "  - {{listen: 127.0.0.1:0}}\n"
                                  "routes:\n"
                                  "  - {{match: {{path_prefix: /lax/}}, service: lax}}\n"
                                  "  - {{match: {{path_prefix: /strict/}}, service: strict}}\n"
                                  "services:\n{}{}"
                                  "upstreams:\n"
                                  "  pool: {{targets: [{{address: 127.0.0.1:9443}}, "
                                  "{{address: 127.0.0.1:9444}}]}}\n",
                                  strict_first ? strict : lax, strict_first ? lax : strict),
                      "test.yaml");
}

const http::Endpoint& service_endpoint(const Gateway& g, std::string_view service,
                                       std::size_t i = 0) {
  return g.service(service)->upstream->targets.at(i).endpoint;
}

}  // namespace

TEST(UpstreamTls, ServicesSharingAnUpstreamEachSpeakWithTheirOwnSettingsInEitherOrder) {
  for (bool strict_first : {false, true}) {
    SCOPED_TRACE(strict_first ? "strict first" : "lax first");
    HealthRegistry health;
    auto g = Gateway::build(shared_upstream(strict_first), 1, health);
    const Gateway::Upstream* lax = g->service("lax")->upstream;
    const Gateway::Upstream* strict = g->service("strict")->upstream;
    ASSERT_NE(lax, strict);
    EXPECT_EQ(lax->config, strict->config);  // one upstream of the configuration, two variants
    EXPECT_EQ(lax->variants, 2u);
    EXPECT_EQ(lax->services, std::vector<std::string>{"lax"});
    EXPECT_EQ(strict->services, std::vector<std::string>{"strict"});
    for (std::size_t i = 0; i < 2; ++i) {
      const http::Endpoint& l = service_endpoint(*g, "lax", i);
      const http::Endpoint& s = service_endpoint(*g, "strict", i);
      ASSERT_TRUE(l.tls && s.tls);
      EXPECT_TRUE(l.tls->options().insecure);
      EXPECT_FALSE(s.tls->options().insecure);
      EXPECT_EQ(s.tls->options().ca_file, test_ca_pem());
      EXPECT_EQ(s.server_name, "localhost");  // SNI and the name checked
      EXPECT_EQ(l.server_name, "127.0.0.1");
      EXPECT_EQ(l.address.to_string(), s.address.to_string());
      // Neither's connections nor health serve the other.
      EXPECT_NE(l.key(), s.key());
      EXPECT_NE(lax->targets[i].health, strict->targets[i].health);
    }
  }
}

TEST(UpstreamTls, ServicesThatAgreeShareTheTargets) {
  HealthRegistry health;
  auto g = Gateway::build(
      parse_config(fmt::format("servers:\n"
                               "  - {{listen: 127.0.0.1:0}}\n"
                               "routes:\n"
                               "  - {{match: {{path_prefix: /}}, service: a}}\n"
                               "services:\n"
                               "  a: {{upstream: pool, tls: {{ca: {0}}}}}\n"
                               "  b: {{upstream: pool, tls: {{ca: {0}}}}}\n"
                               "  plain: {{upstream: pool}}\n"
                               "upstreams:\n"
                               "  pool: {{targets: [{{address: 127.0.0.1:9443}}]}}\n",
                               test_ca_pem()),
                   "test.yaml"),
      1, health);
  EXPECT_EQ(g->service("a")->upstream, g->service("b")->upstream);
  EXPECT_EQ(g->service("a")->upstream->services, (std::vector<std::string>{"a", "b"}));
  // Plain HTTP to the same upstream is another way of speaking to it: targets of its own.
  const Gateway::Upstream* plain = g->service("plain")->upstream;
  ASSERT_NE(plain, g->service("a")->upstream);
  EXPECT_FALSE(plain->tls);
  EXPECT_EQ(plain->targets.at(0).endpoint.tls, nullptr);
  EXPECT_EQ(g->upstreams().size(), 2u);
}

TEST(UpstreamTls, AnUpstreamServesOneProtocol) {
  HealthRegistry health;
  EXPECT_THROW((void)Gateway::build(parse_config("servers:\n"
                                                 "  - {listen: 127.0.0.1:0}\n"
                                                 "routes:\n"
                                                 "  - {match: {path_prefix: /}, service: a}\n"
                                                 "services:\n"
                                                 "  a: {upstream: pool}\n"
                                                 "  b: {upstream: pool, protocol: h2c}\n"
                                                 "upstreams:\n"
                                                 "  pool: {targets: [{address: 127.0.0.1:9443}]}\n",
                                                 "test.yaml"),
                                    1, health),
               ConfigError);
}

TEST(UpstreamTls, AConfigurationBuiltAgainKeepsItsPoolKeysAndHealth) {
  HealthRegistry health;
  auto first = Gateway::build(shared_upstream(false), 1, health);
  auto second = Gateway::build(shared_upstream(false), 1, health);
  for (std::string_view service : {"lax", "strict"}) {
    // A new client context each time, of the same settings: the same pool, the same health.
    EXPECT_NE(service_endpoint(*first, service).tls, service_endpoint(*second, service).tls);
    EXPECT_EQ(service_endpoint(*first, service).key(), service_endpoint(*second, service).key());
    EXPECT_EQ(first->service(service)->upstream->targets[0].health,
              second->service(service)->upstream->targets[0].health);
  }
}

TEST(UpstreamTls, ACaBundleWithOtherBytesIsOtherSettings) {
  // The same path, rewritten: a renewed bundle must not reuse connections verified by the old.
  std::string copy = spindle::testing::test_cert_dir() + "/ca-copy.pem";
  std::filesystem::copy_file(test_ca_pem(), copy,
                             std::filesystem::copy_options::overwrite_existing);
  HealthRegistry health;
  auto before = Gateway::build(shared_upstream(false, copy), 1, health);
  std::ofstream(copy, std::ios::app) << "\n";
  auto after = Gateway::build(shared_upstream(false, copy), 1, health);
  EXPECT_NE(service_endpoint(*before, "strict").key(), service_endpoint(*after, "strict").key());
  EXPECT_EQ(service_endpoint(*before, "lax").key(), service_endpoint(*after, "lax").key());
  std::filesystem::remove(copy);
}
