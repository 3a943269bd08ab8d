// The gateway snapshot: compiling a configuration (targets resolved, TLS set up, balancers
// per worker), target health, active probes, and publishing a snapshot to the workers.
#include "spindle/proxy/gateway.h"

#include <fmt/format.h>
#include <netdb.h>

#include <algorithm>

#include "proxy/request/owned_fields.h"
#include "spindle/base/log.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/worker.h"
#include "spindle/http/bytes.h"
#include "spindle/sync/wait_group.h"

namespace spindle::proxy {

// ---- health -----------------------------------------------------------------------------------

bool TargetHealth::healthy(Clock::time_point now) const {
  return probe_healthy() && ejected_until_.load(std::memory_order_relaxed) <= ticks(now);
}

bool TargetHealth::ejected(Clock::time_point now) const {
  return ejected_until_.load(std::memory_order_relaxed) > ticks(now);
}

bool TargetHealth::note_failure(const PassiveHealthConfig& config, Clock::time_point now) {
  if (config.max_fails == 0) return false;  // passive checks off
  std::int64_t t = ticks(now);
  std::int64_t window = std::chrono::duration_cast<Clock::duration>(config.fail_timeout).count();
  // Failures count within one fail_timeout of the first: an older streak starts again.
  if (t - first_fail_.load(std::memory_order_relaxed) > window) {
    first_fail_.store(t, std::memory_order_relaxed);
    fails_.store(0, std::memory_order_relaxed);
  }
  if (fails_.fetch_add(1, std::memory_order_relaxed) + 1 < config.max_fails) return false;
  fails_.store(0, std::memory_order_relaxed);
  return true;
}

void TargetHealth::eject(Clock::time_point until) {
  ejected_until_.store(ticks(until), std::memory_order_relaxed);
}

Gateway::Upstream::Verdict Gateway::Upstream::record_failure(std::size_t index,
                                                             Clock::time_point now) const {
  const PassiveHealthConfig& passive = config->passive_health;
  if (!targets[index].health->note_failure(passive, now)) return Verdict::kCounted;
  std::size_t n = targets.size();
  std::size_t out = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (i != index && targets[i].health->ejected(now)) ++out;
  }
  // Envoy's rule: at most max_ejection_percent out, at least one may be; and here one always
  // stays (a lone target is never ejected passively: there is nowhere else to go).
  std::size_t cap =
      n <= 1 ? 0
             : std::min(n - 1, std::max<std::size_t>(1, n * passive.max_ejection_percent / 100));
  if (out >= cap) return Verdict::kWithheld;
  targets[index].health->eject(now + passive.fail_timeout);
  return Verdict::kEjected;
}

void TargetHealth::record_success() {
  if (fails_.load(std::memory_order_relaxed) != 0) fails_.store(0, std::memory_order_relaxed);
}

std::shared_ptr<TargetHealth> HealthRegistry::get(const std::string& key) {
  std::lock_guard guard(lock_);
  auto& slot = health_[key];
  if (!slot) slot = std::make_shared<TargetHealth>();
  return slot;
}

// ---- building ---------------------------------------------------------------------------------

namespace {

// The address of a target: a numeric host as it is, a name through the system resolver. Only
// for a gateway built without discovery (check-config, tests): a running one never waits on a
// lookup (its names come from Discovery, on a thread of their own).
Address resolve_target(const TargetConfig& target, const std::string& where) {
  if (auto numeric = Address::from_host_port(target.host, target.port)) return *numeric;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(target.host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw ConfigError(fmt::format("{}: cannot resolve '{}': {}", where, target.host,
                                  rc != 0 ? gai_strerror(rc) : "no address"));
  }
  auto address = Address::from_sockaddr(found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  if (!address) throw ConfigError(fmt::format("{}: '{}': unusable address", where, target.host));
  return Address::from_host_port(address->to_string().substr(0, address->to_string().rfind(':')),
                                 target.port)
      .value_or(*address);
}

http::WireProtocol wire_protocol(UpstreamProtocol p) {
  switch (p) {
    case UpstreamProtocol::kH2:
      return http::WireProtocol::kHttp2;
    case UpstreamProtocol::kH2c:
      return http::WireProtocol::kH2c;
    case UpstreamProtocol::kHttp1:
      break;
  }
  return http::WireProtocol::kHttp1;
}

// The TLS settings service `s` asks for (nullptr: plain), shared by the connections to each
// of its targets; with `http1`, the same offering HTTP/1.1 by ALPN whatever the service's
// protocol (an upgrade to an HTTP/2 target that allows no extended CONNECT goes so).
std::shared_ptr<const TlsClientContext> service_tls(const ServiceConfig& s, bool http1 = false) {
  if (!s.tls) return nullptr;
  TlsClientOptions options;
  options.ca_file = s.tls_ca_file;
  options.insecure = !s.tls_verify;
  options.alpn = s.protocol == UpstreamProtocol::kH2 && !http1
                     ? std::vector<std::string>{"h2"}
                     : std::vector<std::string>{"http/1.1"};
  auto ctx = TlsClientContext::create(options);
  if (!ctx) throw ConfigError(fmt::format("services.{}.tls: {}", s.name, ctx.error()));
  return *ctx;
}

// Makes the targets of `u` as service `s` speaks to them (u.protocol, `tls`, its server
// name): from SRV records or as configured; a name through discovery's answers (every address
// a target, the hosts file's too), or without discovery through the system resolver (the
// first address).
void make_targets(Gateway::Upstream& u, const ServiceConfig& s,
                  const std::shared_ptr<const TlsClientContext>& tls, HealthRegistry& health,
                  const DnsAnswers* dns) {
  const auto upgrade_tls = u.protocol == http::WireProtocol::kHttp2 ? service_tls(s, true) : tls;
  auto add = [&](const TargetConfig& t, const Address& address, bool one_of_several) {
    Gateway::Target target;
    target.config = t;
    target.label = t.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", t.host, t.port)
                                                         : fmt::format("{}:{}", t.host, t.port);
    // A name with several addresses makes several targets: each says which.
    if (one_of_several) target.label += fmt::format(" ({})", address.to_string());
    target.endpoint.address = address;
    target.endpoint.protocol = u.protocol;
    target.endpoint.tls = tls;
    target.endpoint.server_name = s.tls_server_name.empty() ? t.host : s.tls_server_name;
    target.health = health.get(target.endpoint.key());
    if (u.protocol != http::WireProtocol::kHttp1) {
      // (Made afresh, not copied: an endpoint keeps the key it made.)
      target.upgrade_endpoint.emplace();
      target.upgrade_endpoint->address = address;
      target.upgrade_endpoint->protocol = http::WireProtocol::kHttp1;
      target.upgrade_endpoint->tls = upgrade_tls;
      target.upgrade_endpoint->server_name = target.endpoint.server_name;
    }
    u.targets.push_back(std::move(target));
  };
  std::vector<TargetConfig> configured = u.config->targets;
  if (!u.config->srv.empty() && dns != nullptr) {
    if (auto found = dns->services.find(u.config->srv); found != dns->services.end()) {
      for (const DnsAnswers::Srv& r : found->second) {
        configured.push_back(TargetConfig{r.host, r.port, r.weight, r.priority});
      }
    }
  }
  for (std::size_t i = 0; i < configured.size(); ++i) {
    const TargetConfig& t = configured[i];
    auto numeric = Address::from_host_port(t.host, t.port);
    const std::vector<std::string>* addresses = nullptr;
    if (!numeric && dns != nullptr) {
      if (auto found = dns->addresses.find(t.host); found != dns->addresses.end()) {
        addresses = &found->second;
      }
    }
    // Without discovery (check-config, tests), the system resolver; with it, a name it does
    // not answer for has no address: never looked up here, on the thread building.
    if (addresses == nullptr) {
      if (numeric || dns == nullptr) {
        add(t, resolve_target(t, fmt::format("upstreams.{}.targets[{}]", u.config->name, i)),
            false);
      }
      continue;
    }
    for (const std::string& ip : *addresses) {
      if (auto address = Address::from_host_port(ip, t.port)) {
        add(t, *address, addresses->size() > 1);
      }
    }
  }
}

// Where the Redis of `redis` is: a numeric host as it is; a name, the first of discovery's
// addresses for it (none while it has none); without discovery (check-config), through the
// system resolver.
std::optional<Address> redis_at(const RedisConfig& redis, const DnsAnswers* dns) {
  TargetConfig target{redis.host, redis.port};
  if (dns == nullptr || Address::from_host_port(redis.host, redis.port)) {
    return resolve_target(target, "redis.address");
  }
  auto found = dns->addresses.find(redis.host);
  if (found == dns->addresses.end() || found->second.empty()) return std::nullopt;
  auto address = Address::from_host_port(found->second.front(), redis.port);
  return address ? std::optional(*address) : std::nullopt;
}

// What the balancers of `u` are made over: its targets as resolved. A target's ring key is its
// name, port and address, whatever else the name resolves to: the label says the address only
// when the name has several, so a key on it would change (and move the target's points) when a
// name's other address comes or goes.
std::vector<RingTarget> ring_targets(const Gateway::Upstream& u) {
  std::vector<RingTarget> ring;
  for (const Gateway::Target& t : u.targets) {
    ring.push_back(
        {fmt::format("{}:{} {}", t.config.host, t.config.port, t.endpoint.address.to_string()),
         t.config.weight});
  }
  return ring;
}

// The rate limiters of every route, by middleware (nullptr for one that is not a rate_limit).
std::vector<std::vector<std::shared_ptr<RateLimiter>>> make_rate_limits(const Config& c,
                                                                        RateLimitRegistry& limits,
                                                                        std::size_t workers,
                                                                        const DnsAnswers* dns) {
  std::optional<Address> redis_address;
  if (c.redis) redis_address = redis_at(*c.redis, dns);
  std::vector<std::vector<std::shared_ptr<RateLimiter>>> all;
  for (const RouteConfig& route : c.routes) {
    auto& limiters = all.emplace_back();
    for (std::size_t i = 0; i < route.middlewares.size(); ++i) {
      const MiddlewareConfig& m = route.middlewares[i];
      if (m.kind != MiddlewareConfig::Kind::kRateLimit) {
        limiters.emplace_back();
      } else {
        limiters.push_back(
            limits.limiter(route.name, i, m.rate_limit, c.redis, redis_address, workers));
      }
    }
  }
  return all;
}

// Each server with its route table, the fields its routes own, and its routes' series.
std::vector<Gateway::Server> make_servers(const Config& c, Metrics* metrics) {
  std::vector<Gateway::Server> servers;
  for (const ServerConfig& server : c.servers) {
    Gateway::Server built{&server, server.key(), RouteTable(c, server.name), {}, {}};
    built.owned_fields = detail::owned_fields(built.routes);
    if (metrics != nullptr) {
      for (const RouteConfig& route : c.routes) {
        built.route_series.push_back(metrics->request_series(built.key, route.name));
      }
    }
    servers.push_back(std::move(built));
  }
  return servers;
}

// The configured upstreams, without targets yet (a service's way of speaking makes them). Room
// for a variant per service: the services keep pointers into the list.
std::vector<Gateway::Upstream> make_upstreams(const Config& c) {
  std::vector<Gateway::Upstream> upstreams;
  upstreams.reserve(c.upstreams.size() + c.services.size());
  for (const UpstreamConfig& u : c.upstreams) {
    Gateway::Upstream upstream;
    upstream.config = &u;
    upstream.index = upstreams.size();
    upstream.limits.max_idle = u.keepalive.max_idle;
    upstream.limits.idle_timeout = u.keepalive.idle_timeout;
    upstream.limits.max_connections = u.limits.max_connections;
    upstream.limits.max_pending = u.limits.max_pending;
    upstream.limits.preempt_stalled = u.limits.preempt_stalled;
    upstreams.push_back(std::move(upstream));
  }
  return upstreams;
}

// The variants of each configured upstream made so far, by the way they are spoken to.
using Variants = std::vector<std::vector<std::pair<std::string, Gateway::Upstream*>>>;

// The upstream that service `s` speaks to: an upstream's targets are made for each way services
// speak to them (protocol, TLS settings, server name); services that agree share them, one that
// differs gets targets of its own (a variant of the upstream, with its own balancer, connections
// and health), so that no service is ever spoken for with another's TLS settings.
Gateway::Upstream* upstream_for(const Config& c, const ServiceConfig& s,
                                std::vector<Gateway::Upstream>& upstreams, Variants& variants,
                                HealthRegistry& health, const DnsAnswers* dns) {
  auto configured = upstreams.begin() + static_cast<std::ptrdiff_t>(c.upstreams.size());
  auto it = std::find_if(upstreams.begin(), configured,
                         [&](const Gateway::Upstream& u) { return u.config->name == s.upstream; });
  if (it == configured) {
    throw ConfigError(fmt::format("services.{}: no upstream named '{}'", s.name, s.upstream));
  }
  auto& known = variants[it->index];
  // (An upstream serves one protocol: a second service must agree.)
  if (!known.empty() && known.front().second->protocol != wire_protocol(s.protocol)) {
    throw ConfigError(
        fmt::format("services.{}: upstream '{}' is already used by a service with another "
                    "protocol",
                    s.name, s.upstream));
  }
  std::shared_ptr<const TlsClientContext> tls = service_tls(s);
  std::string settings = fmt::format("{}|{}", tls ? tls->identity() : "plain",
                                     s.tls ? s.tls_server_name : std::string());
  auto same =
      std::ranges::find(known, settings, &std::pair<std::string, Gateway::Upstream*>::first);
  if (same != known.end()) {
    same->second->services.push_back(s.name);
    return same->second;
  }
  Gateway::Upstream* u = &*it;
  if (!known.empty()) {
    u = &upstreams.emplace_back(*it);
    u->index = upstreams.size() - 1;
    u->targets.clear();
    u->services.clear();
  }
  u->protocol = wire_protocol(s.protocol);
  u->tls = static_cast<bool>(tls);
  u->services.push_back(s.name);
  make_targets(*u, s, tls, health, dns);
  known.emplace_back(std::move(settings), u);
  return u;
}

// Each service with its timeouts, series and the upstream (or variant) it speaks to.
std::vector<Gateway::Service> make_services(const Config& c,
                                            std::vector<Gateway::Upstream>& upstreams,
                                            HealthRegistry& health, Metrics* metrics,
                                            const DnsAnswers* dns) {
  std::vector<Gateway::Service> services;
  services.reserve(c.services.size());
  Variants variants(c.upstreams.size());
  for (const ServiceConfig& s : c.services) {
    Gateway::Service service;
    service.config = &s;
    service.index = services.size();
    if (metrics != nullptr) service.series = metrics->upstream_series(s.name);
    service.timeouts = http::ExchangeTimeouts{.connect = s.timeouts.connect,
                                              .first_byte = s.timeouts.first_byte,
                                              .read = s.timeouts.read,
                                              .write = s.timeouts.write};
    service.upstream = upstream_for(c, s, upstreams, variants, health, dns);
    services.push_back(service);
  }
  for (const auto& made : variants) {
    for (const auto& [settings, u] : made) u->variants = made.size();
  }
  return services;
}

// What each worker keeps: a balancer and the requests in flight per upstream, a retry budget
// per service.
std::vector<std::unique_ptr<Gateway::WorkerState>> make_worker_states(
    const std::vector<Gateway::Upstream>& upstreams, std::size_t services, std::size_t workers) {
  std::vector<std::unique_ptr<Gateway::WorkerState>> states;
  for (std::size_t w = 0; w < workers; ++w) {
    auto state = std::make_unique<Gateway::WorkerState>();
    for (const Gateway::Upstream& u : upstreams) {
      state->balancers.push_back(Balancer::make(u.config->balancer, ring_targets(u)));
      state->in_flight.emplace_back(u.targets.size(), 0);
    }
    // Each worker starts with room for a few retries, so that a quiet service can retry too.
    state->budgets.resize(services, Gateway::WorkerState::Budget{.milli = 10'000});
    states.push_back(std::move(state));
  }
  return states;
}

}  // namespace

std::shared_ptr<Gateway> Gateway::build(Config config, std::size_t workers, HealthRegistry& health,
                                        Metrics* metrics, RateLimitRegistry* limits,
                                        const DnsAnswers* dns) {
  std::shared_ptr<Gateway> g(new Gateway());
  g->config_ = std::move(config);
  const Config& c = g->config_;
  if (limits == nullptr) {
    g->own_limits_ = std::make_unique<RateLimitRegistry>();
    limits = g->own_limits_.get();
  }
  g->rate_limits_ = make_rate_limits(c, *limits, workers, dns);
  g->servers_ = make_servers(c, metrics);
  g->upstreams_ = make_upstreams(c);
  g->services_ = make_services(c, g->upstreams_, health, metrics, dns);
  g->workers_ = make_worker_states(g->upstreams_, g->services_.size(), workers);
  return g;
}

Gateway::~Gateway() { stop_probes(); }

const Gateway::Server* Gateway::server(std::string_view key) const {
  for (const Server& s : servers_) {
    if (http::equal_bytes(s.key, key)) return &s;
  }
  return nullptr;
}

const Gateway::Service* Gateway::service(std::string_view name) const {
  for (const Service& s : services_) {
    if (s.config->name == name) return &s;
  }
  return nullptr;
}

Gateway::WorkerState& Gateway::worker_state() { return *workers_.at(Worker::current()->index()); }

// ---- active health ----------------------------------------------------------------------------

namespace {

// Probes one target until told to stop: GET path every interval; `healthy` successes in a row
// bring it back, `unhealthy` failures in a row take it out.
void probe_loop(Gateway::Target target, ActiveHealthConfig config, std::string upstream,
                http::UpstreamConnections& connections, std::shared_ptr<std::atomic<bool>> stop) {
  unsigned good = 0, bad = 0;
  while (!stop->load() && !this_fiber::stop_requested()) {
    http::RequestHead head;
    head.method = "GET";
    head.target = config.path;
    http::ExchangeTimeouts timeouts{.connect = config.timeout,
                                    .first_byte = config.timeout,
                                    .read = config.timeout,
                                    .write = config.timeout};
    bool ok = false;
    auto exchange = connections.open(target.endpoint, head, target.label, timeouts);
    if (exchange && (*exchange)->finish()) {
      auto response = (*exchange)->read_head();
      if (response && (*response)->status >= 200 && (*response)->status < 400) {
        char sink[1024];
        Result<std::size_t> n;
        while ((n = (*exchange)->read(sink)) && *n > 0) {
        }
        ok = n.has_value();
      }
    }
    bool was = target.health->probe_healthy();
    if (ok) {
      bad = 0;
      if (++good >= config.healthy && !was) {
        target.health->set_probe_healthy(true);
        log_info("upstream {}: target {} is healthy again", upstream, target.label);
      }
    } else {
      good = 0;
      if (++bad >= config.unhealthy && was) {
        target.health->set_probe_healthy(false);
        log_warn("upstream {}: target {} failed {} health checks in a row: taken out", upstream,
                 target.label, bad);
      }
    }
    if (this_fiber::sleep_for(config.interval)) break;
  }
}

}  // namespace

void Gateway::start_probes(Runtime& runtime, http::UpstreamConnections& connections) {
  std::size_t next = 0;
  for (const Upstream& u : upstreams_) {
    if (!u.config->active_health.enabled) continue;
    for (const Target& t : u.targets) {
      Worker& worker = runtime.worker(next++ % runtime.size());
      probes_.push_back(spawn_on(
          worker, [t, config = u.config->active_health, name = u.config->name, &connections,
                   stop = probes_stop_] { probe_loop(t, config, name, connections, stop); }));
    }
  }
}

void Gateway::stop_probes() {
  probes_stop_->store(true);
  for (auto& probe : probes_) probe.request_stop();
  for (auto& probe : probes_) {
    if (probe.joinable()) probe.join();
  }
  probes_.clear();
}

// ---- publishing -------------------------------------------------------------------------------

void Gateways::publish(std::shared_ptr<Gateway> gateway) {
  WaitGroup switched;
  for (std::size_t i = 0; i < current_.size(); ++i) {
    switched.add();
    runtime_.worker(i).post([this, i, gateway, &switched] {
      current_[i] = gateway;  // the old one goes when its last request lets go of it
      switched.done();
    });
  }
  (void)switched.wait();
}

const std::shared_ptr<Gateway>& Gateways::current() const {
  return current_.at(Worker::current()->index());
}

}  // namespace spindle::proxy
