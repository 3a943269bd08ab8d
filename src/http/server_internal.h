#pragma once
// What the HTTP/1 and HTTP/2 drivers of HttpServer share (private to src/http).

#include <atomic>
#include <cstddef>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/http/server.h"
#include "spindle/net/stream.h"
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

/// What a worker knows of its connections: the Date cache, read buffers to reuse, the idle
/// HTTP/1 connections, those that woke and wait for a fiber, and the HTTP/2 ones (for
/// draining). Touched only by its worker.
struct alignas(64) WorkerState {
  DateCache date;
  std::vector<std::vector<char>> free_buffers;
  std::vector<std::string> free_outputs;  // response buffers, with their capacity
  ConnectionState* idle_head = nullptr;   // intrusive list of idle connections
  ConnectionState* ready_head = nullptr;  // woken idle connections, oldest first (same links)
  ConnectionState* ready_tail = nullptr;
  std::size_t runners_starting = 0;     // fibers spawned to serve them that have not begun
  std::vector<Http2Connection*> http2;  // open HTTP/2 connections
  std::size_t open = 0;                 // connections open on this worker
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
  std::atomic<bool> draining{false};
};

namespace detail {

/// Serves one HTTP/2 connection on `stream` until it ends, on the calling fiber. `preread`:
/// bytes already received (from the client preface on); `upgrade`: the h2c upgrade request,
/// or nullptr.
void serve_http2(Stream& stream, HttpServer::Shared& shared, WorkerState& worker,
                 std::string_view preread, const Http2Upgrade* upgrade);

/// Sends GOAWAY on every HTTP/2 connection of `worker` (draining); each ends once its
/// streams are done.
void shut_down_http2(WorkerState& worker);

}  // namespace detail
}  // namespace spindle::http
