// How the streams of a client's connection share the server's connection window
// (ClientSession::shared_send_window): a gateway's upstream connection carries many clients'
// uploads, and one whose upstream handler reads nothing yet must leave the others a share.
// Random sequences of opens, sends, credits given back and SETTINGS changes, against a model
// of what each stream holds.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "h2_testing.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace window_share {

struct Quiet : SessionHandler {
  void on_field(std::uint32_t, const spindle::http::Field&) override {}
  void on_headers(std::uint32_t, bool, bool) override {}
  void on_data(std::uint32_t, std::span<const std::uint8_t>, bool) override {}
  void on_reset(std::uint32_t, ErrorCode) override {}
  void on_window(std::uint32_t) override {}
  void on_goaway(std::uint32_t, ErrorCode) override {}
};

std::vector<hpack::Field> post() {
  return {{":method", "POST"}, {":scheme", "http"}, {":authority", "up"}, {":path", "/u"}};
}

// A client session whose server said `stream_window` a stream and raised the connection's
// window to `connection_window`.
struct Peer {
  Quiet quiet;
  ClientSession client{SessionLimits{}, quiet};
  std::int64_t initial;
  Peer(std::uint32_t stream_window, std::uint32_t connection_window) : initial(stream_window) {
    std::string in;
    const std::pair<SettingId, std::uint32_t> entries[] = {
        {SettingId::kInitialWindowSize, stream_window}};
    write::settings(in, entries);
    if (connection_window > 65535) write::window_update(in, 0, connection_window - 65535);
    EXPECT_TRUE(client.receive(bytes(in)));
    (void)client.take_output();
  }
  void credit(std::uint32_t stream, std::uint32_t n) {
    std::string in;
    if (stream != 0) write::window_update(in, stream, n);
    write::window_update(in, 0, n);
    EXPECT_TRUE(client.receive(bytes(in)));
  }
  std::int64_t left() const { return client.windows(0)->send; }
  // Sends all `stream` may now; what it sent.
  std::size_t send_share(std::uint32_t stream) {
    const std::size_t n = client.shared_send_window(stream);
    EXPECT_EQ(client.submit_data(stream, std::string(n, 'b'), false), n);
    (void)client.take_output();
    return n;
  }
};

// k streams whose reader reads nothing each take all they may: the connection keeps at least
// 1/2^k of its window, and a new stream may send half of what is left.
TEST(H2WindowShare, StreamsNobodyReadsLeaveTheOthersAShare) {
  for (std::uint32_t window : {65535u, 1u << 20, 16u << 20}) {
    for (std::uint32_t stream_window : {65535u, 1u << 20, (1u << 31) - 1}) {
      Peer p(stream_window, window);
      for (int k = 1; k <= 12; ++k) {
        SCOPED_TRACE(testing::Message() << window << " " << stream_window << " k=" << k);
        const std::uint32_t id = p.client.open(post(), false);
        ASSERT_NE(id, 0u);
        const std::int64_t before = p.left();
        const std::size_t sent = p.send_share(id);
        EXPECT_EQ(sent, std::min<std::int64_t>(stream_window, (before + 1) / 2));
        EXPECT_EQ(p.send_share(id), 0u);  // holds as much as is left now: no more
        EXPECT_GE(p.left(), static_cast<std::int64_t>(window >> k));
      }
    }
  }
}

// A peer that reads (and gives back) as the bytes come lets one stream send any amount, also
// one that gives back only the connection's window (its stream windows never close).
TEST(H2WindowShare, APeerThatReadsLetsAStreamSendEverything) {
  for (bool stream_credits : {true, false}) {
    SCOPED_TRACE(stream_credits);
    Peer p(stream_credits ? 65535 : (1u << 31) - 1, 65535);
    const std::uint32_t id = p.client.open(post(), false);
    std::size_t total = 0;
    for (int round = 0; round < 200 && total < (4u << 20); ++round) {
      const std::size_t n = p.send_share(id);
      ASSERT_GT(n, 0u);
      total += n;
      p.credit(stream_credits ? id : 0, static_cast<std::uint32_t>(n));
    }
    EXPECT_GE(total, 4u << 20);
  }
}

// Random opens, sends, credits (of a stream and the connection, or the connection only) and
// SETTINGS_INITIAL_WINDOW_SIZE changes: each stream's share is what the model says, from what
// it holds (sent less given back on it, at most what the connection lacks).
TEST(H2WindowShare, EveryStreamsShareFollowsWhatItHolds) {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    auto pick = [&rng](std::int64_t n) {
      return std::uniform_int_distribution<std::int64_t>(0, n - 1)(rng);
    };
    const std::uint32_t window = 65535u << pick(9);
    Peer p(65535u << pick(6), window);
    std::int64_t peak = std::max<std::int64_t>(window, 65535);
    std::map<std::uint32_t, std::int64_t> held;  // sent, less given back on the stream
    for (int step = 0; step < 400; ++step) {
      const auto action = pick(10);
      if (held.empty() || action == 0) {
        const std::uint32_t id = p.client.open(post(), false);
        if (id != 0) held[id] = 0;
        continue;
      }
      auto it = std::next(held.begin(), pick(static_cast<std::int64_t>(held.size())));
      const std::uint32_t id = it->first;
      if (action <= 5) {
        const std::int64_t lack = peak - p.left();
        const std::int64_t holds = std::min(it->second, lack);
        const std::int64_t stream = p.client.windows(id)->send;
        const std::int64_t want =
            std::max<std::int64_t>(0, std::min(stream, (p.left() - holds + 1) / 2));
        ASSERT_EQ(p.client.shared_send_window(id), static_cast<std::size_t>(want));
        it->second += static_cast<std::int64_t>(p.send_share(id));
      } else if (action <= 8 && it->second > 0) {
        const auto n = static_cast<std::uint32_t>(1 + pick(it->second));
        p.credit(action == 8 ? 0 : id, n);  // a peer giving back the connection's only
        if (action != 8) it->second -= n;
        peak = std::max(peak, p.left());
      } else if (action == 9) {
        std::string in;
        p.initial = 65535u << pick(6);
        const std::pair<SettingId, std::uint32_t> entries[] = {
            {SettingId::kInitialWindowSize, static_cast<std::uint32_t>(p.initial)}};
        write::settings(in, entries);
        ASSERT_TRUE(p.client.receive(bytes(in)));
        (void)p.client.take_output();
      }
    }
  }
}

}  // namespace window_share
