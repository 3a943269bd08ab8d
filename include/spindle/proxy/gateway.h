#pragma once
/// The gateway: a configuration compiled into an immutable snapshot (route tables, services,
/// upstreams with their targets resolved, balancers), the per-worker state that goes with it,
/// target health that outlives snapshots, and the proxy that forwards requests through them.
///
/// Workers hold a shared_ptr to the snapshot in force (Gateways::publish swaps it on each
/// worker through post()); a request keeps the snapshot it started with until its response
/// body is sent. Connections are pooled by endpoint (http::UpstreamConnections) and health is
/// kept by target address (HealthRegistry), both beside the snapshots, so a new snapshot that
/// keeps a target keeps its connections and its health.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "spindle/client/exchange.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/proxy/balancer.h"
#include "spindle/proxy/config.h"
#include "spindle/proxy/discovery.h"
#include "spindle/proxy/metrics.h"
#include "spindle/proxy/rate_limit.h"
#include "spindle/proxy/route_table.h"
#include "spindle/server/router.h"
#include "spindle/sync/wait_group.h"

namespace spindle::proxy {

/// One target's health, shared by every worker: passive ejection (max_fails failures within
/// fail_timeout take it out for fail_timeout) and the active prober's verdict.
class TargetHealth {
 public:
  /// True unless ejected now or found unhealthy by the prober.
  bool healthy(Clock::time_point now) const;
  /// True if passive checks have it ejected now.
  bool ejected(Clock::time_point now) const;
  /// A failed exchange (connect failure, reset, timeout, malformed response): true when it is
  /// the max_fails-th within fail_timeout, so that the target is due to be ejected (its
  /// upstream decides: Gateway::Upstream::record_failure).
  bool note_failure(const PassiveHealthConfig& config, Clock::time_point now);
  /// Takes the target out of the balancer's choice until `until`.
  void eject(Clock::time_point until);
  /// A successful exchange: the failure count starts again.
  void record_success();
  /// The prober's verdict.
  void set_probe_healthy(bool healthy) { probe_healthy_.store(healthy, std::memory_order_relaxed); }
  bool probe_healthy() const { return probe_healthy_.load(std::memory_order_relaxed); }

 private:
  static std::int64_t ticks(Clock::time_point t) { return t.time_since_epoch().count(); }
  std::atomic<unsigned> fails_{0};
  std::atomic<std::int64_t> first_fail_{0};
  std::atomic<std::int64_t> ejected_until_{0};
  std::atomic<bool> probe_healthy_{true};
};

/// Health by target, kept across snapshots.
class HealthRegistry {
 public:
  /// The health of the target at `key` (an endpoint key), made on first use.
  std::shared_ptr<TargetHealth> get(const std::string& key);

 private:
  std::mutex lock_;
  std::unordered_map<std::string, std::shared_ptr<TargetHealth>> health_;
};

/// A compiled configuration. Built off the workers (it resolves target names), then
/// read-only except for the per-worker state each worker alone touches.
class Gateway {
 public:
  struct Target {
    TargetConfig config;
    http::Endpoint endpoint;
    /// For a target spoken to over HTTP/2: the same address over HTTP/1.1 (TLS offering
    /// http/1.1), where an upgrade goes when the target allows no extended CONNECT (RFC 8441).
    std::optional<http::Endpoint> upgrade_endpoint;
    /// "host:port" as configured, for logs.
    std::string label;
    std::shared_ptr<TargetHealth> health;
  };
  struct Upstream {
    const UpstreamConfig* config = nullptr;
    std::vector<Target> targets;
    http::PoolLimits limits;
    std::size_t index = 0;
    /// How its targets are spoken to: the protocol (one per upstream) and whether over TLS.
    /// Its targets' endpoints carry the TLS settings of the services below.
    http::WireProtocol protocol = http::WireProtocol::kHttp1;
    bool tls = false;
    /// The services that speak to its targets so (same protocol, TLS settings, server name).
    std::vector<std::string> services;
    /// How many ways services speak to this upstream's targets: above 1, an upstream of the
    /// configuration is here once per way (a variant each, with its own targets, balancer,
    /// connections and health; the same config).
    std::size_t variants = 1;

    /// What passive checking did with a failure of target `index`.
    enum class Verdict {
      kCounted,   ///< counted; no ejection due yet
      kEjected,   ///< the target is out for fail_timeout
      kWithheld,  ///< an ejection was due, but max_ejection_percent of the targets are out
    };
    /// Counts a failure of target `index`, ejecting it when due unless the upstream has as many
    /// targets ejected as max_ejection_percent allows (at least one may be; one always stays).
    /// Workers decide at once without a lock: two may eject one target too many, briefly.
    Verdict record_failure(std::size_t index, Clock::time_point now) const;
  };
  struct Service {
    const ServiceConfig* config = nullptr;
    Upstream* upstream = nullptr;
    http::ExchangeTimeouts timeouts;
    std::size_t index = 0;
    /// Its upstream series in Metrics (when built with metrics).
    std::uint32_t series = 0;
  };
  struct Server {
    const ServerConfig* config = nullptr;
    /// ServerConfig::key().
    std::string key;
    RouteTable routes;
    /// Its request series in Metrics for each route of the configuration, by the route's
    /// place in Config::routes (empty when built without metrics).
    std::vector<std::uint32_t> route_series;
    /// The fields its routes judge or write: a request may have each once, in the
    /// configuration's spelling (else 400).
    std::vector<OwnedField> owned_fields;
  };

  /// Compiles `config` for a runtime of `workers` workers (numbering its series in `metrics`,
  /// if given). Throws ConfigError when a target's name does not resolve or an upstream's TLS
  /// cannot be set up.
  /// Rate limits come from `limits` (kept across configurations) when given. Also throws
  /// when the Redis address does not resolve.
  /// With `dns` (discovery's answers), a target's name stands for every address found for it,
  /// and an upstream's srv for its records; a name not answered there goes to the system
  /// resolver (its first address).
  static std::shared_ptr<Gateway> build(Config config, std::size_t workers, HealthRegistry& health,
                                        Metrics* metrics = nullptr,
                                        RateLimitRegistry* limits = nullptr,
                                        const DnsAnswers* dns = nullptr);
  /// The rate limits of route number `route` of the configuration, by middleware (nullptr for
  /// a middleware that is not a rate_limit).
  const std::vector<std::shared_ptr<RateLimiter>>& rate_limits(std::size_t route) const {
    return rate_limits_[route];
  }
  ~Gateway();

  const Config& config() const { return config_; }
  /// The server whose key (ServerConfig::key()) is `key`, or nullptr.
  const Server* server(std::string_view key) const;
  const Service* service(std::string_view name) const;
  const std::vector<Upstream>& upstreams() const { return upstreams_; }

  /// What one worker keeps for this snapshot: balancers, requests in flight per target, and
  /// the retry budget per service. Touched by that worker only.
  struct WorkerState {
    std::vector<std::unique_ptr<Balancer>> balancers;
    std::vector<std::vector<std::size_t>> in_flight;
    struct Budget {
      /// Retries that may be spent now, in thousandths (each request adds budget x 1000).
      std::int64_t milli = 0;
    };
    std::vector<Budget> budgets;
    /// Scratch for the balancer's view of an upstream's targets (filled and read between
    /// two parks, so one list serves every request of the worker).
    std::vector<TargetView> views;
  };
  WorkerState& worker_state();

  /// Starts one active prober per target with active health (one per process, spread over
  /// the workers); they stop when stop_probes() is called or the gateway is destroyed.
  void start_probes(Runtime& runtime, http::UpstreamConnections& connections);
  void stop_probes();

 private:
  Gateway() = default;
  Config config_;
  std::vector<Server> servers_;
  std::vector<Upstream> upstreams_;
  std::vector<Service> services_;
  std::vector<std::vector<std::shared_ptr<RateLimiter>>> rate_limits_;
  /// The registry of a gateway built without one.
  std::unique_ptr<RateLimitRegistry> own_limits_;
  std::vector<std::unique_ptr<WorkerState>> workers_;
  std::vector<JoinHandle<void>> probes_;
  std::shared_ptr<std::atomic<bool>> probes_stop_ = std::make_shared<std::atomic<bool>>(false);
};

/// The snapshot in force on each worker.
class Gateways {
 public:
  explicit Gateways(Runtime& runtime) : runtime_(runtime), current_(runtime.size()) {}
  /// Makes `gateway` the one in force on every worker (each switches between requests).
  /// Call from outside the workers, once the runtime is started; returns when all have
  /// switched.
  void publish(std::shared_ptr<Gateway> gateway);
  /// The snapshot in force on the calling worker.
  const std::shared_ptr<Gateway>& current() const;
  /// The runtime whose workers it publishes to.
  Runtime& runtime() const { return runtime_; }

 private:
  Runtime& runtime_;
  std::vector<std::shared_ptr<Gateway>> current_;
};

/// Forwards requests that match a route to the route's service. Used as the first middleware
/// of a server's router: a request no route matches goes on to the server's own handlers.
class Proxy {
 public:
  /// With `metrics`, every request through its middlewares is counted there (with the
  /// numbers of the gateways' series, which must have been built with the same metrics).
  Proxy(Gateways& gateways, http::UpstreamConnections& connections, Metrics* metrics = nullptr);
  ~Proxy();

  /// Waits until every mirror copy on its way has ended, or `deadline`; true if all did (a
  /// shutdown waits no longer than its drain; then cancelling the fibers ends the others).
  bool finish_mirrors(Deadline deadline);
  /// The middleware for the server whose key (ServerConfig::key()) is `server_key`: it forwards
  /// along the routes that server has in the snapshot in force, whichever that is by then.
  http::Middleware middleware(std::string server_key);

  /// Forwards `request` along `route` of `gateway` (the proxy's whole job; public for tests)
  /// to `service` (default: the route's own).
  http::Response forward(http::Request& request, const std::shared_ptr<Gateway>& gateway,
                         const Gateway::Server& server, const RouteConfig& route,
                         std::string_view service = {});

 private:
  /// A request on `route`: the middlewares that may answer first (auth, limits), or the way
  /// on (pass_on); then the fields those middlewares add to any answer.
  http::Response on_route(http::Request& request, const std::shared_ptr<Gateway>& gateway,
                          const Gateway::Server& server, const RouteConfig& route);
  /// on_route for a route with middlewares. Apart, so that a route without any (and every
  /// request through it) does not carry the middlewares' frame (a forward_auth's request,
  /// their answers: 9 KiB) on its fiber's stack while it waits for the upstream.
  http::Response through_middlewares(http::Request& request,
                                     const std::shared_ptr<Gateway>& gateway,
                                     const Gateway::Server& server, const RouteConfig& route);
  /// Mirrors the request if the route says so, picks the service (traffic_split) and
  /// forwards to it.
  http::Response pass_on(http::Request& request, const std::shared_ptr<Gateway>& gateway,
                         const Gateway::Server& server, const RouteConfig& route);

  /// forward_auth, the middleware at position `at` of `route`: asks its service about
  /// `request`, as the middlewares before it left it and as `server` forwards it. nullopt lets
  /// it go on (the fields to copy kept as attributes); otherwise the answer the client gets.
  std::optional<http::Response> authorize(http::Request& request,
                                          const std::shared_ptr<Gateway>& gateway,
                                          const Gateway::Server& server, const RouteConfig& route,
                                          std::size_t at);

  /// mirror: sends a copy of `request` to `config`'s service in a fiber of its own (or drops
  /// it, beyond max_in_flight), noting which in the request's "mirror" attribute. A body goes
  /// along only if the primary reads it whole (up to `primary_buffering`, its service's
  /// request_buffering) and it is small; otherwise the copy is skipped (and counted).
  void mirror(http::Request& request, const std::shared_ptr<Gateway>& gateway,
              const ServerConfig& server, const RouteConfig& route, const MirrorConfig& config,
              std::uint64_t primary_buffering);

  Gateways& gateways_;
  http::UpstreamConnections& connections_;
  Metrics* metrics_;
  /// Checks basic_auth passwords (off the workers for bcrypt), remembering good ones.
  std::unique_ptr<class PasswordCheck> passwords_;
  /// mirror: copies on their way, per worker (touched by that worker only), and in all.
  std::vector<std::size_t> mirrors_in_flight_;
  WaitGroup mirrors_;
};

}  // namespace spindle::proxy
