#pragma once
// What exchange.cc and http2_client.cc share (private to src/http): per-target pool state,
// connecting to an endpoint, and the HTTP/2 client session.

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "spindle/http/exchange.h"
#include "spindle/io/deadline.h"
#include "spindle/sync/semaphore.h"

namespace spindle::http::detail {

class Http2Session;

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
  /// The HTTP/2 connection, when the endpoint speaks it.
  std::shared_ptr<Http2Session> http2;
  /// The limits of the last open().
  PoolLimits limits;
  /// With max_connections: one permit per HTTP/1.1 exchange in flight; open() calls beyond
  /// them wait here (pending of them), first come, first served.
  std::unique_ptr<Semaphore> slots;
  std::size_t pending = 0;

  /// Connections open now (idle, busy, HTTP/2).
  std::size_t open_count() const;

  /// Keeps a connection for reuse (or closes it, beyond max_idle).
  void put_idle(Stream stream);
  /// The most recent idle connection that is still open, if any.
  std::optional<Stream> take_idle();
  /// Closes idle connections older than the idle timeout.
  void drop_expired(Clock::time_point now);
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

 private:
  void reset();
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

/// True for fields the client sends itself or never forwards: Host, Content-Length, and the
/// hop-by-hop fields with those `headers`' Connection field names.
bool client_managed(const NominatedFields& nominated, std::string_view name);

/// An HTTP/2 client connection: a reader and a writer fiber move the bytes; exchanges are
/// streams on it (nghttp2 queues streams beyond the peer's concurrency limit).
class Http2Session : public std::enable_shared_from_this<Http2Session> {
 public:
  /// Starts a session (and its fibers) on a connected stream.
  static std::shared_ptr<Http2Session> start(Stream stream);
  ~Http2Session();
  /// True while new streams may go on it.
  bool usable() const;
  /// Starts an exchange on a new stream.
  Result<std::unique_ptr<ClientExchange>> open(const ClientRequestHead& head,
                                               std::string_view authority,
                                               const ExchangeTimeouts& timeouts);
  /// Ends the connection; its fibers finish on their own.
  void close();

  struct Impl;

 private:
  explicit Http2Session(Stream stream);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spindle::http::detail
