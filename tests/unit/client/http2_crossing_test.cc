// A gateway's callers cancel their requests while an HTTP/2 upstream's answers are on their way
// (issue 68 item 1): the upstream here writes its answers before it reads the resets (it
// answers every request it reads, whatever follows it), so every answer crosses a reset. The
// client ignores them, the upstream connection stays up (one connection, no GOAWAY from us)
// and serves the next request whole: 80 streams at once and 500 in waves.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "spindle/client/exchange.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/h2/frame.h"
#include "spindle/h2/hpack.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;

namespace crossing_upstream {

std::span<const std::uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// An h2c upstream on a plain thread and blocking sockets: it reads what has come, answers every
// request in it at once (200 and `body`), then reads on; resets it ignores, PINGs and SETTINGS
// it acknowledges. It counts the connections it took and the GOAWAYs it was sent.
class CrossingUpstream {
 public:
  explicit CrossingUpstream(std::string body) : body_(std::move(body)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(listener_, 16), 0);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &size);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~CrossingUpstream() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    {
      std::lock_guard guard(lock_);
      for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    }
    acceptor_.join();
    for (std::thread& t : threads_) t.join();
    ::close(listener_);
  }
  std::uint16_t port() const { return port_; }
  int connections() const { return accepted_; }
  int goaways() const { return goaways_; }
  int answered() const { return answered_; }

 private:
  void accept_loop() {
    for (;;) {
      int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0 || stopping_) {
        if (fd >= 0) ::close(fd);
        return;
      }
      ++accepted_;
      std::lock_guard guard(lock_);
      connections_.push_back(fd);
      threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  static bool write_all(int fd, std::string_view out) {
    while (!out.empty()) {
      ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      out.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  void serve(int fd) {
    h2::FrameReader reader(1 << 20);
    h2::hpack::Encoder encoder;
    std::string out;
    const std::pair<h2::SettingId, std::uint32_t> settings[] = {
        {h2::SettingId::kMaxConcurrentStreams, 100}};
    h2::write::settings(out, settings);
    if (!write_all(fd, out)) return;
    std::size_t preface = 24;
    char buffer[65536];
    for (;;) {
      ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      std::string_view in(buffer, static_cast<std::size_t>(n));
      const std::size_t skip = std::min(preface, in.size());
      preface -= skip;
      in.remove_prefix(skip);
      out.clear();
      // Every request in what came is answered now, before anything after it is looked at.
      (void)reader.feed(as_bytes(in), [&](const h2::Frame& f) {
        switch (f.kind()) {
          case h2::FrameType::kHeaders: {
            std::string block;
            encoder.encode({{":status", "200"}, {"content-type", "text/plain"}}, block);
            h2::write::headers(out, f.stream_id, block, false);
            h2::write::data(out, f.stream_id, body_, true);
            ++answered_;
            break;
          }
          case h2::FrameType::kPing:
            if (!f.has(h2::flag::kAck)) {
              h2::write::ping(out, std::span<const std::uint8_t, 8>(f.payload.data(), 8), true);
            }
            break;
          case h2::FrameType::kSettings:
            if (!f.has(h2::flag::kAck)) h2::write::settings_ack(out);
            break;
          case h2::FrameType::kGoaway:
            ++goaways_;
            break;
          default:  // RST_STREAM (read too late to matter), WINDOW_UPDATE
            break;
        }
        return true;
      });
      if (!out.empty() && !write_all(fd, out)) break;
    }
    ::close(fd);
  }

  std::string body_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::thread acceptor_;
  std::mutex lock_;
  std::vector<int> connections_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0}, goaways_{0}, answered_{0};
};

RequestHead get(std::string_view target) {
  RequestHead head;
  head.method = "GET";
  head.target = target;
  return head;
}

}  // namespace crossing_upstream

using namespace crossing_upstream;

// `waves` waves of `per_wave` requests, each cancelled as soon as it was made (the upstream's
// answers then cross the resets), and after each wave a request read whole.
void cancel_in_waves(int waves, std::size_t per_wave) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  const std::string body(3000, 'a');
  CrossingUpstream upstream(body);
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    Endpoint endpoint;
    endpoint.address = Address::loopback_v4(upstream.port());
    endpoint.protocol = WireProtocol::kH2c;
    const PoolLimits one{.max_connections = 1};
    for (int wave = 0; wave < waves; ++wave) {
      std::vector<std::unique_ptr<ClientExchange>> cancelled;
      for (std::size_t i = 0; i < per_wave; ++i) {
        auto ex = pools.open(endpoint, get("/cancelled"), "up", {}, one);
        ASSERT_TRUE(ex.has_value()) << "wave " << wave << ": " << ex.error().message();
        cancelled.push_back(std::move(*ex));
      }
      // Cancelled before the writer ran: the resets go out behind the requests, and every
      // answer the upstream writes crosses one.
      for (auto& ex : cancelled) ex->cancel();
      cancelled.clear();
      // The next request, on the same connection, gets its answer whole.
      auto ex = pools.open(endpoint, get("/after"), "up", {}, one);
      ASSERT_TRUE(ex.has_value()) << "wave " << wave << ": " << ex.error().message();
      auto head = (*ex)->read_head();
      ASSERT_TRUE(head.has_value()) << "wave " << wave << ": " << head.error().message();
      EXPECT_EQ((*head)->status, 200);
      std::string got, buffer(4096, '\0');
      for (;;) {
        auto n = (*ex)->read(buffer);
        ASSERT_TRUE(n.has_value()) << "wave " << wave << ": " << n.error().message();
        if (*n == 0) break;
        got.append(buffer, 0, *n);
      }
      EXPECT_EQ(got, body) << "wave " << wave;
    }
    EXPECT_EQ(pools.open_connections(endpoint), 1u);
  });
  EXPECT_EQ(upstream.connections(), 1);  // the first connection carried every wave
  EXPECT_EQ(upstream.goaways(), 0);      // and was never told to go away
  EXPECT_EQ(upstream.answered(), waves * static_cast<int>(per_wave + 1));
}

TEST(Http2Crossing, EightyStreamsCancelledWhileAnsweredKeepTheConnection) {
  cancel_in_waves(1, 80);
  cancel_in_waves(3, 80);
}

TEST(Http2Crossing, FiveHundredStreamsCancelledInWavesKeepTheConnection) {
  cancel_in_waves(5, 100);
  cancel_in_waves(10, 50);
}
