// Frames that cross our RST_STREAM on the wire (RFC 9113 §5.1): what the peer sent on a stream
// before it read our reset is ignored, never counted as its error, its DATA still counted for
// the connection's window; once it has read the reset (it answered the PING sent after it), what
// it sends there is its own error again. Both ends: a gateway's client session whose callers
// cancel while the upstream's answers are on their way (80 streams, then 500 in waves), and a
// server session whose handlers give up while the client's bodies are on their way.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "h2_testing.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace crossing {

// One frame as written, its payload copied.
struct Written {
  FrameType kind;
  std::uint8_t flags;
  std::uint32_t stream;
  std::uint32_t code;  // RST_STREAM, GOAWAY
  std::uint32_t increment;
};

std::vector<Written> frames(const std::string& out) {
  std::vector<Written> frames;
  FrameReader reader(1 << 24);
  (void)reader.feed(bytes(out), [&](const Frame& f) {
    frames.push_back({f.kind(), f.flags, f.stream_id, f.error_code, f.increment});
    return true;
  });
  return frames;
}

std::size_t count(const std::vector<Written>& frames, FrameType kind) {
  std::size_t n = 0;
  for (const Written& f : frames) n += f.kind == kind ? 1 : 0;
  return n;
}

// Either end's handler: records what each stream got; an upstream's answers every request
// whose body ended with 200 and `answer` bytes (as its windows allow); a server's gives up on
// (resets) every request as its head comes when `reset_on_head`.
struct Peer : SessionHandler {
  Session* session = nullptr;
  std::string answer;
  bool reset_on_head = false;
  std::map<std::uint32_t, std::string> body, pending;
  std::set<std::uint32_t> ended, heads;
  std::map<std::uint32_t, ErrorCode> resets;

  void on_field(std::uint32_t, const spindle::http::Field&) override {}
  void on_headers(std::uint32_t id, bool end_stream, bool) override {
    heads.insert(id);
    if (reset_on_head) return session->reset(id, ErrorCode::kCancel);
    if (end_stream) finish(id);
  }
  void on_data(std::uint32_t id, std::span<const std::uint8_t> d, bool end_stream) override {
    body[id].append(reinterpret_cast<const char*>(d.data()), d.size());
    session->consumed(id, d.size());
    if (end_stream) finish(id);
  }
  void on_reset(std::uint32_t id, ErrorCode code) override {
    resets[id] = code;
    pending.erase(id);
  }
  void on_window(std::uint32_t) override {
    for (auto it = pending.begin(); it != pending.end();) {
      std::string& left = it->second;
      left.erase(0, session->submit_data(it->first, left, true));
      it = left.empty() ? pending.erase(it) : std::next(it);
    }
  }
  void finish(std::uint32_t id) {
    ended.insert(id);
    if (answer.empty()) return;  // a client: the response ended
    const hpack::Field head[] = {{":status", "200"}, {"content-type", "text/plain"}};
    static_cast<ServerSession*>(session)->submit_headers(id, head, false);
    pending[id] = answer;
    on_window(0);
  }
};

std::vector<hpack::Field> get() {
  return {{":method", "GET"}, {":scheme", "http"}, {":authority", "up"}, {":path", "/x"}};
}
std::vector<hpack::Field> post() {
  return {{":method", "POST"}, {":scheme", "http"}, {":authority", "up"}, {":path", "/x"}};
}

// A client session and a server session, and the bytes between them held until a test lets
// them through: what each wrote since the last take.
struct Wire {
  Peer client_side, server_side;
  ClientSession client;
  ServerSession server;
  std::vector<Written> client_wrote, server_wrote;  // everything, for the checks at the end

  Wire(SessionLimits client_limits, SessionLimits server_limits)
      : client(client_limits, client_side), server(server_limits, server_side) {
    client_side.session = &client;
    server_side.session = &server;
    EXPECT_TRUE(to_server(from_client()));
    EXPECT_TRUE(to_client(from_server()));
    EXPECT_TRUE(to_server(from_client()));  // the SETTINGS acknowledged
  }
  std::string from_client() {
    std::string out = client.take_output();
    for (const Written& f : frames(out.starts_with("PRI") ? out.substr(24) : out)) {
      client_wrote.push_back(f);
    }
    return out;
  }
  std::string from_server() {
    std::string out = server.take_output();
    for (const Written& f : frames(out)) server_wrote.push_back(f);
    return out;
  }
  bool to_server(const std::string& bytes_) { return server.receive(bytes(bytes_)); }
  bool to_client(const std::string& bytes_) { return client.receive(bytes(bytes_)); }
  // Both ways until neither has anything to say.
  bool settle() {
    for (int round = 0; round < 1000; ++round) {
      std::string up = from_client(), down = from_server();
      if (up.empty() && down.empty()) return true;
      if (!to_server(up) || !to_client(down)) return false;
    }
    return false;
  }
};

// The gateway's client: the connection's window reopens as DATA arrives (or, `on_receipt`
// false, as the caller consumes it).
SessionLimits client_limits(bool on_receipt) {
  SessionLimits limits;
  limits.connection_window_on_receipt = on_receipt;
  return limits;
}

}  // namespace crossing

using namespace crossing;

// A gateway's callers cancel `total` streams, in waves as the upstream's concurrency allows
// (100), and each wave's answers were written by the upstream before it read the resets: the
// client ignores them all, the connection stays up, and the windows their DATA took come back
// (4 KiB answers, 500 of them: twice the connection's window), so that a last request still
// gets its whole answer.
TEST(H2ResetCrossing, AnUpstreamsAnswersToStreamsWeResetAreIgnoredWaveAfterWave) {
  for (bool on_receipt : {true, false}) {
    for (std::size_t total : {80u, 500u}) {
      SCOPED_TRACE(testing::Message() << total << " streams, on receipt " << on_receipt);
      Wire w(client_limits(on_receipt), SessionLimits{});
      w.server_side.answer = std::string(4096, 'a');
      std::size_t reset = 0;
      int waves = 0;
      while (reset < total) {
        std::vector<std::uint32_t> wave;
        while (reset + wave.size() < total && w.client.can_open()) {
          wave.push_back(w.client.open(get(), true));
        }
        ASSERT_FALSE(wave.empty());
        ++waves;
        // The upstream reads the requests and answers them at once...
        ASSERT_TRUE(w.to_server(w.from_client()));
        std::string answers = w.from_server();
        // ...while the callers cancel: the resets cross the answers.
        for (std::uint32_t id : wave) w.client.reset(id, ErrorCode::kCancel);
        std::string resets = w.from_client();
        ASSERT_TRUE(w.to_client(answers)) << "wave " << waves;
        ASSERT_TRUE(w.to_server(resets));
        ASSERT_TRUE(w.settle());
        reset += wave.size();
      }
      EXPECT_GE(waves, total > 100 ? 5 : 1);
      EXPECT_TRUE(w.client_side.body.empty());  // no caller was handed a cancelled answer
      EXPECT_EQ(w.client.unacknowledged_resets(), 0u);
      // Nothing was taken for an error: no reset but ours, no GOAWAY.
      EXPECT_EQ(count(w.client_wrote, FrameType::kRstStream), total);
      EXPECT_EQ(count(w.client_wrote, FrameType::kGoaway), 0u);
      EXPECT_EQ(count(w.server_wrote, FrameType::kGoaway), 0u);
      // The connection serves the next request, whole (the windows came back).
      w.server_side.answer = std::string(1 << 20, 'b');
      std::uint32_t last = w.client.open(get(), true);
      ASSERT_NE(last, 0u);
      ASSERT_TRUE(w.settle());
      EXPECT_EQ(w.client_side.body[last].size(), std::size_t{1} << 20);
      EXPECT_TRUE(w.client_side.ended.contains(last));
    }
  }
}

// A server's handlers give up on `total` requests as their heads come, while the client's
// bodies (and their ends) are on their way: ignored, their windows given back, the connection
// up; the client's resets that crossed ours are not counted as its resets either.
TEST(H2ResetCrossing, AClientsBodiesToStreamsWeResetAreIgnoredWaveAfterWave) {
  for (bool client_resets_too : {false, true}) {
    for (std::size_t total : {80u, 500u}) {
      SCOPED_TRACE(testing::Message()
                   << total << " streams, crossing resets " << client_resets_too);
      SessionLimits server_limits;
      server_limits.connection_window = 65535;  // each wave's bodies would spend it
      Wire w(client_limits(false), server_limits);
      w.server_side.reset_on_head = true;
      std::size_t done = 0;
      while (done < total) {
        std::vector<std::uint32_t> wave;
        while (done + wave.size() < std::min<std::size_t>(total, done + 100) &&
               w.client.can_open()) {
          wave.push_back(w.client.open(post(), false));
        }
        ASSERT_FALSE(wave.empty());
        // The heads first, then the bodies: each wave's take 30,000 bytes of the window,
        // which comes back in batches of half of it.
        for (std::uint32_t id : wave) {
          std::string body(300, 'u');
          ASSERT_EQ(w.client.submit_data(id, body, true), body.size());
        }
        if (client_resets_too) {
          for (std::uint32_t id : wave) w.client.reset(id, ErrorCode::kCancel);
        }
        std::string requests = w.from_client();
        ASSERT_TRUE(w.to_server(requests));  // heads, bodies, ends (and resets): all before ours
        ASSERT_TRUE(w.settle());
        done += wave.size();
      }
      EXPECT_EQ(w.server_side.heads.size(), total);
      EXPECT_TRUE(w.server_side.body.empty());
      EXPECT_EQ(w.server.unacknowledged_resets(), 0u);
      // Its only resets are the handlers' (CANCEL); no STREAM_CLOSED, no GOAWAY.
      EXPECT_EQ(count(w.server_wrote, FrameType::kRstStream), total);
      for (const Written& f : w.server_wrote) {
        if (f.kind == FrameType::kRstStream) {
          EXPECT_EQ(f.code, 8u) << f.stream;
        }
      }
      EXPECT_EQ(count(w.server_wrote, FrameType::kGoaway), 0u);
      // The connection's window came back: a last upload of 1 MiB goes through whole.
      w.server_side.reset_on_head = false;
      std::uint32_t last = w.client.open(post(), false);
      ASSERT_NE(last, 0u);
      std::string left(1 << 20, 'z');
      for (int round = 0; round < 1000 && !left.empty(); ++round) {
        left.erase(0, w.client.submit_data(last, left, true));
        ASSERT_TRUE(w.settle());
      }
      EXPECT_TRUE(left.empty());
      EXPECT_EQ(w.server_side.body[last].size(), std::size_t{1} << 20);
    }
  }
}

// Our reset and the peer's crossed: on either end, neither is the other's error. 500 streams,
// five times the reset budget's worth over its completed streams.
TEST(H2ResetCrossing, ResetsThatCrossAreNotThePeersResets) {
  SessionLimits limits;
  limits.reset_budget = 50;
  for (bool client_first : {true, false}) {
    SCOPED_TRACE(client_first ? "the client's reset read first" : "the server's read first");
    Wire w(limits, limits);
    w.server_side.answer = "x";
    for (int wave = 0; wave < 5; ++wave) {
      std::vector<std::uint32_t> ids;
      while (ids.size() < 100 && w.client.can_open()) ids.push_back(w.client.open(post(), false));
      ASSERT_EQ(ids.size(), 100u);
      ASSERT_TRUE(w.to_server(w.from_client()));
      for (std::uint32_t id : ids) {
        w.client.reset(id, ErrorCode::kCancel);
        w.server.reset(id, ErrorCode::kCancel);
      }
      std::string up = w.from_client(), down = w.from_server();
      if (client_first) {
        ASSERT_TRUE(w.to_server(up));
        ASSERT_TRUE(w.to_client(down));
      } else {
        ASSERT_TRUE(w.to_client(down));
        ASSERT_TRUE(w.to_server(up));
      }
      ASSERT_TRUE(w.settle());
    }
    EXPECT_EQ(count(w.client_wrote, FrameType::kGoaway), 0u);
    EXPECT_EQ(count(w.server_wrote, FrameType::kGoaway), 0u);
    std::uint32_t last = w.client.open(get(), true);
    ASSERT_TRUE(w.settle());
    EXPECT_EQ(w.client_side.body[last], "x");
  }
}

// RFC 9113 §8.1: a server that has answered whole may stop the request's body with
// RST_STREAM(NO_ERROR). That is how the stream completes, not a reset the upstream caused: a
// thousand of them leave a gateway's connection up.
TEST(H2ResetCrossing, AnUpstreamStoppingABodyAfterItsWholeAnswerIsNotAReset) {
  Peer seen;
  ClientSession session(SessionLimits{}, seen);
  seen.session = &session;
  std::string settings;
  write::settings(settings, {});
  ASSERT_TRUE(session.receive(bytes(settings)));
  hpack::Encoder encoder;
  for (int i = 0; i < 1000; ++i) {
    std::uint32_t id = session.open(post(), false);
    ASSERT_NE(id, 0u);
    std::string block, in;
    encoder.encode({{":status", "200"}}, block);
    write::headers(in, id, block, true);
    write::rst_stream(in, id, ErrorCode::kNoError);
    ASSERT_TRUE(session.receive(bytes(in))) << i;
    ASSERT_TRUE(seen.ended.contains(id));
    EXPECT_EQ(seen.resets[id], ErrorCode::kNoError);
  }
  EXPECT_EQ(session.open_streams(), 0u);
  EXPECT_EQ(count(frames(session.take_output()), FrameType::kGoaway), 0u);
}
