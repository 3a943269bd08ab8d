#pragma once
// Helpers for tests that run an HttpServer in-process and talk to it over loopback sockets.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>

#include "spindle/http/server.h"
#include "spindle/net/tcp_stream.h"

namespace spindle::testing {

/// Starts `router` on 127.0.0.1:0 (or `address`) with `options`; fails the test if it cannot.
inline std::unique_ptr<http::HttpServer> start_http_server(
    Runtime& runtime, http::Router router, http::ServerOptions options = {},
    Address address = Address::loopback_v4(0)) {
  auto server = http::HttpServer::start(runtime, address, std::move(router), std::move(options));
  EXPECT_TRUE(server.has_value()) << (server ? "" : server.error().message());
  return server ? std::move(*server) : nullptr;
}

/// Sends `request` (raw bytes) on a new connection and reads until the server closes it or
/// `timeout` passes. From a fiber.
inline std::string exchange_raw(const Address& address, std::string_view request,
                                std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  auto stream = TcpStream::connect(address, Deadline::after(timeout));
  if (!stream) return "connect failed: " + stream.error().message();
  Deadline deadline = Deadline::after(timeout);
  if (!stream->write_all(request, deadline)) return "write failed";
  std::string got;
  char buffer[4096];
  for (;;) {
    auto n = stream->read(buffer, deadline);
    if (!n || *n == 0) break;
    got.append(buffer, *n);
  }
  return got;
}

/// The head of a raw HTTP/1 response (up to the empty line).
inline std::string_view head_of(std::string_view response) {
  return response.substr(0, response.find("\r\n\r\n"));
}

}  // namespace spindle::testing
