#include "serve.h"

#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "site.h"
#include "spindle/base/log.h"
#include "spindle/fiber/runtime.h"
#include "spindle/http/server.h"
#include "spindle/net/signal_set.h"
#include "spindle/proxy/config.h"
#include "spindle/proxy/gateway.h"

namespace spindle::app {
namespace {

using proxy::Config;
using proxy::ConfigError;
using proxy::load_config;
using proxy::parse_config;
using proxy::ServerConfig;

// The configuration used when no --config is given.
constexpr const char* kDefaultConfig = R"(# spindle's built-in configuration
threads: 0            # one worker per core
servers:
  - listen: 127.0.0.1:8080
    default_site: true
    access_log: {path: "-", format: combined}
)";

constexpr auto kGracePeriod = std::chrono::seconds(10);

// Whether the kernel offers kTLS (its "tls" upper-layer protocol is loaded).
bool kernel_offers_ktls() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_available_ulp");
  std::string ulp;
  while (in >> ulp) {
    if (ulp == "tls") return true;
  }
  return false;
}

Config effective_config(const ServeFlags& flags) {
  Config config = flags.config.empty() ? parse_config(kDefaultConfig, "(built-in configuration)")
                                       : load_config(flags.config);
  if (flags.threads) config.threads = *flags.threads;
  if (flags.listen) {
    auto address = Address::parse(*flags.listen);
    if (!address) {
      throw ConfigError(
          fmt::format("--listen: bad address '{}': expected IPv4:PORT, [IPv6]:PORT or unix:PATH",
                      *flags.listen));
    }
    config.servers.at(0).listen = *address;
  }
  if (flags.root) config.servers.at(0).root = *flags.root;
  return config;
}

}  // namespace

int check_config(const std::string& file) {
  try {
    Config config = load_config(file);
    auto count = [](std::size_t n, std::string_view what) {
      return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s");
    };
    fmt::print("{}: ok ({}, {}, {}, {})\n", file, count(config.servers.size(), "server"),
               count(config.routes.size(), "route"), count(config.services.size(), "service"),
               count(config.upstreams.size(), "upstream"));
    return 0;
  } catch (const ConfigError& e) {
    fmt::print(stderr, "spindle: {}\n", e.what());
    return 1;
  }
}

int serve(const ServeFlags& flags) {
  Config config;
  try {
    config = effective_config(flags);
  } catch (const ConfigError& e) {
    fmt::print(stderr, "spindle: {}\n", e.what());
    return 1;
  }
  // Before the runtime, so that its threads inherit the blocked mask.
  SignalSet signals{SIGINT, SIGTERM};
  Runtime runtime(RuntimeOptions{.workers = config.threads});
  runtime.start();

  // The gateway: routes, services and upstreams compiled into the snapshot the workers use.
  proxy::HealthRegistry health;
  http::UpstreamConnections connections(runtime);
  proxy::Gateways gateways(runtime);
  proxy::Proxy forwarder(gateways, connections);
  std::shared_ptr<proxy::Gateway> gateway;
  if (!config.routes.empty()) {
    try {
      gateway = proxy::Gateway::build(config, runtime.size(), health);
    } catch (const ConfigError& e) {
      fmt::print(stderr, "spindle: {}\n", e.what());
      return 1;
    }
    gateways.publish(gateway);
    gateway->start_probes(runtime, connections);
  }

  std::vector<std::unique_ptr<http::HttpServer>> servers;
  for (std::size_t index = 0; index < config.servers.size(); ++index) {
    const ServerConfig& server = config.servers[index];
    auto router = build_site(server, gateway ? forwarder.middleware(index) : http::Middleware{});
    if (!router) {
      fmt::print(stderr, "spindle: {}\n", router.error());
      return 1;
    }
    http::ServerOptions options = server.http;
    if (server.access_log.enabled) {
      auto format = server.access_log.format == "json" ? http::AccessLog::Format::kJson
                                                       : http::AccessLog::Format::kCombined;
      auto log = http::AccessLog::open(runtime, server.access_log.path, format);
      if (!log) {
        fmt::print(stderr, "spindle: access log {}: {}\n", server.access_log.path,
                   log.error().message());
        return 1;
      }
      options.access_log = std::move(*log);
    }
    auto started = http::HttpServer::start(runtime, server.listen, std::move(*router), options);
    if (!started) {
      fmt::print(stderr, "spindle: cannot listen on {}: {}\n", server.listen.to_string(),
                 started.error().message());
      return 1;
    }
    // "ktls_available": the kernel offers kTLS, so OpenSSL may hand a connection's records
    // to it after that connection's handshake (cipher and kernel permitting). Whether it did
    // is known per connection only (TlsStream::ktls_send()), never at start.
    fmt::print(
        "{{\"event\":\"listening\",\"address\":\"{}\",\"tls\":{},\"ktls_available\":{},"
        "\"http2\":{},\"workers\":{},\"version\":\"{}\"}}\n",
        (*started)->address().to_string(), options.tls != nullptr,
        options.tls != nullptr && kernel_offers_ktls(), options.http2, runtime.size(), kVersion);
    servers.push_back(std::move(*started));
  }
  std::fflush(stdout);

  auto signal = runtime.block_on([&] { return signals.wait(); });
  int signo = signal ? *signal : 0;
  log_info("{}: stopping; in-flight requests have {} s to finish",
           signo ? strsignal(signo) : "stop", kGracePeriod.count());
  auto deadline = Deadline::after(kGracePeriod);
  bool clean = true;
  for (auto& server : servers) clean = server->drain(deadline) && clean;
  if (!clean) log_warn("grace period over: closing the remaining connections");
  if (gateway) gateway->stop_probes();
  return 0;
}

}  // namespace spindle::app
