#pragma once
// Helpers for tests that run an HttpServer in-process and talk to it over loopback sockets.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "spindle/net/tcp_stream.h"
#include "spindle/server/server.h"

namespace spindle::testing {

/// A request body that arrives in pieces of at most `piece` bytes, then ends, or fails with
/// HttpError(`fail_status`) if that is set. `reads` counts the reads asked of it.
class PiecewiseSource final : public http::BodySource {
 public:
  PiecewiseSource(std::string data, std::size_t piece, int fail_status = 0)
      : data_(std::move(data)), piece_(piece), fail_status_(fail_status) {}
  std::size_t read(std::span<char> buffer) override {
    ++reads;
    std::size_t n = std::min({buffer.size(), piece_, data_.size() - at_});
    if (n == 0 && fail_status_ != 0) throw http::HttpError(fail_status_, "source failed");
    std::copy_n(data_.data() + at_, n, buffer.data());
    at_ += n;
    return n;
  }
  int reads = 0;

 private:
  std::string data_;
  std::size_t piece_, at_ = 0;
  int fail_status_;
};

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

/// Reads one HTTP/1 response with a Content-Length (or none: no body) from `stream`: head and
/// body, as text; "" if the connection closed or `timeout` passed before it was whole.
inline std::string read_response(TcpStream& stream,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  Deadline deadline = Deadline::after(timeout);
  std::string got;
  char buffer[4096];
  for (;;) {
    std::size_t end = got.find("\r\n\r\n");
    if (end != std::string::npos) {
      std::size_t length = 0;
      std::size_t at = got.find("Content-Length: ");
      if (at != std::string::npos && at < end) length = std::stoul(got.substr(at + 16));
      if (got.size() >= end + 4 + length) return got.substr(0, end + 4 + length);
    }
    auto n = stream.read(buffer, deadline);
    if (!n || *n == 0) return "";
    got.append(buffer, *n);
  }
}

/// The head of a raw HTTP/1 response (up to the empty line).
inline std::string_view head_of(std::string_view response) {
  return response.substr(0, response.find("\r\n\r\n"));
}

}  // namespace spindle::testing
