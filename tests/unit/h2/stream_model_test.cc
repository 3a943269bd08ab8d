// A reference model of RFC 9113 §5.1 (stream states, who may send what, what is ignored after a
// reset, flow control) as spindle applies it, against the session, both ends: random (seeded)
// runs of frames from a simulated peer and actions of our end, our frames reaching the peer
// late (so that its frames cross our resets and our window updates), a few of its frames
// breaking the rules. On every frame the session must agree with the model (accepted, ignored,
// a stream error, a connection error; which code), and after every step on both windows of the
// connection and of every open stream (what each side may send, and no window lost: what the
// peer may send plus what is held or not yet given back is the whole window), on the streams
// open and on the resets the peer may not know of yet. And the invariant the model rests on: a
// frame the peer sent before it saw our RST_STREAM is never its error.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "h2_testing.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace streammodel {

enum class Outcome { kAccept, kIgnore, kStreamError, kConnectionError };

const char* name(Outcome o) {
  switch (o) {
    case Outcome::kAccept:
      return "accept";
    case Outcome::kIgnore:
      return "ignore";
    case Outcome::kStreamError:
      return "stream error";
    case Outcome::kConnectionError:
      return "connection error";
  }
  return "?";
}

struct Verdict {
  Outcome outcome = Outcome::kIgnore;
  ErrorCode code = ErrorCode::kNoError;  // for the errors
};

constexpr std::int64_t kWindow = 65535;

// Our end, as the model sees it.
struct Model {
  enum class State { kOpen, kHalfClosedLocal, kHalfClosedRemote };
  struct Stream {
    State state = State::kOpen;
    bool head_done = false;  // the request's head; a client's: the final response head
    bool head_sent = false;  // a server's: its response head went
    std::int64_t send = kWindow, recv = kWindow;
  };
  // A stream we reset that the peer may not have seen reset: what it may still send.
  struct Reset {
    std::int64_t window = 0;
    int blocks = 0;
    bool ended = false;
  };

  bool server;
  SessionLimits limits;
  std::map<std::uint32_t, Stream> open;
  std::map<std::uint32_t, Reset> reset;
  std::set<std::uint32_t> uncovered;                       // resets no PING went after
  std::map<std::string, std::set<std::uint32_t>> covered;  // by PING payload
  std::uint32_t last = 0;
  std::int64_t conn_send = kWindow, conn_recv = kWindow;
  std::size_t resets = 0, empties = 0, completed = 0;
  std::uint32_t peer_max = 100;

  // One reset or empty frame more; false past the budget (the connection ends).
  bool charge() { return ++resets <= limits.reset_budget + completed; }
  void end_local(std::uint32_t id) {
    Stream& s = open[id];
    if (s.state == State::kHalfClosedRemote) {
      open.erase(id);
      ++completed;
    } else {
      s.state = State::kHalfClosedLocal;
    }
  }
  void end_remote(std::uint32_t id) {
    Stream& s = open[id];
    if (s.state == State::kHalfClosedLocal) {
      open.erase(id);
      ++completed;
    } else {
      s.state = State::kHalfClosedRemote;
    }
  }
  void remember(std::uint32_t id, std::int64_t window, int blocks, bool ended) {
    reset[id] = {window, blocks, ended};
    uncovered.insert(id);
  }
  // We reset open stream `id` (our choice, or its error).
  void close(std::uint32_t id) {
    const Stream& s = open[id];
    remember(id, s.recv, s.head_done ? 1 : 4, s.state == State::kHalfClosedRemote);
    open.erase(id);
  }
  Verdict stream_error(std::uint32_t id, ErrorCode code) {
    if (!charge()) return {Outcome::kConnectionError, ErrorCode::kEnhanceYourCalm};
    if (open.contains(id)) close(id);
    return {Outcome::kStreamError, code};
  }

  Verdict data(std::uint32_t id, std::int64_t length, bool empty, bool end) {
    if (id > last) return {Outcome::kConnectionError, ErrorCode::kProtocolError};
    if (length > conn_recv) return {Outcome::kConnectionError, ErrorCode::kFlowControlError};
    conn_recv -= length;
    if (empty && !end && ++empties > limits.empty_frame_budget + completed) {
      return {Outcome::kConnectionError, ErrorCode::kEnhanceYourCalm};
    }
    auto it = open.find(id);
    if (it == open.end()) {
      auto r = reset.find(id);
      if (r != reset.end() && !r->second.ended) {
        if (length <= r->second.window) {
          r->second.window -= length;
          r->second.ended = end;
          return {Outcome::kIgnore};
        }
        reset.erase(r);
        return stream_error(id, ErrorCode::kFlowControlError);
      }
      return stream_error(id, ErrorCode::kStreamClosed);
    }
    Stream& s = it->second;
    if (s.state == State::kHalfClosedRemote) return stream_error(id, ErrorCode::kStreamClosed);
    if (!s.head_done) return stream_error(id, ErrorCode::kProtocolError);
    if (length > s.recv) return stream_error(id, ErrorCode::kFlowControlError);
    s.recv -= length;
    if (end) end_remote(id);
    return {Outcome::kAccept};
  }

  // A header block; `interim`: a 1xx head; `trailers_malformed`: trailers without END_STREAM.
  Verdict headers(std::uint32_t id, bool end, bool interim) {
    if (!server && id > last) return {Outcome::kConnectionError, ErrorCode::kProtocolError};
    if (id > last) {  // a new request
      last = id;
      if (open.size() >= limits.max_concurrent_streams) {
        if (!charge()) return {Outcome::kConnectionError, ErrorCode::kEnhanceYourCalm};
        remember(id, kWindow, 1, end);
        return {Outcome::kStreamError, ErrorCode::kRefusedStream};
      }
      open[id] = {end ? State::kHalfClosedRemote : State::kOpen, true, false, kWindow, kWindow};
      return {Outcome::kAccept};
    }
    auto it = open.find(id);
    if (it == open.end()) {
      auto r = reset.find(id);
      if (r == reset.end() || r->second.ended) {
        return {Outcome::kConnectionError, ErrorCode::kStreamClosed};
      }
      if (r->second.blocks > 0) {
        --r->second.blocks;
      } else if (!charge()) {
        return {Outcome::kConnectionError, ErrorCode::kEnhanceYourCalm};
      }
      r->second.ended = end;
      return {Outcome::kIgnore};
    }
    Stream& s = it->second;
    if (s.state == State::kHalfClosedRemote) return stream_error(id, ErrorCode::kStreamClosed);
    const bool trailers = s.head_done;
    if ((trailers && !end) || (interim && end)) return stream_error(id, ErrorCode::kProtocolError);
    if (!trailers && !interim) s.head_done = true;
    if (end) end_remote(id);
    return {Outcome::kAccept};
  }

  Verdict rst(std::uint32_t id, ErrorCode code) {
    if (id > last) return {Outcome::kConnectionError, ErrorCode::kProtocolError};
    if (reset.erase(id) != 0) return {Outcome::kIgnore};  // crossed ours
    auto it = open.find(id);
    if (it != open.end() && !server && it->second.state == State::kHalfClosedRemote &&
        code == ErrorCode::kNoError) {
      open.erase(it);  // RFC 9113 §8.1: the answer was whole
      ++completed;
      return {Outcome::kAccept};
    }
    if ((server || it == open.end()) && !charge()) {
      return {Outcome::kConnectionError, ErrorCode::kEnhanceYourCalm};
    }
    if (it == open.end()) return {Outcome::kIgnore};
    open.erase(it);
    return {Outcome::kAccept};
  }

  Verdict window_update(std::uint32_t id, std::int64_t increment) {
    if (id == 0) {
      conn_send += increment;
      return {Outcome::kAccept};
    }
    if (id > last) return {Outcome::kConnectionError, ErrorCode::kProtocolError};
    auto it = open.find(id);
    if (it == open.end()) return {Outcome::kIgnore};
    it->second.send += increment;
    return {Outcome::kAccept};
  }

  void ping_ack(const std::string& payload) {
    for (std::uint32_t id : covered[payload]) reset.erase(id);
    covered.erase(payload);
  }

  // Our DATA: what the windows let go.
  std::int64_t send_data(std::uint32_t id, std::int64_t n, bool end) {
    Stream& s = open[id];
    const std::int64_t k = std::min(n, std::max<std::int64_t>(0, std::min(s.send, conn_send)));
    s.send -= k;
    conn_send -= k;
    if (end && k == n) end_local(id);
    return k;
  }
  bool can_open() const { return open.size() + reset.size() < peer_max; }
};

// The peer, as it knows the connection: what it has seen of our frames.
struct PeerStream {
  bool begun = false;      // it opened the stream (or saw our request's head)
  bool sent_end = false;   // it sent END_STREAM
  bool saw_end = false;    // it saw ours
  bool saw_reset = false;  // it saw our RST_STREAM
  bool reset = false;      // it sent RST_STREAM
  bool head_sent = false;  // (a server) its final head went
  bool broke = false;      // it sent past the stream's window: it sends nothing more there
  std::int64_t send = kWindow;
  bool closed() const { return saw_reset || reset || (sent_end && saw_end); }
  bool may_send() const { return begun && !sent_end && !saw_reset && !reset && !broke; }
};

struct OurFrame {
  FrameType kind;
  std::uint8_t flags;
  std::uint32_t stream;
  std::uint32_t value;  // RST_STREAM's code, WINDOW_UPDATE's increment
  std::string payload;  // PING's
};

std::vector<OurFrame> parse(const std::string& out) {
  std::vector<OurFrame> frames;
  FrameReader reader(1 << 24);
  std::string_view bytes_ = out;
  if (bytes_.starts_with("PRI ")) bytes_.remove_prefix(24);
  (void)reader.feed(bytes(bytes_), [&](const Frame& f) {
    std::uint32_t value = f.kind() == FrameType::kWindowUpdate ? f.increment : f.error_code;
    frames.push_back(
        {f.kind(), f.flags, f.stream_id, value,
         std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size())});
    return true;
  });
  return frames;
}

// What the handler was told during one call.
struct Told : SessionHandler {
  std::set<std::uint32_t> events;              // streams with any event
  std::map<std::uint32_t, std::int64_t> held;  // DATA delivered, not yet consumed
  bool window0 = false;
  void on_field(std::uint32_t, const spindle::http::Field&) override {}
  void on_headers(std::uint32_t id, bool, bool) override { events.insert(id); }
  void on_data(std::uint32_t id, std::span<const std::uint8_t> d, bool) override {
    events.insert(id);
    held[id] += static_cast<std::int64_t>(d.size());
  }
  void on_reset(std::uint32_t id, ErrorCode) override { events.insert(id); }
  void on_window(std::uint32_t id) override {
    if (id == 0) window0 = true;
    events.insert(id);
  }
};

class ModelRun {
 public:
  ModelRun(bool server, std::uint32_t seed, SessionLimits limits)
      : random_(seed),
        server_(server),
        breaks_(seed % 2 == 0),
        limits_(limits),
        model_{server, limits} {
    if (server) {
      session_ = std::make_unique<ServerSession>(limits, told_);
    } else {
      session_ = std::make_unique<ClientSession>(limits, told_);
      model_.peer_max = 4;
    }
    take_ours();
    std::string settings;
    if (server) {
      write::settings(settings, {});
    } else {
      const std::pair<SettingId, std::uint32_t> max[] = {{SettingId::kMaxConcurrentStreams, 4}};
      write::settings(settings, max);
    }
    std::string in = server ? "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings : settings;
    EXPECT_TRUE(session_->receive(bytes(in)));
    take_ours();
  }

  // Runs `steps` steps; false once the connection ended (as the model said it would).
  void go(int steps) {
    for (step_ = 0; step_ < steps && !ended_; ++step_) {
      const int dice = static_cast<int>(random_() % 100);
      if (dice < 15) {
        deliver();
      } else if (dice < 45) {
        ours();
      } else {
        for (int tries = 0; tries < 8 && !theirs(); ++tries) {
        }
      }
      if (!ended_) check_windows();
      if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return;
    }
  }

  std::size_t frames_judged() const { return judged_; }
  std::size_t crossing() const { return crossing_; }

 private:
  std::uint32_t pick(const std::vector<std::uint32_t>& ids) { return ids[random_() % ids.size()]; }
  bool chance(int percent) { return static_cast<int>(random_() % 100) < percent; }

  // What we wrote since the last call: seen by the model, on its way to the peer.
  std::vector<OurFrame> take_ours() {
    std::vector<OurFrame> frames = parse(session_->take_output());
    for (const OurFrame& f : frames) {
      if (f.kind == FrameType::kWindowUpdate) {
        if (f.stream == 0) {
          model_.conn_recv += f.value;
        } else if (model_.open.contains(f.stream)) {
          model_.open[f.stream].recv += f.value;
        }
      } else if (f.kind == FrameType::kPing && (f.flags & flag::kAck) == 0) {
        model_.covered[f.payload] = model_.uncovered;
        model_.uncovered.clear();
      }
      in_flight_.push_back(f);
    }
    return frames;
  }

  // Some of our frames reach the peer.
  void deliver() {
    std::size_t n = random_() % (in_flight_.size() + 1);
    for (std::size_t i = 0; i < n; ++i) {
      const OurFrame f = in_flight_.front();
      in_flight_.pop_front();
      PeerStream& p = view_[f.stream];
      switch (f.kind) {
        case FrameType::kWindowUpdate:
          (f.stream == 0 ? peer_conn_send_ : p.send) += f.value;
          break;
        case FrameType::kRstStream:
          p.saw_reset = true;
          break;
        case FrameType::kHeaders:
          if (!server_) p.begun = true;  // our request
          if (f.flags & flag::kEndStream) p.saw_end = true;
          break;
        case FrameType::kData:
          if (f.flags & flag::kEndStream) p.saw_end = true;
          break;
        case FrameType::kPing:
          if ((f.flags & flag::kAck) == 0) pings_.push_back(f.payload);
          break;
        default:
          break;
      }
    }
  }

  // One action of our end.
  void ours() {
    std::vector<std::uint32_t> open;
    for (const auto& [id, s] : model_.open) open.push_back(id);
    const int dice = static_cast<int>(random_() % 100);
    if (dice < 20 && !open.empty()) {  // a handler or a caller gives up
      std::uint32_t id = pick(open);
      session_->reset(id, ErrorCode::kCancel);
      model_.close(id);
    } else if (dice < 40) {  // the application reads what it held
      if (!told_.held.empty()) {
        auto it = told_.held.begin();
        std::advance(it, random_() % told_.held.size());
        const std::int64_t n = 1 + static_cast<std::int64_t>(random_() % it->second + 1) - 1;
        session_->consumed(it->first, static_cast<std::size_t>(std::min(n, it->second)));
        it->second -= std::min(n, it->second);
        if (it->second == 0) told_.held.erase(it);
      }
    } else if (!server_ && dice < 60) {  // a new request
      const bool end = chance(50);
      ASSERT_EQ(client().can_open(), model_.can_open());
      if (!model_.can_open()) return;
      const hpack::Field head[] = {
          {":method", "POST"}, {":scheme", "http"}, {":authority", "a"}, {":path", "/"}};
      std::uint32_t id = client().open(head, end);
      ASSERT_EQ(id, model_.last == 0 ? 1 : model_.last + 2);
      model_.last = id;
      model_.open[id] = {end ? Model::State::kHalfClosedLocal : Model::State::kOpen, false, true,
                         kWindow, kWindow};
    } else if (!open.empty()) {  // a head (a server's) or body bytes
      std::uint32_t id = pick(open);
      Model::Stream& s = model_.open[id];
      if (s.state == Model::State::kHalfClosedLocal) return;
      const bool end = chance(45);
      if (server_ && !s.head_sent) {
        const hpack::Field head[] = {{":status", "200"}};
        session_->submit_headers(id, head, end);
        s.head_sent = true;
        if (end) model_.end_local(id);
      } else {
        std::string data(random_() % 3000, 'o');
        std::int64_t sent = static_cast<std::int64_t>(session_->submit_data(id, data, end));
        ASSERT_EQ(sent, model_.send_data(id, static_cast<std::int64_t>(data.size()), end)) << id;
      }
    }
    for (const OurFrame& f : take_ours()) {
      // Our own actions never make us reset a stream beyond the one we meant.
      if (f.kind == FrameType::kRstStream) {
        ASSERT_EQ(f.value, static_cast<std::uint32_t>(ErrorCode::kCancel));
      }
      ASSERT_NE(f.kind, FrameType::kGoaway);
    }
  }

  ClientSession& client() { return static_cast<ClientSession&>(*session_); }

  // One frame of the peer's: one it may send as it knows the connection, or now and then one
  // that breaks a rule.
  bool theirs() {
    std::string frame;
    std::uint32_t id = 0;
    Verdict expected;
    bool legal = true;
    // The streams it may send on, as it knows them.
    std::vector<std::uint32_t> live;
    for (const auto& [sid, p] : view_) {
      if (sid != 0 && p.may_send()) live.push_back(sid);
    }
    const int dice = static_cast<int>(random_() % 100);
    if (!pings_.empty() && dice < 10) {
      write::ping(frame,
                  std::span<const std::uint8_t, 8>(
                      reinterpret_cast<const std::uint8_t*>(pings_.front().data()), 8),
                  true);
      model_.ping_ack(pings_.front());
      pings_.pop_front();
      expected = {Outcome::kIgnore};
    } else if (breaks_ && (random_() % 100 == 0 || (chance(10) && crossing_break()))) {
      // A rule broken, now and then (more often while a stream we reset is in its reach: it
      // may still send on it, within the window it had and until it ends it).
      legal = false;
      broken(frame, id, expected);
      if (ended_ || ::testing::Test::HasFailure()) return true;
    } else if (server_ && dice < 30 && open_in_view() < limits_.max_concurrent_streams) {
      id = next_id_;
      next_id_ += 2;
      const bool end = chance(40);
      write::headers(
          frame, id,
          block({{":method", "POST"}, {":scheme", "http"}, {":path", "/"}, {":authority", "a"}}),
          end);
      view_[id].begun = true;
      view_[id].sent_end = end;
      expected = model_.headers(id, end, false);
    } else if (!live.empty() && dice < 45) {
      id = pick(live);
      PeerStream& p = view_[id];
      if (!server_ && !p.head_sent) {
        const bool interim = chance(25);
        const bool end = !interim && chance(30);
        write::headers(frame, id, block({{":status", interim ? "103" : "200"}}), end);
        p.head_sent = !interim;
        p.sent_end = end;
        expected = model_.headers(id, end, interim);
      } else {
        write::headers(frame, id, block({{"x-trailer", "t"}}), true);
        p.sent_end = true;
        expected = model_.headers(id, true, false);
      }
    } else if (!live.empty() && dice < 80) {
      id = pick(live);
      PeerStream& p = view_[id];
      if (!server_ && !p.head_sent) return false;  // (DATA before the head is a broken rule)
      const std::int64_t room = std::min(p.send, peer_conn_send_);
      std::int64_t n = room <= 0 ? 0 : static_cast<std::int64_t>(random_() % (room + 1));
      n = std::min<std::int64_t>(n, 16384);
      const bool end = chance(20);
      const bool padded = n > 0 && chance(15);
      if (n == 0 && !end && chance(50)) return false;  // (an empty frame now and then)
      if (padded) {
        const std::int64_t pad = std::min<std::int64_t>(n - 1, 10);
        write::frame_header(frame, static_cast<std::uint32_t>(n), FrameType::kData,
                            static_cast<std::uint8_t>(flag::kPadded | (end ? flag::kEndStream : 0)),
                            id);
        frame += static_cast<char>(pad);
        frame.append(static_cast<std::size_t>(n - 1), 'd');  // data, then the padding
        expected = model_.data(id, n, n - 1 - pad == 0, end);
      } else {
        write::data(frame, id, std::string(static_cast<std::size_t>(n), 'd'), end);
        expected = model_.data(id, n, n == 0, end);
      }
      p.send -= n;
      peer_conn_send_ -= n;
      p.sent_end = end;
    } else if (dice < 90) {
      // A reset, of a stream it has not seen closed: CANCEL, or (a server that answered
      // whole) NO_ERROR to stop the request's body.
      std::vector<std::uint32_t> resettable;
      for (const auto& [sid, p] : view_) {
        if (sid != 0 && p.begun && !p.closed()) resettable.push_back(sid);
      }
      if (resettable.empty()) return false;
      id = pick(resettable);
      PeerStream& p = view_[id];
      const ErrorCode code =
          !server_ && p.sent_end && !p.saw_end ? ErrorCode::kNoError : ErrorCode::kCancel;
      write::rst_stream(frame, id, code);
      p.reset = true;
      expected = model_.rst(id, code);
    } else {
      std::vector<std::uint32_t> targets = {0};
      for (const auto& [sid, p] : view_) {
        if (sid != 0 && p.begun && !p.closed()) targets.push_back(sid);
      }
      id = pick(targets);
      const std::uint32_t increment = 1 + random_() % 20000;
      write::window_update(frame, id, increment);
      expected = model_.window_update(id, increment);
    }
    judge(frame, id, expected, legal);
    return true;
  }

  // Some stream we reset that the peer has not seen reset.
  bool crossing_break() {
    for (const auto& [sid, r] : model_.reset) {
      if (!view_[sid].saw_reset && !view_[sid].reset) return true;
    }
    return false;
  }

  // A frame that breaks a rule (as it knows the connection, or not).
  void broken(std::string& frame, std::uint32_t& id, Verdict& expected) {
    std::vector<std::uint32_t> begun;
    for (const auto& [sid, p] : view_) {
      if (sid != 0 && p.begun) begun.push_back(sid);
    }
    // (A third of them DATA past a window: on a stream we reset, what it may still send is
    // bounded all the same; and, a server's, streams past the limit now and then.)
    const int kind = chance(30) ? 1 : static_cast<int>(random_() % 13);
    if (kind == 12 && server_) {  // streams past the limit (as if our SETTINGS were late)
      const auto request = [&](std::uint32_t sid) {
        std::string out;
        write::headers(
            out, sid,
            block({{":method", "POST"}, {":scheme", "http"}, {":path", "/"}, {":authority", "a"}}),
            false);
        return out;
      };
      while (model_.open.size() < limits_.max_concurrent_streams && !ended_) {
        id = next_id_;
        next_id_ += 2;
        view_[id].begun = true;
        judge(request(id), id, model_.headers(id, false, false), false);
        if (::testing::Test::HasFailure()) return;
      }
      if (ended_) return;
      id = next_id_;
      next_id_ += 2;
      write::headers(
          frame, id,
          block({{":method", "POST"}, {":scheme", "http"}, {":path", "/"}, {":authority", "a"}}),
          false);
      view_[id].begun = true;  // its body may follow before it sees the refusal
      expected = model_.headers(id, false, false);
      return;
    }
    if (kind == 0 || begun.empty()) {  // DATA on a stream nobody opened
      id = (server_ ? next_id_ : model_.last + 2) + 2 * static_cast<std::uint32_t>(random_() % 3);
      write::data(frame, id, "x", false);
      expected = model_.data(id, 1, false, false);
      return;
    }
    // Mostly on a stream still open here (where the errors are the stream's), else any.
    std::vector<std::uint32_t> open_here;
    for (std::uint32_t sid : begun) {
      if (model_.open.contains(sid)) open_here.push_back(sid);
    }
    id = !open_here.empty() && chance(70) ? pick(open_here) : pick(begun);
    PeerStream& p = view_[id];
    if (kind == 1) {  // DATA past the stream's window, as it knows it (one we reset, if any)
      for (std::uint32_t sid : begun) {
        if (view_[sid].may_send() && model_.reset.contains(sid) && !view_[sid].saw_reset) id = sid;
      }
      PeerStream& p = view_[id];
      if (!p.may_send() || (!server_ && !p.head_sent)) return broken_trailers(frame, id, expected);
      // The window spent first, a frame at a time (frames it may send), then one byte past it.
      while (p.send >= 16384 && peer_conn_send_ > 16384 && !ended_) {
        std::string drain;
        write::data(drain, id, std::string(16384, 'd'), false);
        p.send -= 16384;
        peer_conn_send_ -= 16384;
        judge(drain, id, model_.data(id, 16384, false, false), true);
        if (::testing::Test::HasFailure()) return;
      }
      const std::int64_t n = std::max<std::int64_t>(p.send + 1, 1);
      if (ended_ || n > 16384 || n > peer_conn_send_) {
        return broken_trailers(frame, id, expected);
      }
      write::data(frame, id, std::string(static_cast<std::size_t>(n), 'd'), false);
      p.send -= n;
      p.broke = true;
      peer_conn_send_ -= n;
      expected = model_.data(id, n, false, false);
    } else if (kind >= 5 && kind <= 8) {  // DATA after it ended or saw the stream reset
      for (std::uint32_t sid : begun) {   // (after its END_STREAM on one we reset, if any)
        if (view_[sid].sent_end && model_.reset.contains(sid)) id = sid;
      }
      PeerStream& p = view_[id];
      if (!p.sent_end && !p.saw_reset && !p.reset) return broken_trailers(frame, id, expected);
      write::data(frame, id, "late", false);
      p.send -= 4;
      peer_conn_send_ -= 4;
      expected = model_.data(id, 4, false, false);
    } else if (kind == 3 || kind == 4) {  // a header block after it ended or saw the reset
      if (!p.sent_end && !p.saw_reset && !p.reset) return broken_trailers(frame, id, expected);
      write::headers(frame, id, block({{"x-late", "1"}}), true);
      expected = model_.headers(id, true, false);
    } else {  // 2, 9, 10, 11, 12 (a client's)
      broken_trailers(frame, id, expected);
    }
  }
  // Trailers that do not end the stream.
  void broken_trailers(std::string& frame, std::uint32_t id, Verdict& expected) {
    frame.clear();
    PeerStream& p = view_[id];
    if (!server_ && !p.head_sent) {  // DATA before the response's head
      write::data(frame, id, "early", false);
      p.send -= 5;
      peer_conn_send_ -= 5;
      expected = model_.data(id, 5, false, false);
      return;
    }
    write::headers(frame, id, block({{"x-t", "1"}}), false);
    expected = model_.headers(id, false, false);
  }

  std::size_t open_in_view() const {
    std::size_t n = 0;
    for (const auto& [sid, p] : view_) n += sid != 0 && p.begun && !p.closed() ? 1 : 0;
    return n;
  }

  std::string block(std::vector<hpack::Field> fields) {
    std::string out;
    encoder_.encode(fields, out);
    return out;
  }

  // Feeds one frame of the peer's; the session must do what the model said.
  void judge(const std::string& frame, std::uint32_t id, Verdict expected, bool legal) {
    ++judged_;
    const bool crossing = model_.reset.contains(id) && !view_[id].saw_reset;
    told_.events.clear();
    const bool alive = session_->receive(bytes(frame));
    Verdict seen{Outcome::kIgnore};
    std::vector<OurFrame> out = take_ours();
    for (const OurFrame& f : out) {
      if (f.kind == FrameType::kRstStream && f.stream == id) {
        seen = {Outcome::kStreamError, static_cast<ErrorCode>(f.value)};
      }
    }
    if (!alive) {
      seen = {Outcome::kConnectionError, ErrorCode::kNoError};
      for (const OurFrame& f : out) {
        if (f.kind == FrameType::kGoaway) seen.code = static_cast<ErrorCode>(f.value);
      }
      ended_ = true;
    } else if (seen.outcome != Outcome::kStreamError && told_.events.contains(id)) {
      seen = {Outcome::kAccept};
    }
    const std::string what = ::testing::PrintToString(parse(frame).size()) + " frame(s), type " +
                             std::to_string(frame.size() > 3 ? frame[3] : -1) + " on stream " +
                             std::to_string(id) + " at step " + std::to_string(step_);
    ASSERT_EQ(std::string(name(seen.outcome)), name(expected.outcome)) << what;
    if (seen.outcome == Outcome::kStreamError || seen.outcome == Outcome::kConnectionError) {
      ASSERT_EQ(seen.code, expected.code) << what;
    }
    if (crossing && legal) {
      // Sent before it saw our reset: ignored, whatever the stream's state.
      ++crossing_;
      ASSERT_TRUE(seen.outcome == Outcome::kIgnore) << what << ": " << name(seen.outcome);
    }
    if (legal && seen.outcome != Outcome::kAccept && seen.outcome != Outcome::kIgnore) {
      // A frame the peer may send is no error of its own (a budget spent aside).
      ASSERT_EQ(seen.code, ErrorCode::kEnhanceYourCalm) << what;
      ASSERT_EQ(seen.outcome, Outcome::kConnectionError) << what;
    }
  }

  // Both windows, the connection's and every open stream's, as the model counts them; none
  // lost.
  void check_windows() {
    const std::int64_t conn_window = std::max<std::int64_t>(kWindow, limits_.connection_window);
    auto conn = session_->windows(0);
    ASSERT_TRUE(conn.has_value());
    ASSERT_EQ(conn->send, model_.conn_send) << "step " << step_;
    ASSERT_EQ(conn->receive, model_.conn_recv) << "step " << step_;
    std::int64_t held = 0;
    for (const auto& [sid, n] : told_.held) held += n;
    const std::int64_t waiting = limits_.connection_window_on_receipt ? 0 : held;
    ASSERT_EQ(conn->receive + static_cast<std::int64_t>(conn->unacked) + waiting, conn_window)
        << "step " << step_ << ": connection window lost";
    ASSERT_EQ(session_->open_streams(), model_.open.size()) << "step " << step_;
    // Every reset and empty frame counted against the budgets, and nothing else.
    const Session::Spent spent = session_->spent();
    ASSERT_EQ(spent.resets, model_.resets) << "step " << step_;
    ASSERT_EQ(spent.empty_frames, model_.empties) << "step " << step_;
    ASSERT_EQ(spent.completed, model_.completed) << "step " << step_;
    ASSERT_EQ(session_->unacknowledged_resets(), model_.reset.size()) << "step " << step_;
    for (const auto& [sid, s] : model_.open) {
      auto w = session_->windows(sid);
      ASSERT_TRUE(w.has_value()) << sid;
      ASSERT_EQ(w->send, s.send) << "stream " << sid << " step " << step_;
      if (s.state == Model::State::kHalfClosedRemote) continue;  // it receives no more
      ASSERT_EQ(w->receive, s.recv) << "stream " << sid << " step " << step_;
      auto h = told_.held.find(sid);
      const std::int64_t mine = h == told_.held.end() ? 0 : h->second;
      ASSERT_EQ(w->receive + static_cast<std::int64_t>(w->unacked) + mine, kWindow)
          << "stream " << sid << " step " << step_ << ": window lost";
    }
  }

  std::mt19937 random_;
  bool server_;
  /// One run in two, the peer breaks a rule now and then (which may end the connection).
  bool breaks_;
  SessionLimits limits_;
  Model model_;
  Told told_;
  std::unique_ptr<Session> session_;
  hpack::Encoder encoder_;
  std::deque<OurFrame> in_flight_;
  std::map<std::uint32_t, PeerStream> view_;
  std::int64_t peer_conn_send_ = kWindow;
  std::deque<std::string> pings_;
  std::uint32_t next_id_ = 1;
  int step_ = 0;
  bool ended_ = false;
  std::size_t judged_ = 0, crossing_ = 0;
};

}  // namespace streammodel

using namespace streammodel;

TEST(H2StreamModel, BothEndsAgreeWithTheModelOnEveryFrameAndWindow) {
  struct Variant {
    const char* what;
    bool server;
    SessionLimits limits;
  };
  SessionLimits small;  // budgets that run out within a run
  small.reset_budget = 30;
  small.empty_frame_budget = 20;
  small.max_concurrent_streams = 8;
  SessionLimits roomy;
  roomy.max_concurrent_streams = 8;
  SessionLimits gateway = roomy;  // a gateway's client: the connection window on receipt
  gateway.connection_window_on_receipt = true;
  const Variant variants[] = {{"server", true, roomy},
                              {"server, small budgets", true, small},
                              {"client", false, roomy},
                              {"client, small budgets", false, small},
                              {"client, window on receipt", false, gateway}};
  for (const Variant& v : variants) {
    std::size_t frames = 0, crossing = 0;
    for (std::uint32_t seed = 1; seed <= 200; ++seed) {
      SCOPED_TRACE(testing::Message() << v.what << ", seed " << seed);
      ModelRun trial(v.server, seed, v.limits);
      trial.go(600);
      if (HasFailure()) return;
      frames += trial.frames_judged();

      crossing += trial.crossing();
    }
    // The runs did cross: frames sent before the peer saw our resets, in numbers.
    std::printf("%s: %zu frames judged, %zu of them sent before the peer saw our reset\n", v.what,
                frames, crossing);
    EXPECT_GT(crossing, 1000u) << v.what;
    EXPECT_GT(frames, 20000u) << v.what;
  }
}
