// Client exchanges by endpoint: the per-worker pools, which open each exchange on a connection
// of the endpoint's (connections.h) as an HTTP/1.1 exchange (http1_exchange.cc) or a stream of
// its HTTP/2 session (http2_client.cc), and the exchange errors.
#include "spindle/client/exchange.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "connections.h"
#include "http1_exchange.h"
#include "http2_client.h"
#include "spindle/fiber/worker.h"
#include "spindle/http/rules.h"
#include "spindle/sync/wait_group.h"

namespace spindle::http {
namespace {

class ExchangeCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "upstream exchange"; }
  std::string message(int value) const override {
    switch (static_cast<ExchangeErrc>(value)) {
      case ExchangeErrc::kRefused:
        return "connection refused";
      case ExchangeErrc::kConnectTimeout:
        return "connect timed out";
      case ExchangeErrc::kTlsFailed:
        return "TLS handshake failed";
      case ExchangeErrc::kConnectFailed:
        return "cannot connect";
      case ExchangeErrc::kClosedBeforeWrite:
        return "connection closed before the request was written";
      case ExchangeErrc::kClosedBeforeResponse:
        return "connection closed before any response byte";
      case ExchangeErrc::kRefusedStream:
        return "stream refused (REFUSED_STREAM)";
      case ExchangeErrc::kAboveGoaway:
        return "stream above GOAWAY's last id";
      case ExchangeErrc::kFirstByteTimeout:
        return "no response within the first-byte timeout";
      case ExchangeErrc::kReadTimeout:
        return "response stalled past the read timeout";
      case ExchangeErrc::kWriteTimeout:
        return "request not taken within the write timeout";
      case ExchangeErrc::kProtocolError:
        return "malformed response";
      case ExchangeErrc::kResponseCut:
        return "response cut short";
      case ExchangeErrc::kCancelled:
        return "cancelled";
      case ExchangeErrc::kNoCapacity:
        return "connection limit reached";
      case ExchangeErrc::kPreempted:
        return "gave its connection to a waiting request (the client took nothing meanwhile)";
      case ExchangeErrc::kAnsweredEarly:
        return "answered before taking the whole request body, which it wants no more of";
      case ExchangeErrc::kHeadTooLarge:
        return "request head larger than the upstream takes (SETTINGS_MAX_HEADER_LIST_SIZE)";
      case ExchangeErrc::kNoExtendedConnect:
        return "the upstream does not allow extended CONNECT (no SETTINGS_ENABLE_CONNECT_PROTOCOL)";
    }
    return "unknown exchange error";
  }
  // Each code also compares equal to the generic condition it is a case of, so that callers
  // that only care about "timed out" or "refused" can ask that.
  std::error_condition default_error_condition(int value) const noexcept override {
    switch (static_cast<ExchangeErrc>(value)) {
      case ExchangeErrc::kRefused:
        return std::errc::connection_refused;
      case ExchangeErrc::kConnectTimeout:
      case ExchangeErrc::kFirstByteTimeout:
      case ExchangeErrc::kReadTimeout:
      case ExchangeErrc::kWriteTimeout:
        return std::errc::timed_out;
      case ExchangeErrc::kClosedBeforeWrite:
      case ExchangeErrc::kClosedBeforeResponse:
      case ExchangeErrc::kResponseCut:
        return std::errc::connection_reset;
      case ExchangeErrc::kProtocolError:
        return std::errc::protocol_error;
      case ExchangeErrc::kCancelled:
        return std::errc::operation_canceled;
      case ExchangeErrc::kNoCapacity:
        return std::errc::resource_unavailable_try_again;
      case ExchangeErrc::kNoExtendedConnect:
        return std::errc::operation_not_supported;
      default:
        return {value, *this};
    }
  }
};

}  // namespace

const std::error_category& exchange_category() {
  static const ExchangeCategory category;
  return category;
}

bool nothing_reached_upstream(std::error_code ec) {
  if (ec.category() == tls_category()) return true;  // the handshake failed
  if (ec.category() != exchange_category()) return false;
  switch (static_cast<ExchangeErrc>(ec.value())) {
    case ExchangeErrc::kRefused:
    case ExchangeErrc::kConnectTimeout:
    case ExchangeErrc::kTlsFailed:
    case ExchangeErrc::kConnectFailed:
    case ExchangeErrc::kClosedBeforeWrite:
    case ExchangeErrc::kRefusedStream:
    case ExchangeErrc::kAboveGoaway:
    case ExchangeErrc::kNoCapacity:
    case ExchangeErrc::kNoExtendedConnect:
      return true;
    default:
      return false;
  }
}

bool resend_turned_away(std::error_code ec, unsigned& turned_away) {
  constexpr unsigned kMaxResends = 3;
  if (ec != ExchangeErrc::kAboveGoaway || turned_away == kMaxResends) return false;
  ++turned_away;
  return true;
}

bool is_connect_failure(std::error_code ec) {
  return ec.category() == tls_category() || ec == ExchangeErrc::kRefused ||
         ec == ExchangeErrc::kConnectTimeout || ec == ExchangeErrc::kTlsFailed ||
         ec == ExchangeErrc::kConnectFailed;
}

const std::string& Endpoint::key() const {
  if (key_.empty()) {
    const char* proto = protocol == WireProtocol::kHttp1   ? "h1"
                        : protocol == WireProtocol::kHttp2 ? "h2"
                                                           : "h2c";
    // TLS settings by content, not by context: a reload's new context of the same settings
    // keeps the connections (and the health) of the one before.
    key_ = fmt::format("{}|{}|{}|{}", address.to_string(), proto, server_name,
                       tls ? std::string_view(tls->identity()) : std::string_view("plain"));
  }
  return key_;
}

using detail::Permit;
using detail::TargetState;

// ---- pools ------------------------------------------------------------------------------------

namespace {
/// Forgets the HTTP/2 connections of `target` no stream can go on any more, and closes those
/// but the first that had none open for the idle timeout (made for a burst: streams go on the
/// first with room, so the last ones fall idle when the load drops); the first of the others
/// with room for one more stream, or nullptr.
///
/// Looking every connection over costs a request a visit to each (dozens, with thousands of
/// streams in flight): between two looks (see http2_sweep_due) the first with room is taken as
/// it is found, so an idle connection is closed, and one no longer usable forgotten, up to a
/// second late.
detail::Http2Session* http2_with_room(TargetState& target) {
  if (target.http2.empty()) return nullptr;  // (an HTTP/1.1 target's wait: no clock read)
  const Clock::time_point now = coarse_now();
  if (now < target.http2_sweep_due) {
    for (const auto& session : target.http2) {
      if (session->has_room()) return session.get();
    }
  }
  target.http2_sweep_due =
      now + std::min<Clock::duration>(std::chrono::seconds(1), target.limits.idle_timeout);
  std::erase_if(target.http2, [](const auto& session) { return !session->usable(); });
  if (target.http2.size() > 1) {
    const Clock::time_point idle_before = now - target.limits.idle_timeout;
    auto idle =
        std::remove_if(target.http2.begin() + 1, target.http2.end(), [&](const auto& session) {
          if (session->idle_since() >= idle_before) return false;
          session->close();
          return true;
        });
    target.http2.erase(idle, target.http2.end());
  }
  for (const auto& session : target.http2) {
    if (session->has_room()) return session.get();
  }
  return nullptr;
}

/// Waits for one of `target`'s permits until `deadline`. Meanwhile an exchange whose caller
/// has been away from it for limits.preempt_stalled gives its permit up, the longest away
/// first (to the first request waiting: first come, first served still).
std::error_code wait_for_permit(TargetState& target, const PoolLimits& limits, Deadline deadline) {
  const Clock::duration grace = limits.preempt_stalled;
  if (grace <= Clock::duration::zero()) return target.slots->acquire(deadline);
  for (;;) {
    Clock::time_point now = Clock::now();  // (a waiting request: no hurry for the clock)
    if (auto since = target.first_away(); since && *since <= now - grace) {
      target.away_first->preempt();
    }
    // Wake when the holder away longest (or one leaving now) has been away long enough; if
    // one is due already, after a millisecond (the permit just given up goes to the first
    // request waiting, which may not be this one): never a turn without parking.
    Clock::time_point check =
        std::max(target.first_away().value_or(now) + grace, now + std::chrono::milliseconds(1));
    std::error_code waited =
        target.slots->acquire(check < deadline.when() ? Deadline::at(check) : deadline);
    if (waited != std::errc::timed_out || deadline.expired()) return waited;
  }
}
}  // namespace

struct UpstreamConnections::Pool {
  std::unordered_map<std::string, std::shared_ptr<TargetState>> targets;
  /// The keys of the endpoints in force (retain), or every key before the first retain.
  std::optional<std::unordered_set<std::string>> in_force;

  /// The state of `key`'s endpoint, made on first use (retired at once if not in force).
  const std::shared_ptr<TargetState>& target(const std::string& key) {
    auto& slot = targets[key];
    if (!slot) {
      slot = std::make_shared<TargetState>();
      slot->retired = in_force && !in_force->contains(key);
    }
    return slot;
  }

  ~Pool() {
    for (auto& [key, target] : targets) {
      for (auto& session : target->http2) session->close();
    }
  }
};

UpstreamConnections::UpstreamConnections(Runtime& runtime)
    : runtime_(runtime), pools_(runtime.size()) {}

UpstreamConnections::~UpstreamConnections() {
  // Each pool holds sockets of its worker: it is closed there.
  WaitGroup closed;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    if (!pools_[i]) continue;
    closed.add();
    runtime_.worker(i).post([this, i, &closed] {
      pools_[i].reset();
      closed.done();
    });
  }
  (void)closed.wait();
}

void UpstreamConnections::retain(std::unordered_set<std::string> kept) {
  WaitGroup done;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    done.add();
    runtime_.worker(i).post([this, &kept, &done] {
      Pool& p = pool();
      // A retired state stays retired: an endpoint back in force (a late request of an older
      // snapshot made it while it was not) starts again from a fresh one, which keeps its
      // connections.
      std::erase_if(p.targets, [&](auto& entry) {
        if (kept.contains(entry.first) && !entry.second->retired) return false;
        entry.second->retire();  // exchanges under way keep it until they end
        return true;
      });
      p.in_force = kept;
      done.done();
    });
  }
  (void)done.wait(Deadline::never(), kNotCancellable);
}

UpstreamConnections::Pool& UpstreamConnections::pool() {
  Worker* worker = Worker::current();
  auto& slot = pools_.at(worker->index());
  if (!slot) slot = std::make_unique<Pool>();
  return *slot;
}

const TargetState* UpstreamConnections::target_if_any(const Endpoint& endpoint) const {
  Worker* worker = Worker::current();
  const Pool* p = worker == nullptr ? nullptr : pools_.at(worker->index()).get();
  if (p == nullptr) return nullptr;
  auto it = p->targets.find(endpoint.key());
  return it == p->targets.end() ? nullptr : it->second.get();
}

std::size_t UpstreamConnections::idle(const Endpoint& endpoint) const {
  const TargetState* t = target_if_any(endpoint);
  return t == nullptr ? 0 : t->idle.size();
}

std::size_t UpstreamConnections::open_connections(const Endpoint& endpoint) const {
  const TargetState* t = target_if_any(endpoint);
  if (t == nullptr) return 0;
  return t->connections + t->idle.size() +
         std::ranges::count_if(t->http2, [](const auto& session) { return session->usable(); });
}

std::size_t UpstreamConnections::waiting(const Endpoint& endpoint) const {
  const TargetState* t = target_if_any(endpoint);
  return t == nullptr ? 0 : t->pending;
}

namespace {

using ExchangeResult = Result<std::unique_ptr<ClientExchange>>;

/// True if `head` may go on the wire: a method, a target, and fields that are all valid.
bool is_sendable(const ClientRequestHead& head) {
  if (!is_method(head.method) || !is_request_target(head.target)) return false;
  for (const Field& f : head.headers) {
    // (A name with a token is one of the token table's, in some case: a valid name.)
    if ((f.token == nullptr && !is_field_name(f.name)) || !is_field_value(f.value)) return false;
  }
  return true;
}

/// True if `target` may not have another HTTP/2 connection: it has max_connections, or its
/// server allows no stream now (SETTINGS_MAX_CONCURRENT_STREAMS 0), which it would allow on
/// no other connection either (the request waits on the newest).
bool at_http2_limit(const TargetState& target, const PoolLimits& limits) {
  return (limits.max_connections != 0 &&
          target.http2.size() + target.http2_connects.size() >= limits.max_connections) ||
         (!target.http2.empty() && target.http2.back()->max_concurrent() == 0);
}

/// HTTP/2: a stream on a connection with room for one more. When each is full, the request
/// waits for a connection being made that is expected to have room for it, or else makes
/// one more, up to max_connections (so a burst makes as many at once as it needs, and each
/// wakes only the requests it can take); beyond them it waits for a stream of the newest
/// connection to end (its queue wakes one waiter per stream that ends). Returns the stream
/// (or the error that ends the request), or nullopt with `connect` set: this request makes
/// the next connection.
std::optional<ExchangeResult> open_http2_stream(
    TargetState& target, const PoolLimits& limits, const ClientRequestHead& head,
    std::string_view authority, const ExchangeTimeouts& timeouts,
    std::shared_ptr<TargetState::Http2Connect>& connect) {
  for (;;) {
    if (detail::Http2Session* session = http2_with_room(target)) {
      return session->open(head, authority, timeouts);
    }
    auto& connects = target.http2_connects;
    auto with_room =
        std::ranges::find_if(connects, [](const auto& c) { return c->waiting < c->capacity; });
    if (with_room == connects.end() && !at_http2_limit(target, limits)) {
      connect = std::make_shared<TargetState::Http2Connect>();
      connect->capacity = target.http2.empty() ? 100 : target.http2.back()->max_concurrent();
      connects.push_back(connect);
      return std::nullopt;
    }
    if (with_room == connects.end() && !target.http2.empty()) {
      return target.http2.back()->open(head, authority, timeouts);
    }
    std::shared_ptr<TargetState::Http2Connect> awaited =
        with_room != connects.end() ? *with_room : connects.front();
    ++awaited->waiting;
    std::error_code waited = awaited->made.wait(Deadline::after(timeouts.connect));
    --awaited->waiting;
    if (waited) return fail(make_error_code(ExchangeErrc::kNoCapacity));
  }
}

/// Says when the connection a request set out to make (open_http2_stream) is made, or not.
struct ConnectDone {
  TargetState& target;
  const std::shared_ptr<TargetState::Http2Connect>& connect;
  ~ConnectDone() {
    if (!connect) return;
    std::erase(target.http2_connects, connect);
    connect->made.set();
  }
};

/// An HTTP/1.1 exchange holds one of the target's max_connections permits from here to its
/// end: beyond them a request waits its turn (first come, first served), within the connect
/// timeout and as one of at most max_pending. Takes one into `permit` and returns nullopt;
/// else the error that ends the request, or a stream if the endpoint turned out to speak
/// HTTP/2 while the request waited.
std::optional<ExchangeResult> take_permit(const std::shared_ptr<TargetState>& target,
                                          const PoolLimits& limits, const ClientRequestHead& head,
                                          std::string_view authority,
                                          const ExchangeTimeouts& timeouts, Permit& permit) {
  if (!target->slots) target->slots = std::make_unique<Semaphore>(limits.max_connections);
  if (!target->slots->try_acquire()) {
    if (limits.max_pending != 0 && target->pending >= limits.max_pending) {
      return fail(make_error_code(ExchangeErrc::kNoCapacity));
    }
    ++target->pending;
    std::error_code waited =
        wait_for_permit(*target, limits, Deadline::after_coarse(timeouts.connect));
    --target->pending;
    if (waited) return fail(make_error_code(ExchangeErrc::kNoCapacity));
    if (detail::Http2Session* session = http2_with_room(*target)) {
      target->slots->release();  // the endpoint turned out to speak HTTP/2 meanwhile
      return session->open(head, authority, timeouts);
    }
  }
  permit = Permit(target);
  return std::nullopt;
}

/// Starts an HTTP/2 session on the new connection `stream` and opens the request's stream.
ExchangeResult open_on_new_session(TargetState& target, Stream stream,
                                   const ClientRequestHead& head, std::string_view authority,
                                   const ExchangeTimeouts& timeouts,
                                   std::chrono::microseconds took) {
  auto session = detail::Http2Session::start(std::move(stream));
  // Until its SETTINGS come, the server is taken to allow what it told the others.
  if (!target.http2.empty()) session->assume_max_concurrent(target.http2.back()->max_concurrent());
  target.http2.push_back(session);
  auto exchange = session->open(head, authority, timeouts);
  // An endpoint no configuration names (a request of the one before, or a reload that dropped
  // it while this connected): the connection ends after the streams on it. Retired only once
  // the request that made it has its stream: with none open it would end at once, before the
  // request went out (and so would every retry's).
  if (target.retired) session->retire();
  if (exchange) (*exchange)->set_connect_time(took);
  return exchange;
}

/// Connects to `endpoint` and starts the exchange on the new connection: HTTP/2 if the
/// endpoint speaks it (by configuration or ALPN), else HTTP/1.1 under `permit`.
ExchangeResult connect_and_open(const Endpoint& endpoint,
                                const std::shared_ptr<TargetState>& target, bool speaks_http2,
                                const ClientRequestHead& head, std::string_view authority,
                                const ExchangeTimeouts& timeouts, Permit permit) {
  auto started = Clock::now();
  std::string_view alpn;
  auto stream = detail::connect_endpoint(endpoint, Deadline::after(timeouts.connect), &alpn);
  if (!stream) return fail(stream.error());
  auto took = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started);
  bool http2 = endpoint.protocol == WireProtocol::kH2c || (endpoint.tls && alpn == "h2");
  if (endpoint.protocol == WireProtocol::kHttp2 && !http2) {
    return fail(make_error_code(ExchangeErrc::kTlsFailed));  // the upstream would not speak h2
  }
  if (!http2) {
    auto exchange = detail::start_http1_exchange(target, std::move(*stream), false, head, authority,
                                                 timeouts, std::move(permit));
    exchange->set_connect_time(took);
    return exchange;
  }
  // (Learning by ALPN that the endpoint speaks HTTP/2, several fibers may have connected at
  // once: the first connection with room is used, and this one kept only if none has.)
  if (!speaks_http2) {
    if (detail::Http2Session* session = http2_with_room(*target)) {
      return session->open(head, authority, timeouts);
    }
  }
  permit = {};  // streams on one connection: no HTTP/1.1 permit needed
  return open_on_new_session(*target, std::move(*stream), head, authority, timeouts, took);
}

}  // namespace

Result<std::unique_ptr<ClientExchange>> UpstreamConnections::open(
    const Endpoint& endpoint, const ClientRequestHead& head, std::string_view authority,
    const ExchangeTimeouts& timeouts, const PoolLimits& limits, bool fresh) {
  if (Worker::current() == nullptr) return fail(std::errc::operation_not_permitted);
  if (!is_sendable(head)) return fail(std::errc::invalid_argument);
  // An extended CONNECT is HTTP/2's alone: over HTTP/1.1 it is the caller's GET with Upgrade.
  if (!head.protocol.empty() && endpoint.protocol == WireProtocol::kHttp1) {
    return fail(std::errc::invalid_argument);
  }
  std::shared_ptr<TargetState> target = pool().target(endpoint.key());
  target->limits = limits;
  const bool speaks_http2 = endpoint.protocol != WireProtocol::kHttp1 || !target->http2.empty();
  std::shared_ptr<TargetState::Http2Connect> connect;
  if (speaks_http2) {
    auto answered = open_http2_stream(*target, limits, head, authority, timeouts, connect);
    if (answered) return std::move(*answered);
  }
  ConnectDone connect_done{*target, connect};
  Permit permit;
  if (limits.max_connections != 0) {
    auto answered = take_permit(target, limits, head, authority, timeouts, permit);
    if (answered) return std::move(*answered);
  }
  if (endpoint.protocol == WireProtocol::kHttp1 && !fresh) {
    if (auto stream = target->take_idle()) {
      return detail::start_http1_exchange(target, std::move(*stream), true, head, authority,
                                          timeouts, std::move(permit));
    }
  }
  return connect_and_open(endpoint, target, speaks_http2, head, authority, timeouts,
                          std::move(permit));
}

}  // namespace spindle::http
