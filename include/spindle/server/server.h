#pragma once
/// HttpServer: HTTP/1.1 over TcpServer — one fiber per connection running the HTTP/1 driver:
/// keep-alive, Connection: close, HTTP/1.0, pipelining (every complete request in the buffer
/// is answered, in order, and the responses go out in one write), Expect: 100-continue,
/// Content-Length and chunked request bodies read as the handler asks (streamed, within a
/// size limit), a Date header cached per worker per second, a Server header, and timeouts for
/// slow clients.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/fiber/runtime.h"
#include "spindle/h1/parser.h"
#include "spindle/http/target.h"
#include "spindle/io/deadline.h"
#include "spindle/net/address.h"
#include "spindle/net/tcp_server.h"
#include "spindle/net/tls.h"
#include "spindle/server/access_log.h"
#include "spindle/server/router.h"

namespace spindle::http {

/// Limits and timeouts of an HttpServer.
struct ServerOptions {
  /// Request line / head / header-count limits (414, 431).
  ParserLimits parser;
  /// How request paths are normalised before routing (target.h): the path every handler,
  /// the router and the gateway see.
  PathRules paths;
  /// Largest request body accepted, whether streamed or read whole (413 beyond).
  std::uint64_t max_body = 1 << 20;
  /// Time allowed to receive a whole request head once its first byte arrived (408 beyond).
  std::chrono::milliseconds header_timeout{10'000};
  /// Time allowed between two reads of a request body (408 beyond).
  std::chrono::milliseconds body_timeout{30'000};
  /// How long an idle keep-alive connection is kept open.
  std::chrono::milliseconds keepalive_timeout{60'000};
  /// Time allowed to write a response.
  std::chrono::milliseconds write_timeout{30'000};
  /// Most requests on one connection (then it is closed after the response; HTTP/2: GOAWAY
  /// names the last one, later streams are refused unprocessed); 0: no limit.
  std::size_t max_requests_per_connection = 0;
  /// Most open connections per worker; beyond it a new connection gets a 503 and is closed.
  std::size_t max_connections_per_worker = 16384;
  /// The Server header ("" for none).
  std::string server_name = "spindle";
  /// Listener settings.
  TcpServerOptions tcp;
  /// Where to log requests (nullptr: no access log).
  std::shared_ptr<AccessLog> access_log;
  /// Speak HTTP/2 too: by ALPN "h2" over TLS (the context must offer it), and on cleartext
  /// by prior knowledge or an `Upgrade: h2c` request.
  bool http2 = false;
  /// With http2: cleartext connections must be HTTP/2 by prior knowledge (an h2c-only
  /// service, as gRPC backends are); anything else is closed without an answer.
  bool http2_only = false;
  /// An HTTP/2 connection's limits: what a client may do before it is refused or cut off
  /// (GOAWAY ENHANCE_YOUR_CALM), against the published attacks.
  struct Http2Limits {
    /// Streams open at once (SETTINGS_MAX_CONCURRENT_STREAMS); beyond: REFUSED_STREAM.
    std::uint32_t max_concurrent_streams = 100;
    /// What a client may send ahead of the handler reading it: per stream, per connection.
    std::uint32_t stream_window = 256 * 1024;
    std::uint32_t connection_window = 4 << 20;
    /// CONTINUATION frames of one header block (CONTINUATION floods).
    std::size_t max_header_frames = 32;
    /// Resets a connection may cause or send beyond the streams it completes (Rapid Reset,
    /// CVE-2023-44487; reset floods, CVE-2019-9514): each completed stream earns one more.
    std::size_t reset_budget = 200;
    /// Resets of streams whose handler runs (each may have cost an upstream request): so many
    /// at once, and so many per second after.
    std::size_t running_reset_burst = 100;
    std::size_t running_resets_per_second = 5;
    /// Frames that carry nothing (CVE-2019-9518) beyond the streams completed, and SETTINGS
    /// frames (CVE-2019-9515), per connection.
    std::size_t empty_frame_budget = 200;
    std::size_t settings_budget = 100;
    /// Output queued for a client that does not read (PING and SETTINGS floods, CVE-2019-9512).
    std::size_t max_unread_output = 1 << 20;
  } http2_limits;
  /// Serve HTTPS with this context (nullptr: plain HTTP).
  std::shared_ptr<const TlsServerContext> tls;
  /// Time allowed for a TLS handshake; a client that stalls in it is closed.
  std::chrono::milliseconds handshake_timeout{10'000};
};

/// Serves a Router over HTTP/1.1 on every worker of a runtime.
class HttpServer {
 public:
  /// Binds `address` and starts serving `router` (moved in, then read-only).
  /// `inherited`: sockets already listening on `address` to accept from instead of binding
  /// (see TcpServer::start).
  [[nodiscard]] static Result<std::unique_ptr<HttpServer>> start(
      Runtime& runtime, const Address& address, Router router, ServerOptions options = {},
      std::vector<UniqueFd> inherited = {});
  /// As start(), but bound only: no connection is accepted until accept_connections() (they
  /// wait in the listening sockets' queues), so that what the router reads can be put in
  /// force first. stop() works on it too.
  [[nodiscard]] static Result<std::unique_ptr<HttpServer>> open(
      Runtime& runtime, const Address& address, Router router, ServerOptions options = {},
      std::vector<UniqueFd> inherited = {});
  /// Starts accepting on a server open() made (idempotent).
  void accept_connections() { tcp_->accept_connections(); }
  /// Stops accepting new connections (idempotent). Open connections go on.
  void stop();
  /// Serves `router` with `options` from now on, on the same listening socket: connections
  /// accepted from here on get them, while those open now keep the old ones and end: an
  /// HTTP/1 connection after its current or next response (which says Connection: close; one
  /// that stays idle until its keep-alive timeout closes then), an HTTP/2 one after GOAWAY.
  /// The listening socket's own settings (options.tcp) stay as they were. Call from outside
  /// the runtime's workers; returns once every worker accepts with the new configuration.
  void reconfigure(Router router, ServerOptions options);
  /// Graceful shutdown: stops accepting, closes idle keep-alive connections at once, lets
  /// each busy one finish its current request and close, and waits for them until `deadline`.
  /// With `gentle`, idle connections are left alone for that long first (each closes after
  /// its next response, which says Connection: close): a client sending on one at the moment
  /// it would have been closed loses nothing (a process handing over to its replacement).
  /// Returns true if every connection ended in time. Call from outside the runtime's workers.
  bool drain(Deadline deadline, std::chrono::milliseconds gentle = {});
  /// Connections open now (with every configuration, including earlier ones still ending).
  std::size_t connections() const;
  ~HttpServer();

  /// The bound address (with the real port).
  const Address& address() const { return tcp_->address(); }
  /// The listening sockets, to hand over to a process that replaces this one (until stop()).
  const std::vector<int>& listener_fds() const { return tcp_->listener_fds(); }

 private:
  HttpServer() = default;

 public:
  /// State shared by the server and its connections (internal).
  struct Shared;

 private:
  /// What every connection reads: router, options, per-worker Date caches.
  std::shared_ptr<Shared> shared_;
  /// The configuration each worker gives the connections it accepts (shared_, once every
  /// worker has switched to it), read by the acceptors.
  struct InForce {
    std::vector<std::shared_ptr<Shared>> per_worker;
  };
  std::shared_ptr<InForce> in_force_;
  /// Earlier configurations whose connections may still be open (reconfigure).
  std::vector<std::shared_ptr<Shared>> retired_;
  /// The TCP layer.
  std::unique_ptr<TcpServer> tcp_;
};

}  // namespace spindle::http
