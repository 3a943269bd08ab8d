#pragma once
// One running spindle: its listeners and gateway for the configuration in force, and the
// reload that replaces that configuration while serving.

#include <atomic>
#include <cstdint>
#include <expected>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "handover.h"
#include "spindle/base/log_output.h"
#include "spindle/client/exchange.h"
#include "spindle/fiber/runtime.h"
#include "spindle/proxy/config.h"
#include "spindle/proxy/discovery.h"
#include "spindle/proxy/gateway.h"
#include "spindle/proxy/metrics.h"
#include "spindle/server/server.h"

namespace spindle::app {

/// The servers and the gateway of a configuration, on a started runtime. Every method is
/// called from the main thread (outside the workers), one at a time.
class Instance {
 public:
  explicit Instance(Runtime& runtime);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  /// Puts `config` in force: the first one, or a replacement (a reload). Everything that can
  /// fail (target names, TLS, files, binding new addresses) is done before anything changes,
  /// so that on failure the configuration in force stays whole; the message says why.
  ///
  /// On success: the new gateway is published (each request keeps the one it started with);
  /// a server whose settings did not change keeps its listening socket and its connections; a
  /// changed one gets the new settings on the same socket while its open connections finish
  /// on the old ones; a new address is bound; a server no longer configured stops accepting
  /// and drains in the background. Upstream connections and target health are kept by target
  /// across configurations.
  std::expected<void, std::string> apply(proxy::Config config);

  /// Graceful shutdown: not ready any more, stop accepting, let requests in flight finish
  /// (HTTP/1.1 responses say Connection: close, HTTP/2 connections get GOAWAY) until the
  /// configuration's drain_timeout, then close what is left. True if everything finished.
  /// `gentle`: how long idle HTTP/1.1 connections are left to close after one more response
  /// before they are closed (after a handover, where their clients may be sending).
  bool shutdown(std::chrono::milliseconds gentle = {});

  /// Listening sockets handed over by the process this one replaces: apply() accepts from
  /// them instead of binding (those it does not use are closed after it).
  void inherit(InheritedListeners listeners) { inherited_ = std::move(listeners); }
  /// The "listening" lines apply() writes (what tests and scripts wait for) are kept back until
  /// release_listening_lines(): a process taking over writes them once the handover point is
  /// its own, so that whoever read them can upgrade it at once.
  void hold_listening_lines() { holding_lines_ = true; }
  void release_listening_lines();
  /// Every listening socket, by listener identity, to hand over to a replacing process.
  std::map<std::string, std::vector<int>> listener_fds() const;

  /// The configuration in force.
  const proxy::Config& config() const { return config_; }
  /// False once shutdown began.
  bool ready() const { return !draining_.load(std::memory_order_relaxed); }
  /// Brings what the admin listener shows of the listeners up to date (connections open on
  /// each); the main thread calls it every second.
  void refresh();

  /// When DNS discovery's answers changed (a target name's addresses, an SRV name's records),
  /// builds the gateway again with them and publishes it: new targets join, gone ones drain.
  /// The main thread calls it every second, and when dns_fd() is readable.
  void rediscover();
  /// Puts the pools of `gateway`'s endpoints in force besides those in force, before it is
  /// published: a pool its first requests made before that would be taken for one of a
  /// configuration before, and its connections closed after them.
  void admit_endpoints(const proxy::Gateway* gateway);
  /// Has DNS discovery look the names of `config` up (besides those of the configuration in
  /// force), in the background; true once each has had its first lookup end, so that apply()
  /// finds their answers. Never waits.
  bool names_ready(const proxy::Config& config);
  /// Waits (on the calling thread) until names_ready(config), `until`, or `interrupt` (a
  /// descriptor: the signals') is readable; true unless `interrupt` ended the wait.
  bool wait_for_names(const proxy::Config& config, std::chrono::steady_clock::time_point until,
                      int interrupt);
  /// Readable when discovery has news (changed answers, names ready).
  int dns_fd() const { return discovery_.fd(); }

  /// Opens the access log files again, at their paths (logrotate renamed them and sends
  /// SIGUSR1; a reload does it too): lines from now on go to the new files. A file that cannot
  /// be opened is said in the log, and its old one goes on.
  void reopen_logs();

  /// Reloads tried, and how they ended (for the admin listener).
  struct ReloadCounts {
    std::atomic<std::uint64_t> succeeded{0};
    std::atomic<std::uint64_t> failed{0};
  };
  ReloadCounts& reloads() { return reloads_; }

 private:
  /// Writes `line` to standard output, or keeps it while holding_lines_.
  void announce(std::string line);

  bool holding_lines_ = false;
  std::string held_lines_;

  /// A listening address and what serves it.
  struct Listener {
    /// ServerConfig::fingerprint of the settings it serves.
    std::string fingerprint;
    std::unique_ptr<http::HttpServer> server;
  };
  /// A server's router and options, built before anything changes.
  struct Prepared {
    Address listen;
    /// ServerConfig::fingerprint ("admin" for the admin listener).
    std::string fingerprint;
    /// For the log: ServerConfig::key(), or "admin".
    std::string name;
    http::Router router;
    http::ServerOptions options;
    /// The key of listeners_ it goes with.
    std::string identity;
    bool admin = false;
  };
  std::expected<Prepared, std::string> prepare(const proxy::ServerConfig& server);
  /// The output of `log`'s path for the configuration being prepared: the one in force for
  /// that path (one writer per file, kept across reloads), or a new one.
  std::expected<std::shared_ptr<LogOutput>, std::string> log_output(
      const proxy::AccessLogConfig& log);
  /// apply()'s first step: the gateway for `config` (nullptr without routes), with its target
  /// and SRV names (`hosts`, `srv`) as discovery last answered them (`answers`; names it has
  /// no answer for yet have no target); or why it cannot be built.
  std::expected<std::shared_ptr<proxy::Gateway>, std::string> build_gateway(
      const proxy::Config& config, std::set<std::string>& hosts, std::set<std::string>& srv,
      std::optional<proxy::DnsAnswers>& answers);
  /// Every server of `compiled` prepared, and the admin listener; or the first that cannot
  /// be (an address listed twice included).
  std::expected<std::vector<Prepared>, std::string> prepare_all(const proxy::Config& compiled);
  /// Servers bound for the addresses that had none, not yet accepting, by identity.
  using Opened = std::map<std::string, std::unique_ptr<http::HttpServer>>;
  /// Binds (or takes over from inherited_) each address of `prepared` not served yet; if one
  /// cannot be bound, those bound here are closed again and the error says which. The
  /// inherited sockets left unused are closed.
  std::expected<Opened, std::string> open_new(std::vector<Prepared>& prepared);
  /// apply()'s switch: the `opened` servers start accepting, the kept ones whose settings
  /// changed are reconfigured, those no longer configured retire.
  void switch_listeners(std::vector<Prepared>& prepared, Opened& opened);
  /// Stops `server` accepting now and drains it on a thread of its own.
  void retire(std::unique_ptr<http::HttpServer> server);
  /// The admin listener's routes.
  http::Router admin_router();
  /// The process's own part of /metrics.
  std::string process_metrics();
  /// The logs' part of it: lines dropped and bytes waiting per output, lines suppressed.
  void log_metrics(std::string& out);

  Runtime& runtime_;
  proxy::HealthRegistry health_;
  http::UpstreamConnections connections_;
  proxy::Gateways gateways_;
  proxy::Metrics metrics_;
  proxy::RateLimitRegistry limits_;
  /// Keeps target names resolved (its thread starts when a configuration first has any).
  proxy::Discovery discovery_{proxy::DnsConfig{}};
  proxy::Proxy forwarder_;
  proxy::Config config_;
  std::shared_ptr<proxy::Gateway> gateway_;
  /// The access logs' outputs by path ("-": standard output), of the configuration in force
  /// (outputs_) and of the one being prepared (preparing_outputs_). Declared before the
  /// listeners, whose logs write to them, so that they are destroyed after.
  std::map<std::string, std::shared_ptr<LogOutput>> outputs_;
  std::map<std::string, std::shared_ptr<LogOutput>> preparing_outputs_;
  /// By listen address (for an ephemeral port, its place in the list as well).
  std::map<std::string, Listener> listeners_;
  /// Servers draining after a reload removed them.
  std::vector<std::thread> retiring_;
  std::atomic<bool> draining_{false};
  InheritedListeners inherited_;
  ReloadCounts reloads_;
  /// What the admin listener shows of the configuration in force and of the listeners,
  /// written by the main thread (refresh()), read by the admin's handlers on the workers.
  mutable std::mutex shown_lock_;
  std::string shown_config_;
  std::vector<std::pair<std::string, std::size_t>> shown_connections_;
  std::vector<std::shared_ptr<LogOutput>> shown_outputs_;
  std::atomic<std::int64_t> last_reload_unix_{0};
  bool started_ = false;
};

}  // namespace spindle::app
