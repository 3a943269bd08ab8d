// RFC 8441's extended CONNECT between the client session (the gateway's upstream end) and the
// server session, bytes only: the client learns from the server's first SETTINGS whether it
// may send one; the tunnel's stream carries bytes both ways through windows exhausted and
// reopened, at any split of the bytes; each side's END_STREAM is a half-close the other may
// still answer after; a reset crossing the tunnel's DATA costs the connection nothing; a
// server that did not allow it refuses :protocol.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "h2_testing.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace {

// Either end of a tunnel: records the fields and bytes of each stream and whether its peer
// ended it; reads (consumes) only while `reads`.
struct TunnelEnd : SessionHandler {
  Session* session = nullptr;
  std::map<std::uint32_t, std::vector<std::pair<std::string, std::string>>> fields;
  std::map<std::uint32_t, std::string> in;
  std::map<std::uint32_t, bool> peer_ended;
  std::map<std::uint32_t, int> heads;  // header blocks completed
  std::map<std::uint32_t, ErrorCode> resets;
  bool reads = true;
  std::size_t unread = 0;

  void on_field(std::uint32_t id, const spindle::http::Field& f) override {
    fields[id].emplace_back(f.name, f.value);
  }
  void on_headers(std::uint32_t id, bool end_stream, bool) override {
    ++heads[id];
    if (end_stream) peer_ended[id] = true;
  }
  void on_data(std::uint32_t id, std::span<const std::uint8_t> d, bool end_stream) override {
    in[id].append(reinterpret_cast<const char*>(d.data()), d.size());
    if (reads) {
      session->consumed(id, d.size());
    } else {
      unread += d.size();
    }
    if (end_stream) peer_ended[id] = true;
  }
  void on_reset(std::uint32_t id, ErrorCode code) override { resets[id] = code; }
  void on_window(std::uint32_t) override {}
};

// A client session and a server session that allows extended CONNECT (as spindle's server
// does), with small windows: every one of them is exhausted many times over.
struct Pair {
  TunnelEnd c, s;
  SessionLimits limits;
  std::unique_ptr<ClientSession> client;
  std::unique_ptr<ServerSession> server;
  // What each side still has to send on the tunnel, and whether it ends after.
  std::string to_server, to_client;
  bool client_ends = false, server_ends = false;

  explicit Pair(bool allow = true) {
    limits.stream_window = 65535;
    limits.connection_window = 65535;
    SessionLimits client_limits = limits;
    client_limits.connection_window_on_receipt = true;  // as the gateway's client has it
    client = std::make_unique<ClientSession>(client_limits, c);
    c.session = client.get();
    SessionLimits server_limits = limits;
    server_limits.enable_connect_protocol = allow;
    server = std::make_unique<ServerSession>(server_limits, s);
    s.session = server.get();
  }
  // Bytes both ways, `piece` at a time (0: all at once), until both are quiet.
  void converse(std::uint32_t id, std::size_t piece = 0) {
    for (int round = 0; round < 100000; ++round) {
      if (!to_server.empty() || client_ends) {
        to_server.erase(0, client->submit_data(id, to_server, client_ends));
        if (to_server.empty()) client_ends = false;
      }
      if (!to_client.empty() || server_ends) {
        to_client.erase(0, server->submit_data(id, to_client, server_ends));
        if (to_client.empty()) server_ends = false;
      }
      std::string a = client->take_output(), b = server->take_output();
      auto feed = [&](Session& into, const std::string& what) {
        std::size_t step = piece == 0 ? std::max<std::size_t>(what.size(), 1) : piece;
        for (std::size_t at = 0; at < what.size(); at += step) {
          ASSERT_TRUE(into.receive(bytes(std::string_view(what).substr(at, step))));
        }
      };
      feed(*server, a);
      feed(*client, b);
      if (a.empty() && b.empty()) return;
    }
    FAIL() << "the conversation did not settle";
  }
  std::uint32_t open_tunnel() {
    const std::vector<hpack::Field> head = {
        {":method", "CONNECT"}, {":protocol", "websocket"},
        {":scheme", "http"},    {":authority", "chat.example"},
        {":path", "/ws?x=1"},   {"sec-websocket-version", "13"}};
    return client->open(head, false);
  }
};

std::string pattern(std::size_t n, char salt) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + salt) % 251);
  return s;
}

}  // namespace

TEST(H2ExtendedConnect, TheClientKnowsWhetherItMayOnlyFromTheServersFirstSettings) {
  for (bool allow : {true, false}) {
    SCOPED_TRACE(allow);
    Pair p(allow);
    EXPECT_FALSE(p.client->settings_received());
    EXPECT_FALSE(p.client->connect_protocol());
    ASSERT_TRUE(p.client->receive(bytes(p.server->take_output())));
    EXPECT_TRUE(p.client->settings_received());
    EXPECT_EQ(p.client->connect_protocol(), allow);
  }
}

TEST(H2ExtendedConnect, ATunnelCarriesBytesBothWaysThroughExhaustedWindowsAtEverySplit) {
  for (std::size_t piece : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096}}) {
    SCOPED_TRACE(piece);
    Pair p;
    p.converse(0, piece);  // the prefaces and SETTINGS
    ASSERT_TRUE(p.client->connect_protocol());
    std::uint32_t id = p.open_tunnel();
    ASSERT_NE(id, 0u);
    p.converse(id, piece);
    // The server sees the extended CONNECT whole; the stream stays open both ways.
    auto& seen = p.s.fields[id];
    ASSERT_GE(seen.size(), 5u);
    EXPECT_EQ(seen[0], (std::pair<std::string, std::string>{":method", "CONNECT"}));
    EXPECT_EQ(seen[1], (std::pair<std::string, std::string>{":protocol", "websocket"}));
    EXPECT_FALSE(p.s.peer_ended[id]);
    const hpack::Field ok[] = {{":status", "200"}};
    p.server->submit_headers(id, ok, false);
    // Five windows' worth each way at once: each side sends as its window allows.
    const std::string up = pattern(5 * 65535 + 17, 'u'), down = pattern(5 * 65535 + 3, 'd');
    p.to_server = up;
    p.to_client = down;
    p.converse(id, piece);
    EXPECT_EQ(p.s.in[id], up);
    EXPECT_EQ(p.c.in[id], down);
    // The client's half-close: the server may still answer, then ends its side too.
    p.client_ends = true;
    p.converse(id, piece);
    EXPECT_TRUE(p.s.peer_ended[id]);
    EXPECT_EQ(p.client->open_streams(), 1u);
    p.to_client = "after the half-close";
    p.server_ends = true;
    p.converse(id, piece);
    EXPECT_EQ(p.c.in[id], down + "after the half-close");
    EXPECT_TRUE(p.c.peer_ended[id]);
    EXPECT_TRUE(p.c.resets.empty());
    EXPECT_TRUE(p.s.resets.empty());
    EXPECT_EQ(p.client->open_streams(), 0u);
    EXPECT_EQ(p.server->open_streams(), 0u);
  }
}

// A tunnel whose reader stalls holds its own stream's window; the connection's reopens as the
// bytes arrive, so a second tunnel on the connection still carries more than a window.
TEST(H2ExtendedConnect, AStalledTunnelHoldsItsOwnWindowNotTheConnections) {
  Pair p;
  p.converse(0);
  std::uint32_t stalled = p.open_tunnel();
  std::uint32_t live = p.open_tunnel();
  p.converse(0);
  const hpack::Field ok[] = {{":status", "200"}};
  p.server->submit_headers(stalled, ok, false);
  p.server->submit_headers(live, ok, false);
  p.c.reads = false;
  p.to_client = pattern(200000, 's');
  p.converse(stalled);
  EXPECT_EQ(p.c.in[stalled].size(), 65535u);  // its window, spent and not reopened
  EXPECT_EQ(p.server->send_window(stalled), 0u);
  p.c.reads = true;
  p.to_client = pattern(3 * 65535, 'l');
  p.converse(live);
  EXPECT_EQ(p.c.in[live], pattern(3 * 65535, 'l'));
  EXPECT_EQ(p.server->send_window(stalled), 0u);  // still held: nobody read it
}

// The client resets a tunnel while the server's DATA on it are on their way: they are ignored,
// count for the connection's window, and the connection carries the next tunnel.
TEST(H2ExtendedConnect, AResetCrossingTheTunnelsDataCostsTheConnectionNothing) {
  Pair p;
  p.converse(0);
  std::uint32_t id = p.open_tunnel();
  p.converse(id);
  const hpack::Field ok[] = {{":status", "200"}};
  p.server->submit_headers(id, ok, false);
  ASSERT_EQ(p.server->submit_data(id, pattern(60000, 'x'), false), 60000u);
  std::string crossing = p.server->take_output();
  p.client->reset(id, ErrorCode::kCancel);
  ASSERT_TRUE(p.client->receive(bytes(crossing)));  // sent before the server knew
  EXPECT_FALSE(p.client->failed());
  p.converse(0);
  EXPECT_EQ(p.s.resets[id], ErrorCode::kCancel);
  std::uint32_t next = p.open_tunnel();
  p.converse(next);
  p.server->submit_headers(next, ok, false);
  p.to_client = pattern(100000, 'n');
  p.converse(next);
  EXPECT_EQ(p.c.in[next], pattern(100000, 'n'));
  EXPECT_FALSE(p.client->failed());
  EXPECT_FALSE(p.server->failed());
}

TEST(H2ExtendedConnect, AServerThatDidNotAllowItRefusesTheProtocolPseudoField) {
  Pair p(false);
  p.converse(0);
  std::uint32_t id = p.open_tunnel();
  p.converse(id);
  EXPECT_EQ(p.c.resets[id], ErrorCode::kProtocolError);  // malformed (RFC 8441 §3)
  EXPECT_EQ(p.s.heads[id], 0);                           // never a request its handler would run
  EXPECT_FALSE(p.server->failed());
}
