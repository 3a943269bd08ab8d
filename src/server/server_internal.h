#pragma once
// What the HTTP/1 and HTTP/2 drivers of HttpServer share (private to src/http).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/fiber/block_slab.h"
#include "spindle/fiber/idle_cache.h"
#include "spindle/h2/hpack.h"
#include "spindle/io/timer_queue.h"
#include "spindle/net/stream.h"
#include "spindle/server/server.h"
#include "spindle/sync/wait_group.h"

namespace spindle::http {
namespace detail {

/// The Date header line, formatted at most once per second per worker.
struct alignas(64) DateCache {
  std::time_t second = -1;
  char text[40] = {};

  /// "Date: <IMF-fixdate>\r\n" for now.
  std::string_view line() {
    std::time_t t = std::time(nullptr);
    if (t != second) {
      second = t;
      std::tm tm{};
      ::gmtime_r(&t, &tm);
      std::strftime(text, sizeof text, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
    }
    return {text, 37};
  }
  /// Just the date ("Sun, 22 Nov 2026 20:00:00 GMT").
  std::string_view value() { return line().substr(6, 29); }
};

struct ConnectionState;
class Http2Connection;
/// Deletes an HTTP/2 connection (defined with it: ConnectionState sees only its name).
struct Http2Deleter {
  void operator()(Http2Connection* connection) const noexcept;
};

/// A worker's HTTP/1 connection buffers kept for reuse: read buffers (max_head + 4 KiB), apart
/// from the heap in slabs (block_slab.h says why), and response buffers with their capacity.
/// The worker trims them with its own pools (Worker::keep_trimmed), so a burst of connections
/// does not keep its buffers.
struct ConnectionBuffers final : IdleCache {
  static constexpr std::size_t kFloor = 16, kMax = 1024;
  /// What a new response buffer reserves: a typical head and small body, without regrowing.
  static constexpr std::size_t kOutputReserve = 1024;
  FreeList<std::string> outputs{kFloor, kMax};

  /// Keeps `out` for the next connection: a buffer made for a response (not one never used),
  /// unless a large one grew it (past 64 KiB: pipelined answers, or bodies copied in).
  void recycle_output(std::string out) {
    if (out.capacity() < kOutputReserve || out.capacity() > 64 * 1024) return;
    out.clear();
    (void)outputs.give(std::move(out));
  }

  /// The slab of read buffers of `size` bytes (servers may differ in max_head; a worker mostly
  /// sees one size).
  BlockSlab& reads(std::size_t size) {
    for (const auto& slab : read_slabs_) {
      if (slab->block_size() == size) return *slab;
    }
    return *read_slabs_.emplace_back(std::make_unique<BlockSlab>(size, kFloor, kMax));
  }
  bool over_floor() const override {
    return outputs.over_floor() ||
           std::ranges::any_of(read_slabs_, [](const auto& slab) { return slab->over_floor(); });
  }
  std::size_t trim() override {
    std::size_t bytes = 0;  // of the heap: the slabs' pages go back to the kernel themselves
    for (const auto& slab : read_slabs_) (void)slab->trim();
    outputs.trim([&](std::string b) { bytes += b.capacity(); });
    return bytes;
  }

 private:
  std::vector<std::unique_ptr<BlockSlab>> read_slabs_;
};

/// A worker's TLS connections, for OpenSSL's record buffers (about 34 KiB a connection). A
/// connection keeps them from record to record while busy (the server's contexts do not set
/// SSL_MODE_RELEASE_BUFFERS, which frees and takes both around every record), and gives them
/// back at the worker's trim (once a second while one holds them) if it read and wrote nothing
/// since the trim before: a quiet connection, idle or not (a handler waiting, a tunnel, an
/// HTTP/2 stream open), holds none after a second or two. Trimmed with the worker's pools
/// (Worker::keep_trimmed); touched only by its worker.
class TlsBuffers final : public IdleCache {
 public:
  /// Links a new TLS connection (it holds the buffers of its handshake).
  void add(ConnectionState& state);
  /// Unlinks a connection that closes.
  void remove(ConnectionState& state);
  /// A connection's activation begins: it reads and writes again, and takes buffers.
  void activate(ConnectionState& state);
  bool over_floor() const override { return holding_ > 0; }
  std::size_t trim() override;

 private:
  ConnectionState* head_ = nullptr;  // through ConnectionState::prev_tls and next_tls
  std::size_t holding_ = 0;          // connections that may hold buffers
};

/// What a worker knows of its connections: the Date cache, read buffers to reuse, the idle
/// HTTP/1 connections, those that woke and wait for a fiber, and the HTTP/2 ones (for
/// draining). Touched only by its worker.
struct alignas(64) WorkerState {
  DateCache date;
  std::shared_ptr<ConnectionBuffers> buffers;  // made by the worker's first connection
  std::shared_ptr<TlsBuffers> tls_buffers;     // made by its first TLS connection
  ConnectionState* idle_head = nullptr;        // intrusive list of idle connections
  ConnectionState* ready_head = nullptr;       // woken idle connections, oldest first (same links)
  ConnectionState* ready_tail = nullptr;
  std::size_t runners_starting = 0;     // fibers spawned to serve them that have not begun
  std::vector<Http2Connection*> http2;  // open HTTP/2 connections
  std::size_t open = 0;                 // connections open on this worker
  /// A header block on its way to an HTTP/2 encoder: its fields and their lower-cased names.
  /// The worker's, not a connection's: filled and encoded in one call, with no switch between,
  /// and kept, so that a connection's activation allocates none of it (a burst of new
  /// connections would leave its blocks as holes between the ones that stay).
  std::vector<h2::hpack::Field> head_fields;
  std::string head_names;
  /// Idle HTTP/1 connections whose last response waits in their `unsent` for the end of the
  /// runner's batch (see run_ready_connections in server.cc). Written before the runner parks
  /// or ends, so that no other fiber, timer or reactor callback ever finds one here.
  std::vector<ConnectionState*> unsent;
};

/// Runs the router for `request`, turning an exception into an error response (logged).
Response call_router(const Router& router, Request& request);

/// The HTTP/1.1 request that asked to switch to h2c (RFC 7540 3.2), answered as stream 1.
struct Http2Upgrade {
  const RequestHead* head = nullptr;
  /// The HTTP2-Settings header, base64url-decoded.
  std::string settings;
  /// Its body (read whole before switching).
  std::string body;
};

}  // namespace detail

struct HttpServer::Shared {
  Router router;
  ServerOptions options;
  std::string server_line;  // "Server: <name>\r\n", or "" for none
  Runtime* runtime = nullptr;
  std::vector<detail::WorkerState> workers;  // one per worker, touched only by that worker
  WaitGroup active;                          // open connections
  /// Set when its connections are to end: each HTTP/1 response says Connection: close, each
  /// HTTP/2 connection gets GOAWAY.
  std::atomic<bool> draining{false};
  /// Set by a shutdown (not by a reconfigure): an HTTP/1 connection closes as soon as it has
  /// nothing to do, even if its last response did not say so.
  std::atomic<bool> closing_idle{false};
};

namespace detail {

/// One client connection, from accept to close: its socket, and what it keeps between
/// requests. The one owner of the connection (through ConnectionPtr, or a worker's idle or
/// ready list while no fiber serves it); its constructor and destructor alone count it in the
/// server's `active`, and its destructor uncounts it from the worker's `open` (counted since its
/// accept, handshake included: serve_accepted), so whatever is thrown, a connection that ends
/// is closed and uncounted. While it is idle this is all there is of it: no fiber, no stack, no
/// read buffer.
struct ConnectionState {
  ConnectionState(Stream s, std::shared_ptr<HttpServer::Shared> sh, WorkerState& w);
  /// Closes: TLS close_notify, the socket, the keep-alive timer; uncounts.
  ~ConnectionState();
  ConnectionState(const ConnectionState&) = delete;
  ConnectionState& operator=(const ConnectionState&) = delete;

  /// The socket (TCP or TLS).
  Stream stream;
  /// The server it belongs to (kept alive by its connections).
  std::shared_ptr<HttpServer::Shared> shared;
  /// Its worker's state.
  WorkerState* worker;
  /// Requests answered so far.
  std::size_t requests = 0;
  /// The client's address for the access log (looked up on first use).
  std::string remote;
  /// The request context's facts about the connection, looked up once (on first use), as a
  /// connection's activations come and go with its idle periods. On the heap: an idle
  /// connection that never needs them pays 8 bytes.
  struct Facts {
    RequestContext context;
    std::optional<Address> peer, local;
  };
  std::unique_ptr<Facts> facts;
  /// An HTTP/2 connection's own state (its session and HPACK tables), from the switch to
  /// HTTP/2 to the close: kept here while the connection is idle, without a fiber.
  std::unique_ptr<Http2Connection, Http2Deleter> http2;
  /// The keep-alive timer fired on an idle HTTP/2 connection: its last activation says
  /// GOAWAY.
  bool idle_expired = false;
  /// The keep-alive timer. It stays queued across requests (re-queued only when it fires
  /// early), so a request costs no timer-heap work.
  Timer idle_timer;
  /// When the connection last went idle, and whether it is idle now.
  Clock::time_point idle_since{};
  bool idle = false;
  /// Links in the worker's idle list (or its ready list: next_idle only).
  ConnectionState* prev_idle = nullptr;
  ConnectionState* next_idle = nullptr;
  /// A TLS connection's place in its worker's TlsBuffers: its links, the stream's io_count()
  /// at the last trim, and whether OpenSSL may hold its buffers.
  ConnectionState* prev_tls = nullptr;
  ConnectionState* next_tls = nullptr;
  std::uint32_t tls_io_seen = 0;
  bool tls_buffers_held = false;
  /// On the ready list: the runner has tried to read its next request ahead of its activation
  /// (read_ahead), and the read buffer it filled, if any, with its byte count. The activation
  /// takes them.
  bool read_ahead_tried = false;
  char* read_ahead = nullptr;
  std::size_t read_ahead_size = 0;
  /// A response of the last activation not written yet: listed in WorkerState::unsent until
  /// the runner writes it; what the socket did not take goes to the next activation.
  std::string unsent;

  /// The client's address for the access log (looked up on first use).
  const std::string& remote_text();
  /// The request context of a request on this connection (HTTP `major_version`): the facts
  /// (once per connection) and the time now.
  const RequestContext& request_context(int major_version);
};

/// Owns a connection while a fiber serves it.
using ConnectionPtr = std::unique_ptr<ConnectionState>;

/// How one activation of a connection ended.
enum class Activation {
  kClose,  ///< the connection is done (it lingered first if the client may still be sending)
  kIdle,   ///< nothing to do: it waits in the reactor for its next request (or frame)
};

/// Serves an HTTP/1 connection (switching to HTTP/2 if it asks) on the calling fiber until it
/// closes or goes idle. May throw (the caller's ConnectionPtr then closes the connection).
/// `batched`: a runner serves it with others (run_ready_connections), so a response it goes
/// idle after is left in `state.unsent` and listed in WorkerState::unsent for the runner to
/// write.
Activation serve_http1(ConnectionState& state, bool batched = false);
/// For a woken plain-TCP HTTP/1 connection on the ready list: reads what has arrived into a
/// read buffer now, without waiting (state.read_ahead), for its activation to parse.
void read_ahead(ConnectionState& state);
/// The size of an HTTP/1 connection's read buffer: a whole head at the limit, and room after
/// it.
inline std::size_t read_buffer_size(const ServerOptions& options) {
  return options.parser.max_head + 4096;
}

/// Serves the connection as HTTP/2 on the calling fiber until it closes or goes idle (its
/// HTTP/2 state, made by the first activation, stays in `state.http2`). `preread`: bytes
/// already received (from the client preface on); `upgrade`: the h2c upgrade request, or
/// nullptr (both for the first activation only).
Activation serve_http2(ConnectionState& state, std::string_view preread = {},
                       const Http2Upgrade* upgrade = nullptr);

/// No fiber can serve an HTTP/2 connection that woke: GOAWAY, written without waiting (what
/// the client sent since it went idle was not processed: it may send it again elsewhere).
void refuse_http2(ConnectionState& state);

/// An idle connection is to run again (its keep-alive time is over, or the server drains):
/// it leaves the idle list for the ready list, as if the client had sent something.
void wake_idle(ConnectionState& state);

/// Sends GOAWAY on every HTTP/2 connection of `worker` (draining); each ends once its
/// streams are done.
void shut_down_http2(WorkerState& worker);

}  // namespace detail
}  // namespace spindle::http
