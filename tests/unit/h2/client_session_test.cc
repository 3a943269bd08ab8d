// The client session against spindle's own server session (many streams, bodies both ways
// under flow control, any split of the bytes), and against a hostile upstream made of
// hand-written frames: malformed responses, push, GOAWAY in the middle of streams, a window
// never opened, a concurrency limit, an HPACK bomb.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "h2_testing.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace {

// The client's side: records what each stream receives.
struct ClientRecorder : SessionHandler {
  ClientSession* session = nullptr;
  std::map<std::uint32_t, std::vector<std::pair<std::string, std::string>>> fields;
  std::map<std::uint32_t, std::string> body;
  std::map<std::uint32_t, int> heads;  // header blocks received (interim ones too)
  std::map<std::uint32_t, bool> ended;
  std::map<std::uint32_t, ErrorCode> resets;
  std::uint32_t goaway_last = 0;
  bool goaway = false;

  void on_field(std::uint32_t id, const spindle::http::Field& f) override {
    EXPECT_EQ(f.token, spindle::http::find_token(f.name)) << f.name;
    fields[id].emplace_back(f.name, f.value);
  }
  void on_headers(std::uint32_t id, bool end_stream, bool) override {
    ++heads[id];
    if (end_stream) ended[id] = true;
  }
  bool reads = true;  // whether it consumes what arrives (a caller that reads nothing does not)
  void on_data(std::uint32_t id, std::span<const std::uint8_t> d, bool end_stream) override {
    body[id].append(reinterpret_cast<const char*>(d.data()), d.size());
    if (reads) session->consumed(id, d.size());
    if (end_stream) ended[id] = true;
  }
  void on_reset(std::uint32_t id, ErrorCode code) override { resets[id] = code; }
  void on_window(std::uint32_t) override {}
  void on_goaway(std::uint32_t last, ErrorCode) override {
    goaway = true;
    goaway_last = last;
  }
};

// The server's side: echoes each request body (or answers "ok") once the request ended.
struct Echo : SessionHandler {
  ServerSession* session = nullptr;
  std::map<std::uint32_t, std::string> bodies, pending;
  void on_field(std::uint32_t, const spindle::http::Field&) override {}
  void on_headers(std::uint32_t id, bool end_stream, bool) override {
    if (end_stream) respond(id);
  }
  void on_data(std::uint32_t id, std::span<const std::uint8_t> d, bool end_stream) override {
    bodies[id].append(reinterpret_cast<const char*>(d.data()), d.size());
    session->consumed(id, d.size());
    if (end_stream) respond(id);
  }
  void on_reset(std::uint32_t, ErrorCode) override {}
  void on_window(std::uint32_t) override {
    for (auto it = pending.begin(); it != pending.end();) {
      std::string& left = it->second;
      left.erase(0, session->submit_data(it->first, left, true));
      it = left.empty() ? pending.erase(it) : std::next(it);
    }
  }
  void respond(std::uint32_t id) {
    const hpack::Field head[] = {{":status", "200"}, {"server", "echo"}};
    session->submit_headers(id, head, false);
    pending[id] = bodies.contains(id) ? bodies[id] : "ok";
    on_window(id);
  }
};

// Bytes both ways until both are quiet; `piece` bytes at a time each way (0: all at once).
// The client's request bodies in `uploads` are offered as its windows allow.
void converse(ClientSession& c, ServerSession& s, std::map<std::uint32_t, std::string>& uploads,
              std::size_t piece = 0) {
  for (int round = 0; round < 100000; ++round) {
    for (auto it = uploads.begin(); it != uploads.end();) {
      std::string& left = it->second;
      left.erase(0, c.submit_data(it->first, left, true));
      it = left.empty() ? uploads.erase(it) : std::next(it);
    }
    std::string to_server = c.take_output();
    std::string to_client = s.take_output();
    auto feed = [&](Session& into, const std::string& what) {
      std::size_t step = piece == 0 ? std::max<std::size_t>(what.size(), 1) : piece;
      for (std::size_t at = 0; at < what.size(); at += step) {
        ASSERT_TRUE(into.receive(bytes(std::string_view(what).substr(at, step))));
      }
    };
    feed(s, to_server);
    feed(c, to_client);
    if (to_server.empty() && to_client.empty() && uploads.empty()) return;
  }
  FAIL() << "the conversation did not settle";
}

std::vector<hpack::Field> request(std::string_view method = "GET") {
  return {{":method", method}, {":scheme", "http"}, {":authority", "up"}, {":path", "/x"}};
}

// A hand-written server: its SETTINGS, then whatever the test writes.
struct Hostile {
  ClientRecorder r;
  ClientSession client{SessionLimits{}, r};
  hpack::Encoder encoder;
  Hostile() {
    r.session = &client;
    std::string settings;
    write::settings(settings, {});
    EXPECT_TRUE(client.receive(bytes(settings)));
    (void)client.take_output();
  }
  std::string block(std::vector<hpack::Field> fields) {
    std::string out;
    encoder.encode(fields, out);
    return out;
  }
  // The frames the client wrote since the last call.
  std::vector<std::pair<FrameType, std::uint32_t>> written() {
    std::string out = client.take_output();
    std::vector<std::pair<FrameType, std::uint32_t>> frames;
    FrameReader reader(1 << 24);
    (void)reader.feed(bytes(out), [&](const Frame& f) {
      frames.emplace_back(f.kind(), f.kind() == FrameType::kRstStream ? f.error_code : 0);
      return true;
    });
    return frames;
  }
};

}  // namespace

TEST(H2Client, TalksToTheServerSessionWithBodiesBothWaysAtEverySplit) {
  for (auto [piece, on_receipt] : {std::pair{std::size_t{0}, false},
                                   {std::size_t{1}, false},
                                   {std::size_t{5}, false},
                                   {std::size_t{0}, true},
                                   {std::size_t{1}, true},
                                   {std::size_t{5}, true}}) {
    SCOPED_TRACE(testing::Message() << piece << (on_receipt ? " on receipt" : ""));
    ClientRecorder r;
    SessionLimits small;
    small.stream_window = 65535;
    small.connection_window = 65535;  // every window refills many times
    SessionLimits client_limits = small;
    client_limits.connection_window_on_receipt = on_receipt;  // as the gateway's client has it
    ClientSession client(client_limits, r);
    r.session = &client;
    Echo e;
    ServerSession server(small, e);
    e.session = &server;
    std::map<std::uint32_t, std::string> uploads;
    std::vector<std::uint32_t> gets, posts;
    std::string big(200 * 1024, 'u');
    for (std::size_t i = 0; i < big.size(); i += 991) big[i] = 'x';
    for (int i = 0; i < 10; ++i) gets.push_back(client.open(request(), true));
    for (int i = 0; i < (piece == 1 ? 1 : 3); ++i) {
      std::uint32_t id = client.open(request("POST"), false);
      posts.push_back(id);
      uploads[id] = big;
    }
    converse(client, server, uploads, piece);
    for (std::uint32_t id : gets) {
      EXPECT_EQ(r.body[id], "ok") << id;
      EXPECT_TRUE(r.ended[id]) << id;
      EXPECT_EQ(r.fields[id][0], (std::pair<std::string, std::string>{":status", "200"}));
    }
    for (std::uint32_t id : posts) {
      EXPECT_EQ(r.body[id], big) << id;  // echoed back through 64 KiB windows both ways
      EXPECT_EQ(e.bodies[id], big) << id;
    }
    EXPECT_TRUE(r.resets.empty());
    EXPECT_EQ(client.open_streams(), 0u);
    EXPECT_EQ(server.open_streams(), 0u);
  }
}

TEST(H2Client, MalformedResponsesResetTheirStreamAndTheConnectionGoesOn) {
  struct Case {
    std::vector<hpack::Field> head;
    bool end_stream;
  };
  const std::vector<Case> cases = {
      {{{"server", "x"}}, true},                              // no :status
      {{{":status", "200"}, {":status", "200"}}, true},       // twice
      {{{"server", "x"}, {":status", "200"}}, true},          // pseudo after regular
      {{{":status", "200"}, {":path", "/"}}, true},           // a request's pseudo-field
      {{{":status", "2000"}}, true},                          // not three digits
      {{{":status", "099"}}, true},                           // below 100
      {{{":status", "101"}}, true},                           // no 101 in HTTP/2
      {{{":status", "103"}}, true},                           // interim ending the stream
      {{{":status", "200"}, {"connection", "close"}}, true},  // connection-specific
      {{{":status", "200"}, {"Server", "x"}}, true},          // upper case
      {{{":status", "200"}, {"content-length", "5"}}, true},  // length without body
      {{{":status", "200"}, {"content-length", "x"}}, true},  // not a number
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Hostile h;
    std::uint32_t id = h.client.open(request(), true);
    std::string in;
    write::headers(in, id, h.block(cases[i].head), cases[i].end_stream);
    EXPECT_TRUE(h.client.receive(bytes(in))) << i;
    auto out = h.written();
    // HEADERS, then its reset, then the PING whose answer tells that the upstream read it.
    ASSERT_EQ(out.size(), 3u) << i;
    EXPECT_EQ(out[1].first, FrameType::kRstStream) << i;
    EXPECT_EQ(out[1].second, static_cast<std::uint32_t>(ErrorCode::kProtocolError)) << i;
    EXPECT_EQ(out[2].first, FrameType::kPing) << i;
    EXPECT_EQ(h.r.resets[id], ErrorCode::kProtocolError) << i;
    // The next stream is served.
    std::uint32_t next = h.client.open(request(), true);
    std::string ok;
    write::headers(ok, next, h.block({{":status", "204"}}), true);
    EXPECT_TRUE(h.client.receive(bytes(ok))) << i;
    EXPECT_TRUE(h.r.ended[next]) << i;
  }
}

TEST(H2Client, InterimHeadsThenTheFinalOneThenTrailers) {
  Hostile h;
  std::uint32_t id = h.client.open(request(), true);
  std::string in;
  write::headers(in, id, h.block({{":status", "103"}, {"link", "</a>"}}), false);
  write::headers(in, id, h.block({{":status", "200"}, {"content-length", "2"}}), false);
  write::data(in, id, "hi", false);
  write::headers(in, id, h.block({{"grpc-status", "0"}}), true);
  ASSERT_TRUE(h.client.receive(bytes(in)));
  EXPECT_EQ(h.r.heads[id], 3);
  EXPECT_EQ(h.r.body[id], "hi");
  EXPECT_TRUE(h.r.ended[id]);
  EXPECT_EQ(h.r.fields[id].back(), (std::pair<std::string, std::string>{"grpc-status", "0"}));
  EXPECT_TRUE(h.r.resets.empty());
  // A HEAD's response names a length and sends no body: that is no error.
  std::uint32_t head = h.client.open(request("HEAD"), true, true);
  std::string hin;
  write::headers(hin, head, h.block({{":status", "200"}, {"content-length", "10"}}), true);
  ASSERT_TRUE(h.client.receive(bytes(hin)));
  EXPECT_TRUE(h.r.ended[head]);
  EXPECT_FALSE(h.r.resets.contains(head));
}

TEST(H2Client, AGoawayInTheMiddleRefusesTheStreamsAboveItsLast) {
  Hostile h;
  std::uint32_t a = h.client.open(request(), true);
  std::uint32_t b = h.client.open(request(), true);
  std::uint32_t c = h.client.open(request(), true);
  std::string in;
  write::headers(in, a, h.block({{":status", "200"}}), false);
  write::goaway(in, a, ErrorCode::kNoError);
  write::data(in, a, "rest", true);
  ASSERT_TRUE(h.client.receive(bytes(in)));
  EXPECT_TRUE(h.r.goaway);
  EXPECT_EQ(h.r.goaway_last, a);
  EXPECT_EQ(h.r.resets[b], ErrorCode::kRefusedStream);  // never processed: safe to retry
  EXPECT_EQ(h.r.resets[c], ErrorCode::kRefusedStream);
  EXPECT_FALSE(h.r.resets.contains(a));
  EXPECT_EQ(h.r.body[a], "rest");  // the stream below it finished
  EXPECT_FALSE(h.client.can_open());
  EXPECT_EQ(h.client.open(request(), true), 0u);
}

TEST(H2Client, AWindowNeverOpenedSendsNothingAndTheLimitOfStreamsIsHonoured) {
  Hostile h;
  std::string settings;
  const std::pair<SettingId, std::uint32_t> entries[] = {{SettingId::kInitialWindowSize, 0},
                                                         {SettingId::kMaxConcurrentStreams, 2}};
  write::settings(settings, entries);
  ASSERT_TRUE(h.client.receive(bytes(settings)));
  std::uint32_t a = h.client.open(request("POST"), false);
  EXPECT_EQ(h.client.submit_data(a, "body", true), 0u);  // no window: nothing goes
  EXPECT_EQ(h.client.send_window(a), 0u);
  std::uint32_t b = h.client.open(request(), true);
  EXPECT_NE(b, 0u);
  EXPECT_FALSE(h.client.can_open());  // two open: the server said two
  EXPECT_EQ(h.client.open(request(), true), 0u);
  std::string done;
  write::headers(done, b, h.block({{":status", "204"}}), true);
  ASSERT_TRUE(h.client.receive(bytes(done)));
  EXPECT_TRUE(h.client.can_open());
  std::string window;
  write::window_update(window, a, 4);
  ASSERT_TRUE(h.client.receive(bytes(window)));
  EXPECT_EQ(h.client.submit_data(a, "body", true), 4u);
}

// A gateway's upstream connection carries many clients' streams. One whose client takes
// nothing holds its own stream's window, never the connection's: the connection's reopens as
// the bytes arrive, so the next stream's bytes still come. Without the option (a server's
// session), unread bytes hold the connection's window: the second stream's DATA overflows it.
TEST(H2Client, ACallerThatReadsNothingHoldsItsStreamsWindowNotTheConnections) {
  for (bool on_receipt : {true, false}) {
    SCOPED_TRACE(on_receipt);
    ClientRecorder r;
    r.reads = false;
    SessionLimits limits;
    limits.stream_window = 40000;
    limits.connection_window = 65535;
    limits.connection_window_on_receipt = on_receipt;
    ClientSession client(limits, r);
    r.session = &client;
    hpack::Encoder encoder;
    std::string settings;
    write::settings(settings, {});
    ASSERT_TRUE(client.receive(bytes(settings)));
    std::uint32_t a = client.open(request(), true);
    std::uint32_t b = client.open(request(), true);
    (void)client.take_output();
    auto answer = [&](std::uint32_t id) {
      std::string head, in;
      encoder.encode(std::vector<hpack::Field>{{":status", "200"}}, head);
      write::headers(in, id, head, false);
      for (std::size_t piece : {16000, 16000, 8000})
        write::data(in, id, std::string(piece, 'x'), false);
      return client.receive(bytes(in));
    };
    ASSERT_TRUE(answer(a));
    // WINDOW_UPDATE increments by stream in what the client wrote since the last call.
    auto window_updates = [&client] {
      std::map<std::uint32_t, std::uint32_t> updates;
      FrameReader reader;
      (void)reader.feed(bytes(client.take_output()), [&](const Frame& f) {
        if (f.kind() == FrameType::kWindowUpdate) updates[f.stream_id] += f.increment;
        return true;
      });
      return updates;
    };
    std::map<std::uint32_t, std::uint32_t> updates = window_updates();
    EXPECT_FALSE(updates.contains(a));  // nothing read: the stream's window stays spent
    if (on_receipt) {
      EXPECT_EQ(updates[0], 40000u);
      EXPECT_TRUE(answer(b));
      EXPECT_EQ(r.body[b].size(), 40000u);
      EXPECT_EQ(window_updates()[0], 40000u);
      // Read at last, the bytes reopen their stream's window; the connection's was given once.
      client.consumed(a, 40000);
      updates = window_updates();
      EXPECT_EQ(updates[a], 40000u);
      EXPECT_FALSE(updates.contains(0));
    } else {
      EXPECT_FALSE(updates.contains(0));
      EXPECT_FALSE(answer(b));  // past the connection's window: a FLOW_CONTROL_ERROR
    }
  }
}

TEST(H2Client, PushAndServerStreamsAreConnectionErrors) {
  {
    Hostile h;
    h.client.open(request(), true);
    std::string in;
    write::frame_header(in, 4, FrameType::kPushPromise, flag::kEndHeaders, 1);
    in += std::string("\0\0\0\2", 4);
    EXPECT_FALSE(h.client.receive(bytes(in)));
  }
  {
    Hostile h;
    std::string in;
    write::headers(in, 2, h.block({{":status", "200"}}), true);  // an even stream
    EXPECT_FALSE(h.client.receive(bytes(in)));
  }
  {
    Hostile h;
    std::string in;
    write::headers(in, 7, h.block({{":status", "200"}}), true);  // never opened
    EXPECT_FALSE(h.client.receive(bytes(in)));
  }
  {
    Hostile h;
    std::string in;
    const std::pair<SettingId, std::uint32_t> push[] = {{SettingId::kEnablePush, 1}};
    write::settings(in, push);
    EXPECT_FALSE(h.client.receive(bytes(in)));
  }
}

TEST(H2Client, AnHpackBombFromTheUpstreamResetsItsStreamWithoutCallingItRefused) {
  SessionLimits limits;
  limits.max_header_list_size = 16 * 1024;
  ClientRecorder r;
  ClientSession client(limits, r);
  r.session = &client;
  std::string settings;
  write::settings(settings, {});
  ASSERT_TRUE(client.receive(bytes(settings)));
  std::uint32_t id = client.open(request(), true);
  // ":status: 200" (static index 8), then a 4 KB field added to the table (a literal with
  // incremental indexing, RFC 7541 §6.2.1), then that entry named 1,000 times.
  std::string block = "\x88";
  block += '\x40';
  hpack::encode_integer(5, 7, 0, block);
  block += "x-big";
  hpack::encode_integer(4000, 7, 0, block);
  block += std::string(4000, 'b');
  for (int i = 0; i < 1000; ++i) hpack::encode_integer(62, 7, 0x80, block);
  std::string in;
  write::headers(in, id, block, true, 1 << 20);
  ASSERT_TRUE(client.receive(bytes(in)));
  // The upstream did process the request: not REFUSED_STREAM (that would say "safe to retry").
  EXPECT_EQ(r.resets[id], ErrorCode::kProtocolError);
  EXPECT_LE(r.fields[id].size(), 16u * 1024 / 4000 + 1);
}

// The client states its table size (the default) in its first SETTINGS, so that nginx stops
// indexing into it (a size update to 0, then every field "with incremental indexing"); nginx's
// own bytes for three responses (captured from nginx 1.22 over h2) are read as it meant them,
// a value that is no valid field value in that form resets its stream, and the client's table
// keeps nothing.
TEST(H2Client, StatesItsTableSizeAndReadsNginxsFieldsIndexedIntoNothing) {
  ClientRecorder r;
  ClientSession client(SessionLimits{}, r);
  r.session = &client;
  std::string out = client.take_output();
  ASSERT_TRUE(out.starts_with("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
  std::optional<std::uint32_t> table_size;
  FrameReader reader(1 << 24);
  (void)reader.feed(bytes(std::string_view(out).substr(24)), [&](const Frame& f) {
    if (f.kind() == FrameType::kSettings) {
      for_each_setting(f.payload, [&](std::uint16_t id, std::uint32_t value) {
        if (id == static_cast<std::uint16_t>(SettingId::kHeaderTableSize)) table_size = value;
      });
    }
    return true;
  });
  EXPECT_EQ(table_size, 4096u);
  std::string settings;
  write::settings(settings, {});
  ASSERT_TRUE(client.receive(bytes(settings)));
  const std::string blocks[] = {
      "20887684aa6355e76196dc34fd282794d27eea0802714106e001704fa98b46ff5f87497ca58ae819aa5c023133",
      "887684aa6355e76196dc34fd282794d27eea0802714106e0017190298b46ff5f87497ca58ae819aa5c023133",
      "887684aa6355e76196dc34fd282794d27eea0802714106e0017190298b46ff5f87497ca58ae819aa5c023133"};
  for (const std::string& hex : blocks) {
    std::uint32_t id = client.open(request(), true);
    std::string in;
    write::headers(in, id, spindle::testing::from_hex(hex), false);
    write::data(in, id, "Hello, World!", true);
    ASSERT_TRUE(client.receive(bytes(in)));
    EXPECT_TRUE(r.ended[id]);
    EXPECT_FALSE(r.resets.contains(id));
    ASSERT_EQ(r.fields[id].size(), 5u) << hex;
    EXPECT_EQ(r.fields[id][1], (std::pair<std::string, std::string>{"server", "nginx"}));
    EXPECT_TRUE(r.fields[id][2].second.ends_with(" GMT")) << r.fields[id][2].second;
    EXPECT_EQ(r.fields[id][3], (std::pair<std::string, std::string>{"content-type", "text/plain"}));
    EXPECT_EQ(r.fields[id][4], (std::pair<std::string, std::string>{"content-length", "13"}));
    EXPECT_EQ(r.body[id], "Hello, World!");
  }
  // The same form with a value no field may have (a line break), Huffman-coded, twice (the
  // second from the client's memo of decoded values): each resets its stream.
  for (int i = 0; i < 2; ++i) {
    std::uint32_t id = client.open(request(), true);
    std::string block = "\x88";
    hpack::encode_integer(54, 6, 0x40, block);  // server, with incremental indexing
    hpack::encode_integer(hpack::huffman::encoded_size("a\r\nb"), 7, 0x80, block);
    hpack::huffman::encode("a\r\nb", block);
    std::string in;
    write::headers(in, id, block, true);
    ASSERT_TRUE(client.receive(bytes(in)));
    EXPECT_EQ(r.resets[id], ErrorCode::kProtocolError) << i;
  }
}

// A response head past max_header_block (an upstream that reflects a large request) is its
// stream's error, not the connection's: the connection carries other callers' streams. The
// block is read whole (the decoder's table stays in step: the next head refers to an entry
// the large one added), that stream is reset, the other is answered; a block past the frames
// a block may take still ends the connection (what is gathered stays bounded).
// A response head past what the session gathers (33 frames) still costs only its stream: the
// rest of the block is read a frame at a time for the table only. Fields of 4,000 bytes (each
// cut by some frame's end), 10 to 1,000 frames; entries added at its start and at its end are
// named by the other stream's head, which is answered.
TEST(H2Client, AnOversizedResponseHeadResetsItsStreamAndTheTableStaysInStep) {
  for (std::size_t fields : {40u, 135u, 140u, 300u, 410u, 4100u}) {
    SCOPED_TRACE(fields);
    Hostile h;
    const std::uint32_t big = h.client.open(request(), true);
    const std::uint32_t other = h.client.open(request(), true);
    (void)h.written();
    // ":status: 200", "x-shared: s" with incremental indexing, then `fields` literals of
    // 4,000 bytes not indexed (160 KB, 10 frames of 16 KiB, to 16 MB, 1,002 frames), then
    // "x-late: l" indexed: entries 63 and 62.
    auto indexed = [](std::string& block, std::string_view name, std::string_view value) {
      block += '\x40';
      hpack::encode_integer(name.size(), 7, 0, block);
      block += name;
      hpack::encode_integer(value.size(), 7, 0, block);
      block += value;
    };
    std::string block = "\x88";
    indexed(block, "x-shared", "s");
    for (std::size_t i = 0; i < fields; ++i) {
      block += '\x00';
      const std::string name = "x-big-" + std::to_string(i);
      hpack::encode_integer(name.size(), 7, 0, block);
      block += name;
      hpack::encode_integer(4000, 7, 0, block);
      block += std::string(4000, 'v');
    }
    indexed(block, "x-late", "l");
    ASSERT_GT(block.size(), SessionLimits{}.max_header_block);
    std::string in;
    write::headers(in, big, block, true, kDefaultMaxFrameSize);
    // The other stream's head: ":status: 200" and entries 63 and 62.
    write::headers(in, other, "\x88\xbf\xbe", true);
    // Given in pieces of 7,000 bytes: frames cut too.
    for (std::size_t at = 0; at < in.size(); at += 7000) {
      ASSERT_TRUE(h.client.receive(bytes(std::string_view(in).substr(at, 7000))));
    }
    auto out = h.written();
    bool goaway = false, reset_big = false;
    for (auto [kind, code] : out) {
      goaway = goaway || kind == FrameType::kGoaway;
      reset_big = reset_big || (kind == FrameType::kRstStream &&
                                code == static_cast<std::uint32_t>(ErrorCode::kProtocolError));
    }
    EXPECT_FALSE(goaway);
    EXPECT_TRUE(reset_big);
    EXPECT_EQ(h.r.resets[big], ErrorCode::kProtocolError);
    EXPECT_FALSE(h.r.fields.contains(big) && h.r.fields[big].size() > 100);
    EXPECT_FALSE(h.r.resets.contains(other));
    EXPECT_TRUE(h.r.ended[other]);
    EXPECT_EQ(h.r.fields[other], (std::vector<std::pair<std::string, std::string>>{
                                     {":status", "200"}, {"x-shared", "s"}, {"x-late", "l"}}));
  }
}

// What the session keeps between the frames of such a block is bounded: one field larger than
// what it gathers (600 KB) ends the connection; a block cut short (no field may end at its
// END_HEADERS) too.
TEST(H2Client, AFieldLargerThanWhatIsGatheredEndsTheConnection) {
  for (bool cut : {false, true}) {
    SCOPED_TRACE(cut);
    Hostile h;
    const std::uint32_t big = h.client.open(request(), true);
    (void)h.written();
    std::string block = "\x88";
    for (int i = 0; i < 40; ++i) {
      block += '\x00';
      hpack::encode_integer(1, 7, 0, block);
      block += "x";
      hpack::encode_integer(16000, 7, 0, block);
      block += std::string(16000, 'v');
    }
    block += '\x00';
    hpack::encode_integer(1, 7, 0, block);
    block += "y";
    hpack::encode_integer(cut ? 100 : 600000, 7, 0, block);
    block += std::string(cut ? 50 : 600000, 'w');
    std::string in;
    write::headers(in, big, block, true, kDefaultMaxFrameSize);
    EXPECT_FALSE(h.client.receive(bytes(in)));
    bool goaway = false;
    for (auto [kind, code] : h.written()) goaway = goaway || kind == FrameType::kGoaway;
    EXPECT_TRUE(goaway);
  }
}
