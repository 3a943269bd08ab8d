// The server session against nghttp2's client (a real peer: many streams, bodies both ways
// under flow control, bytes delivered whole or one at a time), and against hand-made frames for
// each rule a client can break: malformed requests reset, connection errors with their GOAWAY,
// and the floods (CONTINUATION, PING without reading, HPACK bomb) ended or bounded.
#include "spindle/h2/session.h"

#include <gtest/gtest.h>
#include <nghttp2/nghttp2.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "h2_testing.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace {

// Answers every complete request with 200 and a body of `body_size` bytes (or echoes the
// request body when there is one), sending as the windows allow.
class EchoHandler : public SessionHandler {
 public:
  ServerSession* session = nullptr;
  std::size_t body_size = 5;
  std::map<std::uint32_t, std::string> bodies;   // request bodies received
  std::map<std::uint32_t, std::string> pending;  // response bytes not yet sent
  std::map<std::uint32_t, std::vector<std::pair<std::string, std::string>>> fields;
  std::vector<std::pair<std::uint32_t, ErrorCode>> resets;

  void on_field(std::uint32_t id, const spindle::http::Field& f) override {
    EXPECT_EQ(f.token, spindle::http::find_token(f.name)) << f.name;
    fields[id].emplace_back(f.name, f.value);
  }
  void on_headers(std::uint32_t id, bool end_stream, bool) override {
    if (end_stream) respond(id);
  }
  void on_data(std::uint32_t id, std::span<const std::uint8_t> d, bool end_stream) override {
    bodies[id].append(reinterpret_cast<const char*>(d.data()), d.size());
    session->consumed(id, d.size());
    if (end_stream) respond(id);
  }
  void on_reset(std::uint32_t id, ErrorCode code) override {
    resets.emplace_back(id, code);
    pending.erase(id);
  }
  void on_window(std::uint32_t id) override {
    if (id == 0) {
      for (auto& [sid, _] : pending) push(sid);
    } else if (pending.contains(id)) {
      push(id);
    }
  }
  void respond(std::uint32_t id) {
    std::string body = bodies.contains(id) ? bodies[id] : std::string(body_size, 'r');
    const hpack::Field head[] = {{":status", "200"}, {"content-type", "text/plain"}};
    session->submit_headers(id, head, false);
    pending[id] = std::move(body);
    push(id);
  }
  void push(std::uint32_t id) {
    std::string& left = pending[id];
    std::size_t n = session->submit_data(id, left, true);
    left.erase(0, n);
    if (left.empty()) pending.erase(id);  // fully sent (end_stream went with the last byte)
  }
};

// nghttp2's client session, bytes exchanged with a ServerSession by hand.
struct Client {
  nghttp2_session* session = nullptr;
  std::map<std::int32_t, std::string> status, body;
  std::map<std::int32_t, std::uint32_t> closed;  // stream -> error code
  std::string upload;                            // a request body, offered to every POST
  std::map<std::int32_t, std::size_t> upload_at;

  Client() {
    nghttp2_session_callbacks* cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(
        cb, [](nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* n, std::size_t nl,
               const std::uint8_t* v, std::size_t vl, std::uint8_t, void* u) {
          auto* c = static_cast<Client*>(u);
          if (std::string_view(reinterpret_cast<const char*>(n), nl) == ":status") {
            c->status[f->hd.stream_id] = std::string(reinterpret_cast<const char*>(v), vl);
          }
          return 0;
        });
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        cb, [](nghttp2_session*, std::uint8_t, std::int32_t id, const std::uint8_t* d,
               std::size_t n, void* u) {
          static_cast<Client*>(u)->body[id].append(reinterpret_cast<const char*>(d), n);
          return 0;
        });
    nghttp2_session_callbacks_set_on_stream_close_callback(
        cb, [](nghttp2_session*, std::int32_t id, std::uint32_t code, void* u) {
          static_cast<Client*>(u)->closed[id] = code;
          return 0;
        });
    nghttp2_session_client_new(&session, cb, this);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, nullptr, 0);
  }
  ~Client() { nghttp2_session_del(session); }

  std::int32_t get(std::string_view path) { return submit("GET", path, false); }
  std::int32_t post(std::string_view path) { return submit("POST", path, true); }

  std::int32_t submit(std::string_view method, std::string_view path, bool with_body) {
    auto nv = [](std::string_view n, std::string_view v) {
      return nghttp2_nv{(std::uint8_t*)n.data(), (std::uint8_t*)v.data(), n.size(), v.size(),
                        NGHTTP2_NV_FLAG_NONE};
    };
    nghttp2_nv head[] = {nv(":method", method), nv(":scheme", "http"), nv(":path", path),
                         nv(":authority", "test")};
    nghttp2_data_provider provider{};
    provider.read_callback = [](nghttp2_session*, std::int32_t id, std::uint8_t* buf,
                                std::size_t length, std::uint32_t* flags, nghttp2_data_source*,
                                void* u) -> ssize_t {
      auto* c = static_cast<Client*>(u);
      std::size_t& at = c->upload_at[id];
      std::size_t n = std::min(length, c->upload.size() - at);
      std::memcpy(buf, c->upload.data() + at, n);
      at += n;
      if (at == c->upload.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
      return static_cast<ssize_t>(n);
    };
    return nghttp2_submit_request(session, nullptr, head, 4, with_body ? &provider : nullptr,
                                  nullptr);
  }
};

// Moves bytes both ways until neither side has anything to say; `piece` bytes at a time into
// the server (0: all at once).
void converse(Client& c, ServerSession& s, std::size_t piece = 0) {
  for (int round = 0; round < 10000; ++round) {
    std::string to_server;
    for (;;) {
      const std::uint8_t* data;
      auto n = nghttp2_session_mem_send(c.session, &data);
      ASSERT_GE(n, 0);
      if (n == 0) break;
      to_server.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
    }
    const auto* p = reinterpret_cast<const std::uint8_t*>(to_server.data());
    std::size_t step = piece == 0 ? std::max<std::size_t>(to_server.size(), 1) : piece;
    for (std::size_t at = 0; at < to_server.size(); at += step) {
      ASSERT_TRUE(s.receive({p + at, std::min(step, to_server.size() - at)}));
    }
    std::string to_client = s.take_output();
    if (!to_client.empty()) {
      auto n = nghttp2_session_mem_recv(
          c.session, reinterpret_cast<const std::uint8_t*>(to_client.data()), to_client.size());
      ASSERT_EQ(n, static_cast<ssize_t>(to_client.size()));
    }
    if (to_server.empty() && to_client.empty()) return;
  }
  FAIL() << "the conversation did not settle";
}

// Raw bytes a hand-made client sends: the preface and an empty SETTINGS first.
std::string preface() {
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  write::settings(out, {});
  return out;
}

std::string request_block(std::vector<hpack::Field> fields) {
  hpack::Encoder encoder;
  std::string block;
  encoder.encode(fields, block);
  return block;
}

// What the server wrote, as frames.
std::vector<Frame> frames_of(const std::string& out, std::vector<std::string>& keep) {
  keep.push_back(out);
  std::vector<Frame> frames;
  FrameReader reader(1 << 24);
  (void)reader.feed(
      std::span(reinterpret_cast<const std::uint8_t*>(keep.back().data()), keep.back().size()),
      [&](const Frame& f) {
        frames.push_back(f);
        return true;
      });
  return frames;
}

// Runs `input` into a fresh session; the frames it wrote, and whether it wants to go on.
struct Outcome {
  bool alive;
  std::vector<Frame> frames;
  std::vector<std::string> keep;
  EchoHandler handler;
};

std::unique_ptr<Outcome> run(const std::string& input, SessionLimits limits = {}) {
  auto o = std::make_unique<Outcome>();
  ServerSession session(limits, o->handler);
  o->handler.session = &session;
  o->alive = session.receive(bytes(input));
  o->frames = frames_of(session.take_output(), o->keep);
  return o;
}

const Frame* find(const Outcome& o, FrameType type) {
  for (const Frame& f : o.frames) {
    if (f.kind() == type) return &f;
  }
  return nullptr;
}

}  // namespace

TEST(H2Session, ManyStreamsFromNghttp2sClientAllAnswered) {
  for (std::size_t piece : {std::size_t{0}, std::size_t{1}, std::size_t{7}}) {
    Client client;
    EchoHandler handler;
    ServerSession session({}, handler);
    handler.session = &session;
    std::vector<std::int32_t> ids;
    for (int i = 0; i < 50; ++i) ids.push_back(client.get("/item/" + std::to_string(i)));
    converse(client, session, piece);
    for (std::int32_t id : ids) {
      EXPECT_EQ(client.status[id], "200") << id;
      EXPECT_EQ(client.body[id], "rrrrr") << id;
      EXPECT_EQ(client.closed[id], 0u) << id;
    }
    EXPECT_EQ(session.open_streams(), 0u);
    EXPECT_EQ(handler.fields[1].size(), 4u);
    EXPECT_EQ(handler.fields[1][2], (std::pair<std::string, std::string>{":path", "/item/0"}));
  }
}

TEST(H2Session, LargeBodiesBothWaysUnderFlowControl) {
  Client client;
  client.upload = std::string(1 << 20, 'u');
  for (std::size_t i = 0; i < client.upload.size(); i += 997) client.upload[i] = 'x';
  EchoHandler handler;
  SessionLimits limits;
  limits.stream_window = 65535;
  limits.connection_window = 65535;  // the smallest: every window refills many times
  ServerSession session(limits, handler);
  handler.session = &session;
  auto a = client.post("/echo");
  auto b = client.post("/echo");
  converse(client, session);
  EXPECT_EQ(handler.bodies[a], client.upload);
  EXPECT_EQ(client.body[a], client.upload);  // echoed back through the client's 64 KiB windows
  EXPECT_EQ(client.body[b], client.upload);
  EXPECT_EQ(session.open_streams(), 0u);
}

TEST(H2Session, MalformedRequestsAreResetAndTheConnectionGoesOn) {
  struct Case {
    std::vector<hpack::Field> fields;
    bool end_stream = true;
  };
  auto base = [](std::vector<hpack::Field> extra, bool drop_path = false) {
    std::vector<hpack::Field> f = {{":method", "GET"}, {":scheme", "https"}, {":authority", "a"}};
    if (!drop_path) f.push_back({":path", "/"});
    for (auto& e : extra) f.push_back(e);
    return f;
  };
  std::vector<Case> cases = {
      {base({{"X-Upper", "1"}})},                 // upper-case name
      {base({}, true)},                           // no :path
      {base({{"connection", "close"}})},          // connection-specific
      {base({{"te", "gzip"}})},                   // te other than trailers
      {base({{":unknown", "1"}})},                // unknown pseudo-header
      {base({{"a", "1"}, {":path", "/again"}})},  // pseudo after regular (and twice)
      {base({{"content-length", "5"}}), true},    // says 5, sends none
      {base({{"x", " padded"}})},                 // value with leading space
      {{{":method", "CONNECT"}, {":authority", "a"}, {":path", "/"}}},  // CONNECT with :path
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::string in = preface();
    write::headers(in, 1, request_block(cases[i].fields), cases[i].end_stream);
    // A good request after it: the connection serves on.
    write::headers(in, 3, request_block(base({})), true);
    auto o = run(in);
    EXPECT_TRUE(o->alive) << i;
    const Frame* rst = find(*o, FrameType::kRstStream);
    ASSERT_NE(rst, nullptr) << i;
    EXPECT_EQ(rst->stream_id, 1u) << i;
    EXPECT_EQ(rst->error_code, static_cast<std::uint32_t>(ErrorCode::kProtocolError)) << i;
    const Frame* answer = find(*o, FrameType::kHeaders);
    ASSERT_NE(answer, nullptr) << i;
    EXPECT_EQ(answer->stream_id, 3u) << i;
  }
}

// The decoder checks a dynamic table entry once, when it is added, and remembers the answer:
// a bad field the client put in the table is as bad every time a later block refers to it.
TEST(H2Session, ABadFieldInTheTableIsBadAtEveryReference) {
  for (hpack::Field bad : {hpack::Field{"x-padded", " 1"}, hpack::Field{"X-Upper", "1"},
                           hpack::Field{"x-nul", std::string_view("a\0b", 3)}}) {
    hpack::Encoder encoder;  // one for the connection: the second block refers to the table
    auto block = [&](bool with_bad) {
      std::vector<hpack::Field> f = {
          {":method", "GET"}, {":scheme", "https"}, {":authority", "a"}, {":path", "/"}};
      if (with_bad) f.push_back(bad);
      std::string out;
      encoder.encode(f, out);
      return out;
    };
    std::string in = preface();
    std::string first = block(true), second = block(true);
    write::headers(in, 1, first, true);
    write::headers(in, 3, second, true);
    write::headers(in, 5, block(false), true);
    ASSERT_LT(second.size(), first.size()) << bad.name;  // the field went by its index
    auto o = run(in);
    EXPECT_TRUE(o->alive) << bad.name;
    std::vector<std::uint32_t> reset, answered;
    for (const Frame& f : o->frames) {
      if (f.kind() == FrameType::kRstStream) reset.push_back(f.stream_id);
      if (f.kind() == FrameType::kHeaders) answered.push_back(f.stream_id);
    }
    EXPECT_EQ(reset, (std::vector<std::uint32_t>{1, 3})) << bad.name;
    EXPECT_EQ(answered, (std::vector<std::uint32_t>{5})) << bad.name;
  }
}

TEST(H2Session, ConnectionErrorsEndWithTheirGoaway) {
  std::string good = request_block(
      {{":method", "GET"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}});
  struct Case {
    std::string input;
    ErrorCode code;
  };
  std::vector<Case> cases;
  cases.push_back({"PRI * HTTP/1.1\r\n", ErrorCode::kProtocolError});  // not the preface
  {
    std::string in = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const std::uint8_t opaque[8] = {};
    write::ping(in, opaque, false);  // SETTINGS must come first
    cases.push_back({in, ErrorCode::kProtocolError});
  }
  {
    std::string in = preface();
    write::data(in, 1, "x", false);  // DATA on an idle stream
    cases.push_back({in, ErrorCode::kProtocolError});
  }
  {
    std::string in = preface();
    write::headers(in, 2, good, true);  // an even stream
    cases.push_back({in, ErrorCode::kProtocolError});
  }
  {
    std::string in = preface();
    write::headers(in, 1, std::string("\xff\xff\xff", 3), true);  // not HPACK
    cases.push_back({in, ErrorCode::kCompressionError});
  }
  {
    std::string in = preface();
    write::window_update(in, 0, 0x7fffffff);  // past 2^31-1
    cases.push_back({in, ErrorCode::kFlowControlError});
  }
  {
    std::string in = preface();
    write::headers(in, 1, good, true);
    write::headers(in, 1, good, true);  // HEADERS again on a stream that is closed
    cases.push_back({in, ErrorCode::kStreamClosed});
  }
  {
    // A CONTINUATION flood: a header block that never ends.
    std::string in = preface();
    write::frame_header(in, 1, FrameType::kHeaders, 0, 1);
    in += "\x82";
    for (int i = 0; i < 100; ++i) {
      write::frame_header(in, 1, FrameType::kContinuation, 0, 1);
      in += "\x82";
    }
    cases.push_back({in, ErrorCode::kEnhanceYourCalm});
  }
  {
    // Another frame inside a header block.
    std::string in = preface();
    write::frame_header(in, 1, FrameType::kHeaders, 0, 1);
    in += "\x82";
    write::window_update(in, 0, 1);
    cases.push_back({in, ErrorCode::kProtocolError});
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    auto o = run(cases[i].input);
    EXPECT_FALSE(o->alive) << i;
    const Frame* goaway = find(*o, FrameType::kGoaway);
    ASSERT_NE(goaway, nullptr) << i;
    EXPECT_EQ(goaway->error_code, static_cast<std::uint32_t>(cases[i].code)) << i;
  }
}

TEST(H2Session, APingFloodFromAClientThatDoesNotReadEndsTheConnection) {
  SessionLimits limits;
  limits.max_output = 64 * 1024;
  EchoHandler handler;
  ServerSession session(limits, handler);
  handler.session = &session;
  std::string in = preface();
  const std::uint8_t opaque[8] = {1};
  for (int i = 0; i < 10000; ++i) write::ping(in, opaque, false);
  EXPECT_FALSE(session.receive(bytes(in)));
  EXPECT_LT(session.output_size(), 64 * 1024 + 1024);  // bounded: not 10,000 acks
  std::vector<std::string> keep;
  auto frames = frames_of(session.take_output(), keep);
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames.back().kind(), FrameType::kGoaway);
  EXPECT_EQ(frames.back().error_code, static_cast<std::uint32_t>(ErrorCode::kEnhanceYourCalm));
}

TEST(H2Session, AnHpackBombIsRefusedAndTheTablesStayInStep) {
  SessionLimits limits;
  limits.max_header_list_size = 16 * 1024;
  hpack::Encoder encoder;
  std::string in = preface();
  // A request whose 4 KB field goes into the table, then one naming it 1,000 times.
  std::string first;
  std::vector<hpack::Field> head = {
      {":method", "GET"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}};
  std::string big(4000, 'b');
  auto with_big = head;
  with_big.push_back({"x-big", big});
  encoder.encode(with_big, first);
  write::headers(in, 1, first, true);
  std::string bomb;
  encoder.encode(head, bomb);
  for (int i = 0; i < 1000; ++i) hpack::encode_integer(62, 7, 0x80, bomb);
  write::headers(in, 3, bomb, true, 1 << 20);
  // And a plain request after it, encoded with the same (in step) table.
  std::string after;
  encoder.encode(head, after);
  write::headers(in, 5, after, true);
  auto o = run(in, limits);
  EXPECT_TRUE(o->alive);
  std::vector<std::uint32_t> answered, reset;
  for (const Frame& f : o->frames) {
    if (f.kind() == FrameType::kHeaders) answered.push_back(f.stream_id);
    if (f.kind() == FrameType::kRstStream) reset.push_back(f.stream_id);
  }
  EXPECT_EQ(answered, (std::vector<std::uint32_t>{1, 5}));
  EXPECT_EQ(reset, (std::vector<std::uint32_t>{3}));
  EXPECT_LE(o->handler.fields[3].size(), 16u * 1024 / 4000);
}

TEST(H2Session, StreamsBeyondTheLimitAreRefused) {
  SessionLimits limits;
  limits.max_concurrent_streams = 2;
  std::string in = preface();
  std::string block = request_block(
      {{":method", "POST"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}});
  for (std::uint32_t id : {1u, 3u, 5u}) write::headers(in, id, block, false);  // left open
  auto o = run(in, limits);
  EXPECT_TRUE(o->alive);
  const Frame* rst = find(*o, FrameType::kRstStream);
  ASSERT_NE(rst, nullptr);
  EXPECT_EQ(rst->stream_id, 5u);
  EXPECT_EQ(rst->error_code, static_cast<std::uint32_t>(ErrorCode::kRefusedStream));
}

namespace {

std::string get_block() {
  return request_block(
      {{":method", "GET"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}});
}

ErrorCode goaway_code(const Outcome& o) {
  const Frame* g = find(o, FrameType::kGoaway);
  return g ? static_cast<ErrorCode>(g->error_code) : ErrorCode::kNoError;
}

}  // namespace

TEST(H2Session, RapidResetEndsTheConnectionAfterItsBudget) {
  // CVE-2023-44487: streams opened and reset at once, never completed.
  std::string in = preface();
  std::string block = request_block(
      {{":method", "POST"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}});
  for (std::uint32_t id = 1; id < 2 * 5000; id += 2) {
    write::headers(in, id, block, false);
    write::rst_stream(in, id, ErrorCode::kCancel);
  }
  auto o = run(in);
  EXPECT_FALSE(o->alive);
  EXPECT_EQ(goaway_code(*o), ErrorCode::kEnhanceYourCalm);
  EXPECT_LE(o->handler.resets.size(), SessionLimits{}.reset_budget + 1);
}

TEST(H2Session, CompletedStreamsEarnResetsSoNormalUseIsNeverCut) {
  // A browser cancelling 1 stream in 4, over 2,000 streams: far more resets than the budget
  // alone, but each completed stream earns one.
  std::string in = preface();
  std::string block = get_block();
  for (std::uint32_t id = 1; id < 2 * 2000; id += 2) {
    bool cancel = (id / 2) % 4 == 3;
    write::headers(in, id, block, !cancel);
    if (cancel) write::rst_stream(in, id, ErrorCode::kCancel);
  }
  auto o = run(in);
  EXPECT_TRUE(o->alive);
  EXPECT_EQ(find(*o, FrameType::kGoaway), nullptr);
}

TEST(H2Session, AResetFloodMadeOfBadFramesEndsTheConnection) {
  // CVE-2019-9514: frames that each make us reset a stream.
  std::string in = preface();
  std::string block = request_block(
      {{":method", "POST"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}});
  for (std::uint32_t id = 1; id < 2 * 1000; id += 2) {
    write::headers(in, id, block, false);
    write::frame_header(in, 4, FrameType::kPriority, 0, id);  // PRIORITY of 4 bytes: reset
    in += std::string("\0\0\0\0", 4);
  }
  auto o = run(in);
  EXPECT_FALSE(o->alive);
  EXPECT_EQ(goaway_code(*o), ErrorCode::kEnhanceYourCalm);
}

TEST(H2Session, EmptyFrameAndSettingsFloodsEndTheConnection) {
  {
    // CVE-2019-9518: empty DATA frames on an open stream.
    std::string in = preface();
    std::string block = request_block(
        {{":method", "POST"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}});
    write::headers(in, 1, block, false);
    for (int i = 0; i < 1000; ++i) write::data(in, 1, "", false);
    auto o = run(in);
    EXPECT_FALSE(o->alive);
    EXPECT_EQ(goaway_code(*o), ErrorCode::kEnhanceYourCalm);
  }
  {
    // CVE-2019-9515: SETTINGS, each asking for an acknowledgement.
    std::string in = preface();
    for (int i = 0; i < 1000; ++i) write::settings(in, {});
    auto o = run(in);
    EXPECT_FALSE(o->alive);
    EXPECT_EQ(goaway_code(*o), ErrorCode::kEnhanceYourCalm);
  }
}

namespace {

std::vector<hpack::Field> get_head(std::string_view path = "/") {
  return {{":method", "GET"}, {":scheme", "http"}, {":path", path}, {":authority", "a"}};
}

// A handler that answers nothing by itself: the test drives the session.
class Recorder : public SessionHandler {
 public:
  std::vector<std::uint32_t> begun, heads, resets;
  std::vector<std::string> pings;
  bool answer_too_large = false;
  void on_request_begin(std::uint32_t id) override { begun.push_back(id); }
  void on_field(std::uint32_t, const spindle::http::Field&) override {}
  void on_headers(std::uint32_t id, bool, bool) override { heads.push_back(id); }
  void on_data(std::uint32_t, std::span<const std::uint8_t>, bool) override {}
  void on_reset(std::uint32_t id, ErrorCode) override { resets.push_back(id); }
  void on_window(std::uint32_t) override {}
  void on_ping_ack(std::span<const std::uint8_t, 8> p) override {
    pings.emplace_back(reinterpret_cast<const char*>(p.data()), 8);
  }
  bool on_head_too_large(std::uint32_t, bool) override { return answer_too_large; }
};

std::vector<FrameType> kinds(const std::vector<Frame>& frames) {
  std::vector<FrameType> out;
  for (const Frame& f : frames) out.push_back(f.kind());
  return out;
}

}  // namespace

TEST(H2Session, AnH2cUpgradeAppliesTheClientsSettingsAndServesStreamOne) {
  Recorder r;
  ServerSession session({}, r);
  (void)session.take_output();
  std::string settings;  // HTTP2-Settings, decoded: INITIAL_WINDOW_SIZE = 10
  for (std::uint8_t b : {0, 4, 0, 0, 0, 10}) settings += static_cast<char>(b);
  ASSERT_TRUE(session.upgrade(bytes(settings)));
  EXPECT_EQ(session.open_streams(), 1u);
  EXPECT_EQ(session.send_window(1), 10u);  // the client's window, as its settings said
  ASSERT_TRUE(session.receive(bytes(preface())));
  const hpack::Field head[] = {{":status", "200"}};
  session.submit_headers(1, head, false);
  EXPECT_EQ(session.submit_data(1, "0123456789abc", true), 10u);
  // Stream 1 was the upgrade request, its side closed: HEADERS on it again is a stream error.
  (void)session.take_output();
  std::string again;
  write::headers(again, 1, request_block(get_head()), true);
  ASSERT_TRUE(session.receive(bytes(again)));
  std::vector<std::string> keep;
  auto out = frames_of(session.take_output(), keep);
  ASSERT_EQ(out.size(), 2u);  // the reset, then the PING that tells when the client read it
  EXPECT_EQ(out[0].kind(), FrameType::kRstStream);
  EXPECT_EQ(out[0].error_code, static_cast<std::uint32_t>(ErrorCode::kStreamClosed));
  EXPECT_EQ(out[1].kind(), FrameType::kPing);
  EXPECT_TRUE(r.heads.empty());
  // Settings that are not whole entries, or out of range, refuse the upgrade, and the client
  // is told why (its 101 has gone).
  std::string too_wide;
  for (std::uint8_t b : {0, 4, 0x80, 0, 0, 0}) too_wide += static_cast<char>(b);
  const std::pair<std::string, ErrorCode> refused[] = {
      {settings.substr(0, 5), ErrorCode::kFrameSizeError},
      {too_wide, ErrorCode::kFlowControlError}};  // a window past 2^31-1
  for (const auto& [payload, code] : refused) {
    Recorder r2;
    ServerSession bad({}, r2);
    (void)bad.take_output();
    EXPECT_FALSE(bad.upgrade(bytes(payload)));
    EXPECT_EQ(bad.open_streams(), 0u);
    std::vector<std::string> kept;
    auto said = frames_of(bad.take_output(), kept);
    ASSERT_EQ(said.size(), 1u);
    EXPECT_EQ(said[0].kind(), FrameType::kGoaway);
    EXPECT_EQ(said[0].error_code, static_cast<std::uint32_t>(code));
  }
}

TEST(H2Session, AGracefulShutdownAnnouncesThenNamesTheLastStream) {
  Recorder r;
  ServerSession session({}, r);
  std::string in = preface();
  write::headers(in, 1, request_block(get_head()), true);
  ASSERT_TRUE(session.receive(bytes(in)));
  (void)session.take_output();
  const std::uint8_t ping[8] = {'s', 'h', 'u', 't', 'd', 'o', 'w', 'n'};
  session.shutdown_notice(ping);
  std::vector<std::string> keep;
  auto notice = frames_of(session.take_output(), keep);
  ASSERT_EQ(kinds(notice), (std::vector<FrameType>{FrameType::kGoaway, FrameType::kPing}));
  EXPECT_EQ(notice[0].other_stream, kMaxWindow);  // refuses nothing yet
  EXPECT_FALSE(session.closing());
  // A stream the client opened before it heard is still served; the PING's answer is told.
  std::string more;
  write::headers(more, 3, request_block(get_head()), true);
  write::ping(more, ping, true);
  ASSERT_TRUE(session.receive(bytes(more)));
  EXPECT_EQ(r.heads, (std::vector<std::uint32_t>{1, 3}));
  EXPECT_EQ(r.pings, (std::vector<std::string>{"shutdown"}));
  session.goaway(ErrorCode::kNoError);
  auto last = frames_of(session.take_output(), keep);
  ASSERT_EQ(kinds(last), (std::vector<FrameType>{FrameType::kGoaway}));
  EXPECT_EQ(last[0].other_stream, 3u);
  EXPECT_TRUE(session.closing());
  // After it, a new stream is not begun (its block is still read, for the table).
  std::string late;
  write::headers(late, 5, request_block(get_head()), true);
  ASSERT_TRUE(session.receive(bytes(late)));
  EXPECT_EQ(r.begun, (std::vector<std::uint32_t>{1, 3}));
}

TEST(H2Session, AGoawayNamesAtMostTheLastStreamBegun) {
  Recorder r;
  ServerSession session({}, r);
  std::string in = preface();
  for (std::uint32_t id : {1u, 3u, 5u}) write::headers(in, id, request_block(get_head()), true);
  ASSERT_TRUE(session.receive(bytes(in)));
  (void)session.take_output();
  session.goaway(ErrorCode::kEnhanceYourCalm, 3);
  std::vector<std::string> keep;
  auto out = frames_of(session.take_output(), keep);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].other_stream, 3u);
  EXPECT_EQ(out[0].error_code, static_cast<std::uint32_t>(ErrorCode::kEnhanceYourCalm));
  session.goaway(ErrorCode::kNoError, 99);  // never above the last begun
  out = frames_of(session.take_output(), keep);
  EXPECT_EQ(out[0].other_stream, 5u);
}

TEST(H2Session, WhatTheClientSentBeforeItKnewOfOurResetIsIgnoredNotAnError) {
  Recorder r;
  ServerSession session({}, r);
  std::string in = preface();
  write::headers(in, 1, request_block(get_head()), false);  // a body is coming
  ASSERT_TRUE(session.receive(bytes(in)));
  session.reset(1, ErrorCode::kCancel);
  (void)session.take_output();
  // In flight when we reset: body bytes and trailers. Ignored: no reset, no GOAWAY.
  std::string late;
  write::data(late, 1, "some body", false);
  write::headers(late, 1, request_block({{"x-trailer", "t"}}), true);
  ASSERT_TRUE(session.receive(bytes(late)));
  std::vector<std::string> keep;
  for (const Frame& f : frames_of(session.take_output(), keep)) {
    EXPECT_NE(f.kind(), FrameType::kRstStream);
    EXPECT_NE(f.kind(), FrameType::kGoaway);
  }
  // Once the client resets it too, it knows: DATA on it now is a stream error.
  std::string after;
  write::rst_stream(after, 1, ErrorCode::kCancel);
  write::data(after, 1, "x", false);
  ASSERT_TRUE(session.receive(bytes(after)));
  auto out = frames_of(session.take_output(), keep);
  const Frame* rst = nullptr;
  for (const Frame& f : out) {
    if (f.kind() == FrameType::kRstStream) rst = &f;
  }
  ASSERT_NE(rst, nullptr);
  EXPECT_EQ(rst->error_code, static_cast<std::uint32_t>(ErrorCode::kStreamClosed));
  // A stream never begun and closed is still a connection error.
  std::string bogus;
  write::headers(bogus, 1, request_block(get_head()), true);
  EXPECT_FALSE(session.receive(bytes(bogus)));
}

TEST(H2Session, AHeadTooLargeGoesToTheDriverWhenItAnswersIt) {
  for (bool answers : {false, true}) {
    Recorder r;
    r.answer_too_large = answers;
    SessionLimits limits;
    limits.max_header_list_size = 1024;
    ServerSession session(limits, r);
    std::string in = preface();
    auto head = get_head();
    std::string big(2000, 'b');
    head.push_back({"x-big", big});
    write::headers(in, 1, request_block(head), true);
    ASSERT_TRUE(session.receive(bytes(in)));
    std::vector<std::string> keep;
    auto out = frames_of(session.take_output(), keep);
    bool reset = false;
    for (const Frame& f : out) reset = reset || f.kind() == FrameType::kRstStream;
    EXPECT_EQ(reset, !answers);
    EXPECT_EQ(r.heads.size(), answers ? 1u : 0u);
    if (answers) {
      // It is a stream whose request is complete: the driver's answer ends it.
      const hpack::Field h431[] = {{":status", "431"}};
      session.submit_headers(1, h431, true);
      EXPECT_EQ(session.open_streams(), 0u);
    }
  }
}

TEST(H2Session, FloodsAimedAtAStreamWeResetStillEndTheConnection) {
  // Frames on a stream we reset are ignored (the client sent them before it knew), but not
  // for free: empty DATA frames count as empty frames, header blocks past the trailers a
  // request may still have as resets, and anything after the stream's end is the error it is.
  struct Flood {
    const char* what;
    bool headers, end_stream;
    ErrorCode code;
  };
  for (auto [what, headers, end_stream, code] :
       {Flood{"empty DATA", false, false, ErrorCode::kEnhanceYourCalm},
        Flood{"header blocks", true, false, ErrorCode::kEnhanceYourCalm},
        Flood{"header blocks after the end", true, true, ErrorCode::kStreamClosed}}) {
    SCOPED_TRACE(what);
    Recorder r;
    ServerSession session({}, r);
    std::string in = preface();
    write::headers(in, 1, request_block(get_head()), false);
    ASSERT_TRUE(session.receive(bytes(in)));
    session.reset(1, ErrorCode::kCancel);
    (void)session.take_output();
    std::string flood;
    hpack::Encoder encoder;
    for (int i = 0; i < 1000; ++i) {
      if (headers) {
        std::string block;
        encoder.encode({{"x-t", "1"}}, block);
        write::headers(flood, 1, block, end_stream);
      } else {
        write::data(flood, 1, "", false);
      }
    }
    EXPECT_FALSE(session.receive(bytes(flood)));
    std::vector<std::string> keep;
    auto out = frames_of(session.take_output(), keep);
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back().kind(), FrameType::kGoaway);
    EXPECT_EQ(out.back().error_code, static_cast<std::uint32_t>(code));
  }
}

// The table of open streams against a std::map, through openings and endings in every order
// a connection may see: in order, newest first, at random, with gaps, until empty and again.
TEST(H2Session, TheStreamTableAgreesWithAMap) {
  std::mt19937 random(20261126);
  for (int round = 0; round < 200; ++round) {
    StreamTableOf<std::uint64_t> table;
    std::map<std::uint32_t, std::uint64_t> model;
    std::uint32_t next = 1;
    for (int step = 0; step < 2000; ++step) {
      const int kind = static_cast<int>(random() % 10);
      if (kind < 4 || model.empty()) {  // a new stream, its id above all
        next += 2 * (1 + random() % 3);
        table.add(next) = next * 7;
        model[next] = next * 7;
      } else if (kind < 7) {  // the oldest ends (the usual order)
        auto oldest = model.begin()->first;
        ASSERT_TRUE(table.erase(oldest));
        model.erase(oldest);
      } else {  // one at random ends, or one that is not open
        auto it = model.begin();
        std::advance(it, random() % model.size());
        std::uint32_t id = random() % 4 == 0 ? it->first + 1 : it->first;
        ASSERT_EQ(table.erase(id), model.erase(id) == 1);
      }
      ASSERT_EQ(table.size(), model.size());
      if (!model.empty()) {
        ASSERT_EQ(table.highest(), model.rbegin()->first);
      }
      // Every open one found with its value, in order; a closed one not found.
      auto m = model.begin();
      for (const auto& [id, value] : table) {
        ASSERT_EQ(id, m->first);
        ASSERT_EQ(value, m->second);
        ASSERT_EQ(table.find(id), &value);
        ++m;
      }
      ASSERT_EQ(table.find(next + 2), nullptr);
    }
  }
}
