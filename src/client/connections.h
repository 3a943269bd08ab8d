#pragma once
// What the client keeps per endpoint on each worker (private to src/client): the connections
// to one target (idle HTTP/1.1 ones, the count of busy ones, the HTTP/2 sessions), the permits
// of max_connections, and how a connection is made and watched while idle. Below both
// exchanges (http1_exchange.h, http2_client.h) and the pools of exchange.cc above them.

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "spindle/client/exchange.h"
#include "spindle/h1/parser.h"
#include "spindle/io/deadline.h"
#include "spindle/sync/event.h"
#include "spindle/sync/semaphore.h"

namespace spindle::http::detail {

class Http2Session;

/// The limits of an upstream's response head (and trailers), whichever protocol brings it:
/// the same as of a request head at the server (ParserLimits: bytes, counted as name + value
/// + 32 a field on HTTP/2, and fields).
inline constexpr ParserLimits kResponseHeadLimits{};

/// An exchange that holds one of a target's permits, seen while its caller is away from it:
/// between its calls (relaying what it read to a client, waiting for the client's next body
/// piece). While requests wait for a permit, the one away longest past
/// PoolLimits::preempt_stalled gives its permit up (preempt()): a client that takes nothing
/// must not keep the target from everyone else.
class PermitHolder {
 public:
  /// Gives the permit back now (and the connection: to the pool if the exchange is complete,
  /// else closed); the exchange's next call fails with kPreempted.
  virtual void preempt() = 0;

 protected:
  ~PermitHolder() = default;

 private:
  friend struct TargetState;
  /// While in the target's list of holders away: since when, and the neighbours.
  Clock::time_point away_since_{};
  PermitHolder* prev_ = nullptr;
  PermitHolder* next_ = nullptr;
  bool away_ = false;
};

/// The connections of one worker to one endpoint.
struct TargetState {
  struct Idle {
    Stream stream;
    Clock::time_point since;
  };
  /// Idle HTTP/1.1 connections, the most recently used last.
  std::vector<Idle> idle;
  /// HTTP/1.1 connections carrying an exchange now.
  std::size_t connections = 0;
  /// The HTTP/2 connections, when the endpoint speaks it: streams go on the first with room
  /// for one more; another is opened when each is at the peer's
  /// SETTINGS_MAX_CONCURRENT_STREAMS (up to max_connections).
  std::vector<std::shared_ptr<Http2Session>> http2;
  /// An HTTP/2 connection being made: who finds the others full meanwhile waits for it, as
  /// long as it is expected to have room for them (the streams the server allowed the last
  /// connection, counting the request that makes it); beyond that another is made.
  struct Http2Connect {
    Event made;
    std::size_t capacity = 0;
    std::size_t waiting = 1;
  };
  std::vector<std::shared_ptr<Http2Connect>> http2_connects;
  /// When the HTTP/2 connections are next looked over for the idle ones to close (exchange.cc,
  /// http2_with_room): a second after the last time, or the idle timeout if it is shorter.
  Clock::time_point http2_sweep_due{};
  /// The limits of the last open().
  PoolLimits limits;
  /// No configuration in force names the endpoint any more (UpstreamConnections::retain): its
  /// connections close once their exchanges end, none is kept idle.
  bool retired = false;
  /// With max_connections: one permit per HTTP/1.1 exchange in flight; open() calls beyond
  /// them wait here (pending of them), first come, first served.
  std::unique_ptr<Semaphore> slots;
  std::size_t pending = 0;
  /// The exchanges holding a permit whose callers are away from them, the longest away
  /// first.
  PermitHolder* away_first = nullptr;
  PermitHolder* away_last = nullptr;

  /// Notes that `holder`'s caller left it at `since` (at the end of the list: `since` is never
  /// earlier than the others', all being taken from the worker's poll time).
  void went_away(PermitHolder& holder, Clock::time_point since);
  /// Notes that `holder`'s caller is back (or that it ended); nothing if it was not away.
  void came_back(PermitHolder& holder);
  /// When the holder away longest (away_first) left, or nothing.
  std::optional<Clock::time_point> first_away() const {
    if (away_first == nullptr) return std::nullopt;
    return away_first->away_since_;
  }

  /// Connections open now (idle, busy, HTTP/2).
  std::size_t open_count() const;

  /// Keeps a connection for reuse (or closes it, beyond max_idle).
  void put_idle(Stream stream);
  /// The most recent idle connection that is still open, if any.
  std::optional<Stream> take_idle();
  /// Closes idle connections older than the idle timeout.
  void drop_expired(Clock::time_point now);
  /// Closes the idle connections and marks it retired: the busy ones close when their
  /// exchanges end (HTTP/2: after the last stream).
  void retire();
};

/// One of a target's max_connections permits, given back when it goes.
class Permit {
 public:
  Permit() = default;
  explicit Permit(std::shared_ptr<TargetState> target) : target_(std::move(target)) {}
  Permit(Permit&&) noexcept = default;
  Permit& operator=(Permit&& other) noexcept {
    reset();
    target_ = std::move(other.target_);
    return *this;
  }
  ~Permit() { reset(); }

  /// True while it holds a permit.
  bool held() const { return target_ != nullptr; }
  /// Gives the permit back (to the first request waiting for one, if any).
  void reset();

 private:
  std::shared_ptr<TargetState> target_;
};

/// Watches an idle connection: anything that arrives on it (the peer's close, or bytes
/// unasked) is noted by the reactor, at no cost while nothing does.
void watch_idle(Stream& stream);
/// True if nothing has arrived on a watched idle connection: the peer has not closed it, nor
/// sent anything unasked (which would make the next response ambiguous). Stops watching.
bool stream_looks_alive(Stream& stream);

/// Connects (and for TLS, handshakes) to `endpoint` by `deadline`; the protocol ALPN chose goes
/// to `alpn_out` (valid while the stream lives). Errors are ExchangeErrc connect failures.
Result<Stream> connect_endpoint(const Endpoint& endpoint, Deadline deadline,
                                std::string_view* alpn_out);

}  // namespace spindle::http::detail
