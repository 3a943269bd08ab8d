#pragma once
/// Client exchanges addressed by endpoint: one request and its response, streamed both ways,
/// over a connection taken from a per-worker pool. What a reverse proxy needs underneath:
///
///   auto ex = pools.open(endpoint, head, authority, timeouts);   // connect or reuse
///   ex->write(piece) ... ex->finish();                           // request body, backpressure
///   auto response = ex->read_head();                             // final head, 1xx skipped
///   while ((n = ex->read(buffer)) > 0) ...                       // response body
///
/// Errors are ExchangeErrc codes, each saying what happened and whether anything can have
/// reached the upstream (nothing_reached_upstream()), which is what decides a retry. A body
/// cut short is an error, never a short body.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>

#include "spindle/base/error.h"
#include "spindle/fiber/runtime.h"
#include "spindle/h1/parser.h"
#include "spindle/http/header_map.h"
#include "spindle/net/address.h"
#include "spindle/net/stream.h"
#include "spindle/net/tls.h"

namespace spindle::http {

namespace detail {
struct TargetState;
}  // namespace detail

/// Why an exchange failed (category "upstream exchange").
enum class ExchangeErrc {
  /// The connection was refused (or the host unreachable).
  kRefused = 1,
  /// Connecting (TCP and TLS handshake) took longer than the connect timeout.
  kConnectTimeout,
  /// The TLS handshake gave no usable protocol (h2 asked, not agreed). A handshake that fails
  /// outright (a certificate that does not verify, a wrong name) is the TLS layer's own error
  /// (tls_category), which says why; both count as connect failures.
  kTlsFailed,
  /// Any other failure to connect.
  kConnectFailed,
  /// A pooled connection was closed or reset before any byte of this request was written.
  kClosedBeforeWrite,
  /// The connection closed or reset after request bytes were written, before any response
  /// byte: the upstream may have seen the request.
  kClosedBeforeResponse,
  /// HTTP/2: the upstream refused the stream (REFUSED_STREAM): it did not process it.
  kRefusedStream,
  /// HTTP/2: the stream's id was above the last one GOAWAY promised to process.
  kAboveGoaway,
  /// No response byte within the first-byte timeout.
  kFirstByteTimeout,
  /// The response stalled for longer than the read timeout.
  kReadTimeout,
  /// The upstream did not take the request body within the write timeout.
  kWriteTimeout,
  /// The response is malformed.
  kProtocolError,
  /// The response body ended before its framing said it would (or was reset mid-body).
  kResponseCut,
  /// The exchange was cancelled (the client went away).
  kCancelled,
  /// The upstream has no room for another request (connection limit reached).
  kNoCapacity,
  /// The exchange gave its connection to a request waiting for one: its caller had left it
  /// for longer than PoolLimits::preempt_stalled (a client that took nothing of the answer,
  /// or sent nothing of its body, meanwhile).
  kPreempted,
  /// HTTP/2: the upstream answered in full, then ended the stream (RST_STREAM after the
  /// answer's END_STREAM, RFC 9113 8.1) before taking the whole request body: the rest is
  /// not wanted. Its answer stands (read_head has it).
  kAnsweredEarly,
  /// HTTP/2: the request's head is larger than the upstream takes (its
  /// SETTINGS_MAX_HEADER_LIST_SIZE): it was not sent. The client's request, not the target's
  /// failure.
  kHeadTooLarge,
  /// HTTP/2: an extended CONNECT (RFC 8441) to a server that did not announce
  /// SETTINGS_ENABLE_CONNECT_PROTOCOL in its SETTINGS: nothing was sent.
  kNoExtendedConnect,
};

/// The category of ExchangeErrc codes.
const std::error_category& exchange_category();
/// Makes an ExchangeErrc into a std::error_code.
inline std::error_code make_error_code(ExchangeErrc e) {
  return {static_cast<int>(e), exchange_category()};
}
/// True if the failure proves that the upstream cannot have seen the request: it may be sent
/// again, to any target, whatever its method.
bool nothing_reached_upstream(std::error_code ec);
/// True (and counted in `turned_away`) when a request that failed with `ec` is to be sent
/// again to the same server on another connection, before and outside any retry rule: an
/// HTTP/2 server closing a connection gracefully (GOAWAY: nginx after keepalive_requests, any
/// server on reload) turned its stream away unprocessed. At most a few times a request, lest a
/// server that does so to every stream hold it forever. The caller must still have the whole
/// body to send.
bool resend_turned_away(std::error_code ec, unsigned& turned_away);
/// True for the failures of connecting (refused, timed out, TLS, other).
bool is_connect_failure(std::error_code ec);

/// How an endpoint speaks.
enum class WireProtocol {
  kHttp1,  ///< HTTP/1.1, over TCP or TLS
  kHttp2,  ///< HTTP/2 over TLS (ALPN h2)
  kH2c,    ///< HTTP/2 over TCP, prior knowledge
};

/// Where an exchange goes: an upstream target.
struct Endpoint {
  /// The resolved address.
  Address address = Address::loopback_v4(0);
  /// The protocol spoken.
  WireProtocol protocol = WireProtocol::kHttp1;
  /// TLS settings (non-null: TLS; verification on unless the context says insecure). For
  /// kHttp2 the context must offer "h2" by ALPN.
  std::shared_ptr<const TlsClientContext> tls;
  /// The name sent as SNI and verified against the certificate.
  std::string server_name;

  /// The pool key: connections are shared only between identical endpoints: address,
  /// protocol, server name and TLS settings by content (TlsClientContext::identity), so that
  /// an endpoint made again with the same settings (a reload) finds the connections of the
  /// one before. Made on the first call and kept (set the fields before): open() looks it up
  /// on every request.
  const std::string& key() const;

 private:
  mutable std::string key_;
};

/// Time limits of one exchange.
struct ExchangeTimeouts {
  /// TCP connect and TLS handshake.
  std::chrono::milliseconds connect{5'000};
  /// From the end of the request head to the first byte of the response.
  std::chrono::milliseconds first_byte{60'000};
  /// Between two reads of the response.
  std::chrono::milliseconds read{60'000};
  /// For each write of the request.
  std::chrono::milliseconds write{60'000};
};

/// Limits of the connections to one endpoint, per worker.
struct PoolLimits {
  /// Idle HTTP/1.1 connections kept.
  std::size_t max_idle = 64;
  /// How long an idle connection is kept.
  std::chrono::milliseconds idle_timeout{30'000};
  /// Most HTTP/1.1 exchanges in flight at once (0: no limit). Beyond it open() waits its turn
  /// (first come, first served) up to the connect timeout, then fails with kNoCapacity.
  std::size_t max_connections = 0;
  /// Most open() calls waiting their turn at once (0: no limit); more fail with kNoCapacity.
  std::size_t max_pending = 0;
  /// With max_connections: while an open() call waits its turn, an exchange whose caller has
  /// been away from it this long (between its calls: relaying to a client that takes nothing,
  /// or waiting for a client's next body piece) gives its connection up, the longest away
  /// first; its next call fails with kPreempted (0: never).
  std::chrono::milliseconds preempt_stalled{0};
};

/// A response head received from an upstream. Its views stay valid as long as the exchange.
struct ClientResponseHead {
  int status = 0;
  /// 10, 11 or 20.
  int version = 11;
  HeaderMap headers;
  /// The body's length, when its framing gives it (Content-Length on HTTP/1.1 and HTTP/2).
  std::optional<std::uint64_t> content_length;
  /// True when the response has no body at all (HEAD, 204, 304).
  bool no_body = false;
};

/// A request to send, as the server's parser would have produced it: method, target, fields,
/// and its body's framing (content_length set, or chunked for a body of unknown length, or
/// neither for no body). With `protocol` set (and method CONNECT, target a path), an HTTP/2
/// extended CONNECT (RFC 8441): the stream then carries a tunnel, not a body; it fails with
/// kNoExtendedConnect, having sent nothing, where the server does not allow one (HTTP/1.1
/// endpoints do not take it). Views must stay valid while the exchange runs.
using ClientRequestHead = RequestHead;

/// One request/response in progress. Not shared between fibers, but cancel() may be called
/// from another fiber of the same worker.
class ClientExchange {
 public:
  virtual ~ClientExchange() = default;

  /// Sends a piece of the request body, waiting while the upstream does not take more.
  virtual Result<void> write(std::string_view data) = 0;
  /// Ends the request (its head goes out now if no body did), with trailer fields if given
  /// (chunked HTTP/1.1 and HTTP/2 only; ignored otherwise).
  virtual Result<void> finish(const HeaderMap* trailers = nullptr) = 0;
  /// Waits for the final response head (101 is final; interim 1xx heads go to the
  /// on_informational callback, if any, and are otherwise skipped). Valid until the exchange
  /// ends.
  virtual Result<const ClientResponseHead*> read_head() = 0;
  /// For a request whose head carries `Expect: 100-continue`: sends the head if it has not
  /// gone, then waits up to `wait` for the upstream's word. True when it said 100 Continue or
  /// kept silent for `wait` (RFC 9110 10.1.1: send the body then); false when its final answer
  /// came instead (read_head() returns it: send no body). HTTP/2: true at once.
  virtual Result<bool> await_continue(std::chrono::milliseconds wait) {
    (void)wait;
    return true;
  }
  /// Calls `callback` with each interim response (1xx but 100 and 101) as read_head() or
  /// await_continue() meets it, on the calling fiber: 103 Early Hints, say.
  void on_informational(std::function<void(const ClientResponseHead&)> callback) {
    informational_ = std::move(callback);
  }
  /// Reads response body bytes: a count, 0 at the end (the body was complete), or an error
  /// (kResponseCut if it ended early).
  virtual Result<std::size_t> read(std::span<char> buffer) = 0;
  /// Trailer fields received after the body (HTTP/2; empty otherwise).
  virtual const HeaderMap& trailers() const = 0;
  /// Abandons the exchange: its connection is not reused; a fiber waiting in it wakes with
  /// kCancelled.
  virtual void cancel() = 0;
  /// After a 101 response on HTTP/1.1: the connection itself, for tunnelling, with any bytes
  /// the upstream sent after the head in `early`. Not for HTTP/2.
  virtual Result<Stream> take_connection(std::string& early) = 0;
  /// HTTP/2, after a 2xx to an extended CONNECT (RFC 8441): the tunnel's two directions, which
  /// two fibers may wait in at once (tunnel_read on one, tunnel_write on the other).
  /// tunnel_read reads the tunnel's bytes by
  /// `deadline` (std::errc::timed_out past it): a count, 0 once the upstream ended its side
  /// (END_STREAM), or the error that ended the stream. Unsupported elsewhere.
  virtual Result<std::size_t> tunnel_read(std::span<char> buffer, Deadline deadline) {
    (void)buffer, (void)deadline;
    return fail(std::errc::operation_not_supported);
  }
  /// HTTP/2, on a tunnel's stream: sends all of `data`, waiting by `deadline` while the
  /// stream's window (and 64 KiB of our own queue) is full. finish() is the half-close,
  /// cancel() the reset. Unsupported elsewhere.
  virtual Result<void> tunnel_write(std::string_view data, Deadline deadline) {
    (void)data, (void)deadline;
    return fail(std::errc::operation_not_supported);
  }

  /// True if it runs on a connection that carried earlier exchanges.
  bool reused() const { return reused_; }
  /// How long connecting took (zero for a reused connection).
  std::chrono::microseconds connect_time() const { return connect_time_; }
  /// Records how long connecting took (UpstreamConnections does).
  void set_connect_time(std::chrono::microseconds t) { connect_time_ = t; }

 protected:
  /// Passes an interim response to the on_informational callback.
  void informational(const ClientResponseHead& head) {
    if (informational_) informational_(head);
  }

  bool reused_ = false;
  std::chrono::microseconds connect_time_{0};
  std::function<void(const ClientResponseHead&)> informational_;
};

/// Connections to endpoints, one pool per worker per endpoint: HTTP/1.1 connections kept alive
/// and reused (checked for a close before each reuse), HTTP/2 connections multiplexed within
/// the peer's concurrency limit. Share one per runtime; destroy it before the runtime, from
/// outside its workers.
class UpstreamConnections {
 public:
  explicit UpstreamConnections(Runtime& runtime);
  ~UpstreamConnections();
  UpstreamConnections(const UpstreamConnections&) = delete;
  UpstreamConnections& operator=(const UpstreamConnections&) = delete;

  /// Starts an exchange to `endpoint` from a fiber of the runtime: reuses an idle connection
  /// or opens one, then prepares `head` (sent with the first body piece or at finish()).
  /// `authority` is sent as Host (HTTP/1.1) or :authority (HTTP/2); `head`'s own Host field
  /// and hop-by-hop fields are not sent. With `fresh`, an HTTP/1.1 exchange gets a new
  /// connection, not an idle one: for a retry after an idle connection turned out closed (the
  /// others, idle as long, likely are too).
  Result<std::unique_ptr<ClientExchange>> open(const Endpoint& endpoint,
                                               const ClientRequestHead& head,
                                               std::string_view authority,
                                               const ExchangeTimeouts& timeouts,
                                               const PoolLimits& limits = {}, bool fresh = false);

  /// Keeps the connections of the endpoints whose keys (Endpoint::key) are in `kept` and
  /// closes the others', on every worker: idle ones now, busy ones when their exchange ends
  /// (an HTTP/2 connection after its last stream); an endpoint not kept that is opened later
  /// (by a request of a configuration before) keeps no connection either. For a new
  /// configuration of targets: what it no longer names holds no socket. Call from outside
  /// the workers; returns when every worker has done it.
  void retain(std::unordered_set<std::string> kept);

  /// Idle HTTP/1.1 connections to `endpoint` on the calling worker.
  std::size_t idle(const Endpoint& endpoint) const;
  /// Open connections (idle or busy) to `endpoint` on the calling worker.
  std::size_t open_connections(const Endpoint& endpoint) const;
  /// Requests on the calling worker waiting for one of `endpoint`'s max_connections.
  std::size_t waiting(const Endpoint& endpoint) const;

  struct Pool;

 private:
  Pool& pool();
  /// The calling worker's state for `endpoint`, if it has any.
  const detail::TargetState* target_if_any(const Endpoint& endpoint) const;

  Runtime& runtime_;
  std::vector<std::unique_ptr<Pool>> pools_;
};

}  // namespace spindle::http

template <>
struct std::is_error_code_enum<spindle::http::ExchangeErrc> : std::true_type {};
