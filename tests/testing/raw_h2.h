#pragma once
// A bare HTTP/2 client for tests that must see each frame the server sends (GOAWAY, RST_STREAM,
// PING) and send exactly what they mean to: h2c by prior knowledge on one TCP connection, with
// spindle's frame reader and HPACK coder. From a fiber; it starts no fiber of its own.
#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "spindle/h2/frame.h"
#include "spindle/h2/hpack.h"
#include "spindle/net/tcp_stream.h"

namespace spindle::testing {

class RawH2 {
 public:
  /// One frame as received, its payload copied.
  struct Received {
    std::uint8_t type = 0;
    std::uint8_t flags = 0;
    std::uint32_t stream_id = 0;
    std::uint32_t error_code = 0;
    std::uint32_t other_stream = 0;  ///< GOAWAY: the last stream id
    std::string payload;
    h2::FrameType kind() const { return static_cast<h2::FrameType>(type); }
  };
  /// A response read whole.
  struct Response {
    int status = 0;
    std::string body;
    std::optional<h2::ErrorCode> reset;  ///< RST_STREAM instead of a response
  };

  /// Connects and sends the preface and an empty SETTINGS (the server's SETTINGS are
  /// acknowledged as they come).
  static std::optional<RawH2> connect(const Address& address) {
    auto tcp = TcpStream::connect(address, Deadline::after(std::chrono::seconds(5)));
    if (!tcp) return std::nullopt;
    RawH2 c(std::move(*tcp));
    std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    h2::write::settings(out, {});
    if (!c.send(out)) return std::nullopt;
    return c;
  }

  bool send(std::string_view bytes) {
    return tcp_.write_all(bytes, Deadline::after(std::chrono::seconds(5))).has_value();
  }

  /// Sends a GET for `path` on stream `id` (HPACK with indexing: a later request's fields refer
  /// to the table), or appends its frame to `batch` for one send of many; returns the header
  /// block's size.
  std::size_t get(std::uint32_t id, std::string_view path, std::string* batch = nullptr) {
    std::string block;
    encoder_.encode({{":method", "GET"},
                     {":scheme", "http"},
                     {":path", path},
                     {":authority", "test.example"},
                     {"user-agent", "raw-h2-test-client/1.0"},
                     {"x-test-request", "a value worth keeping in the table"}},
                    block);
    std::string out;
    h2::write::headers(batch ? *batch : out, id, block, /*end_stream=*/true);
    if (!batch) EXPECT_TRUE(send(out));
    return block.size();
  }

  /// The next frame (SETTINGS are acknowledged, and the server's PINGs answered, on the way:
  /// they are still returned). nullopt at the end of the connection or after `timeout`.
  std::optional<Received> next(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    Deadline deadline = Deadline::after(timeout);
    while (frames_.empty()) {
      char buffer[16384];
      auto n = tcp_.read(buffer, deadline);
      if (!n || *n == 0) return std::nullopt;
      auto bytes = std::span(reinterpret_cast<const std::uint8_t*>(buffer), *n);
      auto error = reader_.feed(bytes, [&](const h2::Frame& f) {
        frames_.push_back(Received{
            f.type, f.flags, f.stream_id, f.error_code, f.other_stream,
            std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size())});
        return true;
      });
      if (error) return std::nullopt;
    }
    Received f = std::move(frames_.front());
    frames_.pop_front();
    if (f.kind() == h2::FrameType::kSettings && (f.flags & h2::flag::kAck) == 0) {
      std::string ack;
      h2::write::settings_ack(ack);
      (void)send(ack);
    }
    return f;
  }

  /// Reads frames until stream `id` ends (its response, or a reset); frames of other streams
  /// (and of the connection) are kept in `others`, where a later call finds its stream's.
  Response response(std::uint32_t id) {
    Response r;
    // Frames of this stream met while reading another's come first.
    std::deque<Received> mine;
    std::erase_if(others, [&](Received& f) {
      if (f.stream_id != id) return false;
      mine.push_back(std::move(f));
      return true;
    });
    auto take = [&]() -> std::optional<Received> {
      if (!mine.empty()) {
        Received f = std::move(mine.front());
        mine.pop_front();
        return f;
      }
      return next();
    };
    while (auto f = take()) {
      if (f->stream_id != id) {
        others.push_back(std::move(*f));
        continue;
      }
      if (f->kind() == h2::FrameType::kRstStream) {
        r.reset = static_cast<h2::ErrorCode>(f->error_code);
        return r;
      }
      if (f->kind() == h2::FrameType::kHeaders) {
        auto status = decoder_.decode(
            std::span(reinterpret_cast<const std::uint8_t*>(f->payload.data()), f->payload.size()),
            [&](std::string_view name, std::string_view value) {
              if (name == ":status") r.status = std::stoi(std::string(value));
            });
        EXPECT_EQ(status, h2::hpack::Status::kOk);
      } else if (f->kind() == h2::FrameType::kData) {
        r.body += f->payload;
      }
      if ((f->flags & h2::flag::kEndStream) != 0) return r;
    }
    ADD_FAILURE() << "the connection ended before stream " << id << " did";
    return r;
  }

  /// Frames of other streams (or the connection) met while reading a response.
  std::vector<Received> others;

 private:
  explicit RawH2(TcpStream tcp) : tcp_(std::move(tcp)) {}

  TcpStream tcp_;
  h2::FrameReader reader_;
  std::deque<Received> frames_;
  h2::hpack::Encoder encoder_;
  h2::hpack::Decoder decoder_;
};

}  // namespace spindle::testing
