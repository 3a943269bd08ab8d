#include "instance.h"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <unordered_set>
#include <utility>

#include "serve.h"
#include "site.h"
#include "spindle/base/log.h"
#include "spindle/net/tls.h"
#include "spindle/proxy/admin.h"
#include "spindle/proxy/redis.h"

namespace spindle::app {
namespace {

// The line on standard output that says an address is served (tests and scripts wait for it).
// "ktls_available": the kernel offers kTLS, so OpenSSL may hand a connection's records to it
// after that connection's handshake (cipher and kernel permitting). Whether it did is known
// per connection only (TlsStream::ktls_send()), never at start.
std::string listening_line(const http::HttpServer& server, const http::ServerOptions& options,
                           std::size_t workers, bool admin) {
  if (admin) {
    return fmt::format("{{\"event\":\"admin_listening\",\"address\":\"{}\"}}\n",
                       server.address().to_string());
  }
  return fmt::format(
      "{{\"event\":\"listening\",\"address\":\"{}\",\"tls\":{},\"ktls_available\":{},"
      "\"http2\":{},\"workers\":{},\"version\":\"{}\"}}\n",
      server.address().to_string(), options.tls != nullptr,
      options.tls != nullptr && kernel_offers_ktls(), options.http2, workers, kVersion);
}

// How reloads recognise a server's listener: its address, or for an ephemeral port (":0", a
// new one at every bind) its place in the list.
std::string listener_identity(const proxy::ServerConfig& server, std::size_t index) {
  std::string address = server.listen.to_string();
  if (server.listen.unix_path().empty() && server.listen.port() == 0) {
    return fmt::format("{} (servers[{}])", address, index);
  }
  return address;
}

// The pool keys of every target of `gateway` (none without one).
std::unordered_set<std::string> endpoint_keys(const proxy::Gateway* gateway) {
  std::unordered_set<std::string> keys;
  if (gateway == nullptr) return keys;
  for (const auto& u : gateway->upstreams()) {
    for (const auto& t : u.targets) {
      keys.insert(t.endpoint.key());
      if (t.upgrade_endpoint) keys.insert(t.upgrade_endpoint->key());
    }
  }
  return keys;
}

}  // namespace

void Instance::announce(std::string line) {
  if (holding_lines_) {
    held_lines_ += line;
    return;
  }
  // Through the one writer to standard output (after the access lines before it), never
  // dropped, and never waited for: a reader that stopped cannot hold a reload.
  LogOutput::standard_output().write(line, 1, LogOutput::kDirect | LogOutput::kKeep);
}

void Instance::release_listening_lines() {
  holding_lines_ = false;
  announce(std::exchange(held_lines_, std::string()));
}

Instance::Instance(Runtime& runtime)
    : runtime_(runtime),
      connections_(runtime),
      gateways_(runtime),
      metrics_(runtime),
      forwarder_(gateways_, connections_, &metrics_) {}

Instance::~Instance() {
  for (auto& [address, listener] : listeners_) listener.server->stop();
  for (auto& thread : retiring_) thread.join();
  if (gateway_) gateway_->stop_probes();
}

std::expected<Instance::Prepared, std::string> Instance::prepare(
    const proxy::ServerConfig& server) {
  // The proxy is always there, even for a server no route names now: a reload may give it
  // routes, and without any it hands every request on at the cost of one pointer test.
  auto router = build_site(server, forwarder_.middleware(server.key()));
  if (!router) return std::unexpected(router.error());
  http::ServerOptions options = server.http;
  if (server.access_log.enabled) {
    auto format = server.access_log.format == "json" ? http::AccessLog::Format::kJson
                                                     : http::AccessLog::Format::kCombined;
    auto output = log_output(server.access_log);
    if (!output) return std::unexpected(output.error());
    options.access_log = http::AccessLog::open(runtime_, std::move(*output), format);
  }
  return Prepared{
      server.listen, server.fingerprint, server.key(), std::move(*router), std::move(options), {},
      false};
}

std::expected<std::shared_ptr<LogOutput>, std::string> Instance::log_output(
    const proxy::AccessLogConfig& log) {
  auto& slot = preparing_outputs_[log.path];
  if (!slot) {
    if (auto kept = outputs_.find(log.path); kept != outputs_.end()) {
      slot = kept->second;
    } else if (log.path == "-") {
      // The process's one writer to standard output (held, not owned: it is never destroyed).
      slot = std::shared_ptr<LogOutput>(std::shared_ptr<void>(), &LogOutput::standard_output());
    } else {
      auto opened = LogOutput::open(log.path, log.buffer);
      if (!opened) {
        preparing_outputs_.erase(log.path);
        return std::unexpected(
            fmt::format("access log {}: {}", log.path, opened.error().message()));
      }
      slot = std::move(*opened);
    }
    slot->set_max_pending(log.buffer);
  } else {
    // Servers sharing a file: the largest of their bounds.
    slot->set_max_pending(std::max(log.buffer, slot->max_pending()));
  }
  return slot;
}

void Instance::reopen_logs() {
  for (const auto& [path, output] : outputs_) {
    if (output->path().empty()) continue;
    if (auto failed = output->reopen()) {
      log_error("access log {}: cannot open it again ({}): lines go on to the file it was", path,
                failed.message());
    }
  }
}

std::expected<std::shared_ptr<proxy::Gateway>, std::string> Instance::build_gateway(
    const proxy::Config& config, std::set<std::string>& hosts, std::set<std::string>& srv,
    std::optional<proxy::DnsAnswers>& answers) {
  // Target names and SRV names come from discovery (TTLs), which keeps them up to date in the
  // background: never looked up here.
  proxy::dns_names(config, hosts, srv);
  if (config.routes.empty()) return nullptr;
  if (!hosts.empty() || !srv.empty()) {
    (void)names_ready(config);
    answers = discovery_.answers();
  }
  try {
    return proxy::Gateway::build(config, runtime_.size(), health_, &metrics_, &limits_,
                                 answers ? &*answers : nullptr);
  } catch (const proxy::ConfigError& e) {
    return std::unexpected(e.what());
  }
}

std::expected<std::vector<Instance::Prepared>, std::string> Instance::prepare_all(
    const proxy::Config& compiled) {
  std::vector<Prepared> prepared;
  std::set<std::string> addresses;
  for (std::size_t i = 0; i < compiled.servers.size(); ++i) {
    const proxy::ServerConfig& server = compiled.servers[i];
    auto p = prepare(server);
    if (!p) return std::unexpected(p.error());
    p->identity = listener_identity(server, i);
    if (!addresses.insert(p->identity).second) {
      return std::unexpected(fmt::format("servers[{}]: {} is listed twice", i, p->identity));
    }
    prepared.push_back(std::move(*p));
  }
  if (compiled.admin_listen) {
    // Its routes read what they show when asked: it never needs reconfiguring.
    Prepared admin{*compiled.admin_listen, "admin", "admin", admin_router(), {}, {}, true};
    admin.options.access_log = nullptr;
    admin.identity = "admin " + compiled.admin_listen->to_string();
    prepared.push_back(std::move(admin));
  }
  return prepared;
}

std::expected<Instance::Opened, std::string> Instance::open_new(std::vector<Prepared>& prepared) {
  Opened opened;
  for (Prepared& p : prepared) {
    const std::string& address = p.identity;
    if (listeners_.contains(address)) continue;
    std::vector<UniqueFd> inherited;
    if (auto it = inherited_.find(address); it != inherited_.end()) {
      inherited = std::move(it->second);
      inherited_.erase(it);
    }
    auto bound = http::HttpServer::open(runtime_, p.listen, std::move(p.router), p.options,
                                        std::move(inherited));
    if (!bound) {
      for (auto& [_, server] : opened) server->stop();
      return std::unexpected(
          fmt::format("cannot listen on {}: {}", p.listen.to_string(), bound.error().message()));
    }
    opened.emplace(address, std::move(*bound));
  }
  // Sockets handed over for a listener this configuration does not have are not needed (from
  // systemd, that is most likely a ListenStream= the configuration does not name: said).
  for (const auto& [address, sockets] : inherited_) {
    log_warn("{}: a listening socket was passed for it, but no server listens there: closed",
             address);
  }
  inherited_.clear();
  return opened;
}

void Instance::switch_listeners(std::vector<Prepared>& prepared, Opened& opened) {
  std::set<std::string> addresses;
  for (Prepared& p : prepared) {
    const std::string& address = p.identity;
    addresses.insert(address);
    if (auto it = opened.find(address); it != opened.end()) {
      it->second->accept_connections();
      announce(listening_line(*it->second, p.options, runtime_.size(), p.admin));
      listeners_[address] = Listener{p.fingerprint, std::move(it->second)};
      continue;
    }
    Listener& listener = listeners_.at(address);
    if (listener.fingerprint == p.fingerprint) continue;
    log_info("server {}: settings changed: new connections get them, open ones finish first",
             p.name);
    listener.server->reconfigure(std::move(p.router), std::move(p.options));
    listener.fingerprint = p.fingerprint;
  }
  for (auto it = listeners_.begin(); it != listeners_.end();) {
    if (addresses.contains(it->first)) {
      ++it;
      continue;
    }
    log_info("{}: no server listens there any more: it stops accepting and drains", it->first);
    retire(std::move(it->second.server));
    it = listeners_.erase(it);
  }
}

std::expected<void, std::string> Instance::apply(proxy::Config config) {
  if (started_ && config.threads != config_.threads) {
    log_warn("threads: a change takes effect on restart; {} workers go on", runtime_.size());
  }
  if (started_ && config.huge_page_stacks != config_.huge_page_stacks) {
    log_warn("huge_page_stacks: a change takes effect on restart");
  }
  // 1. Everything that can fail, while the configuration in force serves on untouched.
  preparing_outputs_.clear();
  std::set<std::string> hosts, srv;
  std::optional<proxy::DnsAnswers> answers;
  auto gateway = build_gateway(config, hosts, srv, answers);
  // On failure, discovery goes back to the names of the configuration in force.
  auto refuse = [&](std::string why) {
    std::set<std::string> kept_hosts, kept_srv;
    proxy::dns_names(config_, kept_hosts, kept_srv);
    discovery_.keep(config_.dns, kept_hosts, kept_srv);
    return std::unexpected(std::move(why));
  };
  if (!gateway) return refuse(gateway.error());
  // The gateway keeps its own copy of the configuration: the servers are read from it.
  auto prepared = prepare_all(*gateway ? (*gateway)->config() : config);
  if (!prepared) return refuse(prepared.error());
  // New addresses are bound now, not yet accepting (their first requests must find this
  // configuration's routes: they are published below); if one cannot be bound, those bound so
  // far are closed again.
  auto opened = open_new(*prepared);
  if (!opened) return refuse(opened.error());

  // 2. The switch. Nothing below fails. What /config shows changes first, then the routes;
  // a listener that is new starts accepting after both (connections that came meanwhile, or
  // waited in a socket systemd or our predecessor handed over, are served with them).
  admit_endpoints(gateway->get());
  {
    std::string text = proxy::redacted_source(config);
    std::lock_guard guard(shown_lock_);
    shown_config_ = std::move(text);
  }
  gateways_.publish(*gateway);
  // Pools are kept by target and TLS settings: those the new configuration names keep their
  // connections, the others close theirs.
  connections_.retain(endpoint_keys(gateway->get()));
  discovery_.keep(config.dns, hosts, srv);
  switch_listeners(*prepared, *opened);
  // A log file kept from the configuration before is opened again: a reload after logrotate
  // renamed it writes to the new file (as SIGUSR1 does).
  for (const auto& [path, output] : preparing_outputs_) {
    if (outputs_.contains(path) && !output->path().empty()) (void)output->reopen();
  }
  outputs_ = std::exchange(preparing_outputs_, {});
  if (*gateway) (*gateway)->start_probes(runtime_, connections_);
  if (gateway_) gateway_->stop_probes();
  gateway_ = std::move(*gateway);
  config_ = std::move(config);
  started_ = true;
  last_reload_unix_.store(std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count(),
                          std::memory_order_relaxed);
  refresh();
  return {};
}

void Instance::admit_endpoints(const proxy::Gateway* gateway) {
  std::unordered_set<std::string> both = endpoint_keys(gateway_.get());
  both.merge(endpoint_keys(gateway));
  connections_.retain(std::move(both));
}

bool Instance::names_ready(const proxy::Config& config) {
  std::set<std::string> hosts, srv;
  proxy::dns_names(config, hosts, srv);
  if (started_) proxy::dns_names(config_, hosts, srv);
  discovery_.keep(config.dns, hosts, srv);
  return discovery_.settled();
}

bool Instance::wait_for_names(const proxy::Config& config,
                              std::chrono::steady_clock::time_point until, int interrupt) {
  if (names_ready(config) || discovery_.wait_settled(until, interrupt)) return true;
  pollfd p{.fd = interrupt, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 0) <= 0;
}

void Instance::rediscover() {
  auto answers = discovery_.changed();
  if (!answers || !gateway_) return;
  std::shared_ptr<proxy::Gateway> gateway;
  try {
    gateway =
        proxy::Gateway::build(config_, runtime_.size(), health_, &metrics_, &limits_, &*answers);
  } catch (const proxy::ConfigError& e) {
    log_warn("dns: the new answers cannot be used ({}); the targets in force stay", e.what());
    return;
  }
  admit_endpoints(gateway.get());
  gateways_.publish(gateway);
  connections_.retain(endpoint_keys(gateway.get()));
  std::set<const proxy::UpstreamConfig*> said;  // (an upstream's variants have one answer)
  for (const auto& u : gateway->upstreams()) {
    if (!said.insert(u.config).second) continue;
    std::string targets;
    for (const auto& t : u.targets)
      targets += (targets.empty() ? "" : ", ") + t.endpoint.address.to_string();
    log_info("dns: upstream {} now has {} target(s): {}", u.config->name, u.targets.size(),
             targets.empty() ? "none" : targets);
  }
  gateway->start_probes(runtime_, connections_);
  gateway_->stop_probes();
  gateway_ = std::move(gateway);
}

std::map<std::string, std::vector<int>> Instance::listener_fds() const {
  std::map<std::string, std::vector<int>> fds;
  for (const auto& [identity, listener] : listeners_) {
    fds[identity] = listener.server->listener_fds();
  }
  return fds;
}

void Instance::refresh() {
  std::vector<std::pair<std::string, std::size_t>> counts;
  for (const auto& [identity, listener] : listeners_) {
    counts.emplace_back(identity, listener.server->connections());
  }
  std::vector<std::shared_ptr<LogOutput>> outputs;
  for (const auto& [path, output] : outputs_) outputs.push_back(output);
  std::lock_guard guard(shown_lock_);
  shown_connections_ = std::move(counts);
  shown_outputs_ = std::move(outputs);
}

http::Router Instance::admin_router() {
  return proxy::admin_router(
      proxy::AdminSources{.metrics = &metrics_,
                          .gateways = &gateways_,
                          .connections = &connections_,
                          .ready = [this] { return ready(); },
                          .config_text =
                              [this] {
                                std::lock_guard guard(shown_lock_);
                                return shown_config_;
                              },
                          .more_metrics = [this] { return process_metrics(); }});
}

std::string Instance::process_metrics() {
  using namespace proxy::prometheus;
  std::string out;
  family(out, "spindle_connections_active", "gauge",
         "Client connections open, by listener (updated every second).");
  {
    std::lock_guard guard(shown_lock_);
    for (const auto& [identity, count] : shown_connections_) {
      sample(out, "spindle_connections_active", fmt::format("listener=\"{}\"", escape(identity)),
             static_cast<double>(count));
    }
  }
  family(out, "spindle_reloads_total", "counter", "Configuration reloads, by outcome.");
  sample(out, "spindle_reloads_total", "outcome=\"success\"",
         static_cast<double>(reloads_.succeeded.load(std::memory_order_relaxed)));
  sample(out, "spindle_reloads_total", "outcome=\"failure\"",
         static_cast<double>(reloads_.failed.load(std::memory_order_relaxed)));
  family(out, "spindle_config_last_success_timestamp_seconds", "gauge",
         "When the configuration in force was put in force (Unix time).");
  sample(out, "spindle_config_last_success_timestamp_seconds", "",
         static_cast<double>(last_reload_unix_.load(std::memory_order_relaxed)));
  using Type = proxy::Discovery::Type;
  using Outcome = proxy::Discovery::Outcome;
  family(out, "spindle_dns_lookups_total", "counter",
         "DNS lookups of target and SRV names ended, by record type and outcome (answered, "
         "negative: NXDOMAIN or no record of the type, failed: SERVFAIL, REFUSED, timeout...).");
  for (auto [type, type_label] :
       {std::pair{Type::kA, "A"}, {Type::kAaaa, "AAAA"}, {Type::kSrv, "SRV"}}) {
    for (auto [outcome, label] : {std::pair{Outcome::kAnswered, "answered"},
                                  {Outcome::kNegative, "negative"},
                                  {Outcome::kFailed, "failed"}}) {
      sample(out, "spindle_dns_lookups_total",
             fmt::format("type=\"{}\",outcome=\"{}\"", type_label, label),
             static_cast<double>(discovery_.lookups(type, outcome)));
    }
  }
  family(out, "spindle_dns_stale_answers", "gauge",
         "Names' address families (or SRV names) served from their last answer while their "
         "lookups fail (until its TTL and dns.stale_grace have passed).");
  sample(out, "spindle_dns_stale_answers", "", static_cast<double>(discovery_.stale()));
  family(out, "spindle_redis_error_replies_total", "counter",
         "Error replies from Redis (the shared rate limits' store), by the reply's error code "
         "(READONLY after a failover, OOM, BUSY, LOADING, other): each starts a back-off.");
  for (std::size_t i = 0; i < proxy::kRedisErrorLabels.size(); ++i) {
    sample(out, "spindle_redis_error_replies_total",
           fmt::format("error=\"{}\"", proxy::kRedisErrorLabels[i]),
           static_cast<double>(proxy::redis_error_replies(static_cast<proxy::RedisErrorKind>(i))));
  }
  family(out, "spindle_ready", "gauge", "1 while serving, 0 once draining.");
  sample(out, "spindle_ready", "", ready() ? 1 : 0);
  log_metrics(out);
  return out;
}

void Instance::log_metrics(std::string& out) {
  using namespace proxy::prometheus;
  // The access logs' outputs in force and the error log (standard error), each once.
  std::vector<const LogOutput*> outputs{&LogOutput::standard_error()};
  {
    std::lock_guard guard(shown_lock_);
    for (const auto& output : shown_outputs_) {
      if (std::ranges::find(outputs, output.get()) == outputs.end()) {
        outputs.push_back(output.get());
      }
    }
  }
  family(out, "spindle_log_lines_dropped_total", "counter",
         "Log lines dropped: their output took them slower than they came (past its buffer), "
         "or failed.");
  for (const LogOutput* output : outputs) {
    sample(out, "spindle_log_lines_dropped_total",
           fmt::format("output=\"{}\"", escape(output->name())),
           static_cast<double>(output->dropped_lines()));
  }
  family(out, "spindle_log_bytes_pending", "gauge", "Log bytes waiting for their output.");
  for (const LogOutput* output : outputs) {
    sample(out, "spindle_log_bytes_pending", fmt::format("output=\"{}\"", escape(output->name())),
           static_cast<double>(output->pending_bytes()));
  }
  family(out, "spindle_log_lines_suppressed_total", "counter",
         "Error log lines left out: their place in the code wrote its most lines that second.");
  sample(out, "spindle_log_lines_suppressed_total", "",
         static_cast<double>(log_lines_suppressed()));
}

void Instance::retire(std::unique_ptr<http::HttpServer> server) {
  server->stop();
  auto timeout = config_.drain_timeout;
  retiring_.emplace_back([server = std::move(server), timeout]() mutable {
    if (!server->drain(Deadline::after(timeout))) {
      log_warn("{}: drain time over: closing its remaining connections",
               server->address().to_string());
    }
    server.reset();
  });
}

bool Instance::shutdown(std::chrono::milliseconds gentle) {
  draining_.store(true, std::memory_order_relaxed);
  auto deadline = Deadline::after(config_.drain_timeout);
  // The admin listener goes last: /ready says 503 (not "connection refused") while the others
  // drain.
  auto is_admin = [](const std::string& identity) { return identity.starts_with("admin "); };
  for (auto& [identity, listener] : listeners_) {
    if (!is_admin(identity)) listener.server->stop();
  }
  bool clean = true;
  for (auto& [identity, listener] : listeners_) {
    if (!is_admin(identity)) clean = listener.server->drain(deadline, gentle) && clean;
  }
  // Mirror copies still on their way get what is left of the drain time, no more.
  clean = forwarder_.finish_mirrors(deadline) && clean;
  if (!clean) {
    // Drain time is over: the requests (and mirror copies) still running are cancelled (their
    // connections close) while what they use (gateway, pools, metrics) is still there.
    runtime_.cancel_fibers();
    auto grace = Deadline::after(std::chrono::seconds(2));
    for (auto& [identity, listener] : listeners_) (void)listener.server->drain(grace);
    (void)forwarder_.finish_mirrors(grace);
  }
  for (auto& [identity, listener] : listeners_) {
    if (is_admin(identity)) (void)listener.server->drain(Deadline::after(std::chrono::seconds(1)));
  }
  for (auto& thread : retiring_) thread.join();
  retiring_.clear();
  if (gateway_) gateway_->stop_probes();
  // The logs write what waits for as long as the drain time lasts, and no longer: an output
  // that does not take it (a reader that stopped) cannot hold the exit.
  for (const auto& [path, output] : outputs_) output->finish_by(deadline.when());
  LogOutput::standard_output().finish_by(deadline.when());
  LogOutput::standard_error().finish_by(deadline.when());
  return clean;
}

}  // namespace spindle::app
