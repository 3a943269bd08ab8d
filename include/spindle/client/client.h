#pragma once
/// HttpClient: whole HTTP/1.1 and HTTP/2 requests from fibers, by URL, over TCP or TLS. A
/// convenience over UpstreamConnections (exchange.h), which streams and pools per worker and
/// per endpoint: an HTTP/2 connection carries many requests at once, HTTP/1.1 connections are
/// kept alive and reused.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/client/exchange.h"
#include "spindle/fiber/runtime.h"
#include "spindle/http/header_map.h"
#include "spindle/net/resolver.h"
#include "spindle/net/tls.h"

namespace spindle::http {

/// How an HttpClient connects.
struct ClientOptions {
  /// TLS for https:// (nullptr: verify against the system store, offering h2 and http/1.1).
  std::shared_ptr<const TlsClientContext> tls;
  /// Offer h2 by ALPN in the default TLS context (with a given `tls`, its ALPN list decides;
  /// the protocol ALPN picks is the one spoken).
  bool http2 = true;
  /// Speak HTTP/2 to http:// origins without asking (h2c prior knowledge); else HTTP/1.1.
  bool h2c_prior_knowledge = false;
  /// Time to resolve, connect and handshake.
  std::chrono::milliseconds connect_timeout{5'000};
  /// Time for a whole exchange, from sending to the last byte of the response.
  std::chrono::milliseconds request_timeout{30'000};
  /// Idle HTTP/1.1 connections kept per origin and worker.
  std::size_t max_idle_per_origin = 32;
  /// Largest response body accepted (std::errc::message_size beyond).
  std::size_t max_response_body = 64u << 20;
};

/// A request to send.
struct ClientRequest {
  std::string method = "GET";
  /// "http://host[:port]/path?query" or "https://...".
  std::string url;
  /// Header fields to send (Host, Content-Length and connection fields are the client's).
  HeaderMap headers;
  std::string body;
};

/// A response received whole.
struct ClientResponse {
  int status = 0;
  /// 10 for HTTP/1.0, 11 for HTTP/1.1, 20 for HTTP/2.
  int version = 11;
  HeaderMap headers;
  std::string body;
};

/// Sends requests; share one per runtime. Destroy it before its runtime, from any thread.
class HttpClient {
 public:
  HttpClient(Runtime& runtime, ClientOptions options = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// Sends `request` and reads the whole response, from a fiber of the runtime. Errors: a bad
  /// URL (std::errc::invalid_argument), lookup, connect and TLS errors, std::errc::timed_out,
  /// std::errc::protocol_error for a malformed response, std::errc::message_size. Sent again,
  /// once, when a pooled connection proves closed before anything reached the server; and up
  /// to three times when an HTTP/2 server closing a connection turned the stream away
  /// unprocessed (GOAWAY).
  [[nodiscard]] Result<ClientResponse> send(const ClientRequest& request);

  struct Pool;

 private:
  Runtime& runtime_;
  ClientOptions options_;
  /// Lookups run on several threads: one slow name does not hold the others up.
  Resolver resolver_{4};
  /// The connections, per worker and endpoint.
  UpstreamConnections connections_;
  /// Per worker: the address each origin resolved to, made by that worker on first use.
  std::vector<std::unique_ptr<Pool>> pools_;
};

}  // namespace spindle::http
