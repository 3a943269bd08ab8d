#include "connect.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <openssl/ssl.h>
#include <poll.h>

#include <array>
#include <cstdlib>
#include <map>

#include "spindle/fiber/io_wait.h"
#include "spindle/fiber/worker.h"
#include "spindle/net/resolver.h"

namespace spindle::pg {
namespace {

using Params = std::vector<std::pair<std::string, std::string>>;

// Set unless the conninfo sets them: a dead TCP path is noticed on an idle connection (after
// 30 s of silence, then three probes 10 s apart) and while bytes wait for an acknowledgement
// (60 s). A connection with a call that gave up is closed sooner (Options::cancel_grace).
constexpr std::pair<const char*, const char*> kTcpDefaults[] = {
    {"keepalives", "1"},       {"keepalives_idle", "30"},     {"keepalives_interval", "10"},
    {"keepalives_count", "3"}, {"tcp_user_timeout", "60000"},
};

Error connect_error(std::string message) {
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  Error e{make_error_code(Errc::kConnectFailed), {}, std::move(message)};
  e.not_sent = true;
  return e;
}

std::vector<std::string> split(std::string_view list) {
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    std::size_t comma = list.find(',', at);
    parts.emplace_back(list.substr(at, comma - at));
    if (comma == std::string_view::npos) return parts;
    at = comma + 1;
  }
}

// A host libpq reaches without a name lookup: a socket folder (or none: the default one), or
// an IP address.
bool needs_no_lookup(const std::string& host) {
  if (host.empty() || host[0] == '/' || host[0] == '@') return true;
  unsigned char buffer[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

std::string value_of(const Params& params, std::string_view key) {
  for (const auto& [k, v] : params) {
    if (k == key) return v;
  }
  return {};
}

void set_value(Params& params, const std::string& key, std::string value) {
  for (auto& [k, v] : params) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  params.emplace_back(key, std::move(value));
}

// The hosts (the conninfo's, else PGHOST's, as libpq would take them).
std::string hosts_of(const Params& params) {
  std::string hosts = value_of(params, "host");
  if (hosts.empty()) {
    if (const char* env = std::getenv("PGHOST")) hosts = env;
  }
  return hosts;
}

// `params` with every named host replaced by its addresses (hostaddr), each kept as the host
// for TLS and passwords, in order: libpq then looks nothing up. `names` says what each name
// was found to be (libpq's messages show only the addresses).
Expected<Params> with_addresses(Params params, Resolver& resolver, Deadline deadline,
                                std::string& names) {
  std::vector<std::string> hosts = split(hosts_of(params));
  std::string port_list = value_of(params, "port");
  std::vector<std::string> ports = split(port_list);
  if (ports.size() > 1 && ports.size() != hosts.size()) return params;  // libpq says what's wrong
  std::string failure;
  std::vector<std::array<std::string, 3>> entries;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    const std::string& port = ports.size() == hosts.size() ? ports[i] : ports[0];
    if (needs_no_lookup(hosts[i])) {
      entries.push_back({hosts[i], "", port});
      continue;
    }
    auto found = resolver.resolve(hosts[i], 0, deadline);
    if (!found) {
      failure = fmt::format("could not translate host name \"{}\": {}", hosts[i],
                            found.error().message());
      continue;
    }
    names += (names.empty() ? "" : "; ") + hosts[i] + " is";
    for (const Address& a : *found) {
      entries.push_back({hosts[i], a.host_text(), port});
      names += " " + a.host_text();
    }
  }
  if (entries.empty()) return std::unexpected(connect_error(failure));
  auto joined = [&](int field) {
    std::string out;
    for (std::size_t i = 0; i < entries.size(); ++i) out += (i ? "," : "") + entries[i][field];
    return out;
  };
  set_value(params, "host", joined(0));
  set_value(params, "hostaddr", joined(1));
  if (!port_list.empty()) set_value(params, "port", joined(2));
  return params;
}

// Registers libpq's socket of now on the reactor, unless `slot` is that socket already (libpq
// opens a new socket for each address it tries, maybe under the number of the last one: the
// kernel took the closed one out of epoll, so a new registration succeeds only for a new one).
std::error_code follow_socket(PGconn* conn, IoSlot*& slot) {
  Reactor& reactor = Worker::current()->reactor();
  auto fresh = reactor.add(PQsocket(conn));
  if (!fresh) {
    if (fresh.error() == std::errc::file_exists && slot != nullptr) return {};
    return fresh.error();
  }
  if (slot != nullptr) reactor.release(slot);
  slot = *fresh;
  return {};
}

// True if the socket is ready for `events` already: no edge would come for it.
bool ready_now(PGconn* conn, short events) {
  pollfd p{PQsocket(conn), events, 0};
  return ::poll(&p, 1, 0) > 0 || (events == POLLIN && input_pending(conn));
}

// `params` once per host of its list (host, hostaddr and port each taken at that host's place),
// in order; `params` alone for one host, or lists libpq would refuse (it says what's wrong).
std::vector<Params> per_host(const Params& params) {
  std::vector<std::string> hosts = split(hosts_of(params));
  std::string addr_list = value_of(params, "hostaddr");
  std::vector<std::string> addrs = split(addr_list);
  std::vector<std::string> ports = split(value_of(params, "port"));
  std::size_t n = std::max(hosts.size(), addr_list.empty() ? 0 : addrs.size());
  if (n <= 1 || (hosts.size() != n && hosts.size() > 1) ||
      (!addr_list.empty() && addrs.size() != n) || (ports.size() > 1 && ports.size() != n)) {
    return {params};
  }
  std::vector<Params> each;
  for (std::size_t i = 0; i < n; ++i) {
    Params one = params;
    if (hosts.size() == n) set_value(one, "host", hosts[i]);
    if (!addr_list.empty()) set_value(one, "hostaddr", addrs[i]);
    if (ports.size() == n) set_value(one, "port", ports[i]);
    each.push_back(std::move(one));
  }
  return each;
}

// One libpq connect of `params` (one host, or libpq's own list) until `deadline`.
Expected<Opened> connect_once(const Params& resolved, const std::string& names, Deadline deadline) {
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : resolved) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  PGconn* conn = PQconnectStartParams(keys.data(), values.data(), /*expand_dbname=*/0);
  if (conn == nullptr) return std::unexpected(connect_error("out of memory"));
  // libpq's default writes each NOTICE to stderr on the worker's thread: a stderr that does
  // not drain would stop the worker. Notices are dropped (the statement's errors still come).
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  Opened opened{conn, nullptr};
  auto fail = [&](std::string message) -> std::unexpected<Error> {
    if (opened.slot != nullptr) Worker::current()->reactor().release(opened.slot);
    PQfinish(conn);
    Error e = connect_error(std::move(message));
    if (!names.empty()) e.message += " (" + names + ")";
    return std::unexpected(std::move(e));
  };
  // libpq's loop (PQconnectPoll's documentation): start as if it had asked to write.
  PostgresPollingStatusType status = PGRES_POLLING_WRITING;
  while (PQstatus(conn) != CONNECTION_BAD) {
    if (std::error_code ec = follow_socket(conn, opened.slot)) return fail(ec.message());
    bool reading = status == PGRES_POLLING_READING;
    if (!ready_now(conn, reading ? POLLIN : POLLOUT)) {
      std::error_code ec =
          wait_ready(*opened.slot, reading ? IoDirection::kRead : IoDirection::kWrite, deadline);
      if (ec == std::errc::timed_out) return fail("the connection was not ready by its deadline");
      if (ec) return fail("canceled while connecting");
    }
    status = PQconnectPoll(conn);
    if (status == PGRES_POLLING_OK) return opened;
    if (status == PGRES_POLLING_FAILED) break;
  }
  return fail(PQerrorMessage(conn));
}

}  // namespace

ConnectParams connect_params(const std::string& conninfo) {
  ConnectParams out;
  char* error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &error);
  if (parsed == nullptr) {
    out.invalid = error != nullptr ? connect_error(error).message : "out of memory";
    PQfreemem(error);
    return out;
  }
  std::map<std::string, std::string> set;
  for (PQconninfoOption* o = parsed; o->keyword != nullptr; ++o) {
    if (o->val != nullptr) set[o->keyword] = o->val;
  }
  PQconninfoFree(parsed);
  if (auto it = set.find("connect_timeout"); it != set.end()) {
    int seconds = std::atoi(it->second.c_str());
    if (seconds > 0) out.connect_timeout = std::chrono::seconds(std::max(seconds, 2));
  }
  for (auto [key, value] : kTcpDefaults) set.try_emplace(key, value);
  // The conninfo's own options come after spindle's: where they set the same, the session
  // reports it and the connection sets spindle's again (kSessionSettingsSql); what it does not
  // report (extra_float_digits) is set again whenever the conninfo has options of its own.
  std::string& options = set["options"];
  out.own_options = !options.empty();
  options = options.empty() ? kSessionOptions : std::string(kSessionOptions) + " " + options;
  out.params.assign(set.begin(), set.end());
  if (!set.contains("hostaddr")) {
    for (const std::string& host : split(hosts_of(out.params))) {
      if (!needs_no_lookup(host)) out.names_hosts = true;
    }
  }
  return out;
}

Expected<Opened> connect(const ConnectParams& params, Resolver& resolver, Deadline deadline) {
  if (!params.invalid.empty()) return std::unexpected(connect_error(params.invalid));
  Params resolved = params.params;
  std::string names;
  if (params.names_hosts) {
    auto found = with_addresses(params.params, resolver, deadline, names);
    if (!found) return std::unexpected(found.error());
    resolved = std::move(*found);
  }
  // Each host in turn, with an equal share of the time left (as libpq 16's connect_timeout is
  // per host): a host that accepts and never answers does not hide the ones after it.
  std::vector<Params> hosts = per_host(resolved);
  std::string failures;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    Deadline share = deadline;
    if (deadline.is_finite() && i + 1 < hosts.size()) {
      auto left = deadline.when() - Clock::now();
      share = Deadline::at(Clock::now() + left / static_cast<int>(hosts.size() - i));
    }
    auto opened = connect_once(hosts[i], names, share);
    if (opened || hosts.size() == 1) return opened;
    failures += (failures.empty() ? "" : "; ") + opened.error().message;
    if (deadline.expired()) break;
  }
  return std::unexpected(connect_error(failures));
}

bool session_settings_in_force(const PGconn* conn) {
  const char* date_style = PQparameterStatus(conn, "DateStyle");
  const char* time_zone = PQparameterStatus(conn, "TimeZone");
  return date_style != nullptr && std::string_view(date_style).starts_with("ISO") &&
         time_zone != nullptr && std::string_view(time_zone) == "UTC";
}

bool input_pending(PGconn* conn) {
  pollfd p{PQsocket(conn), POLLIN, 0};
  if (::poll(&p, 1, 0) > 0) return true;
  auto* ssl = static_cast<SSL*>(PQsslStruct(conn, "OpenSSL"));
  return ssl != nullptr && SSL_pending(ssl) > 0;
}

}  // namespace spindle::pg
