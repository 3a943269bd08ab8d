// HPACK on a connection many clients share (a gateway's to an upstream): no client's value
// becomes another's reference (a right guess would make a block shorter, CRIME's side channel),
// credentials are never indexed on either end (one list, the token table's), and a field that
// came never indexed goes on so (RFC 7541 §6.2.3).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "h2_testing.h"
#include "spindle/h2/hpack.h"
#include "spindle/h2/session.h"
#include "spindle/http/tokens.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace sharing {

// A decoded field and whether it came never indexed.
struct Got {
  std::string name, value;
  bool never_indexed;
};

std::vector<Got> decode_all(hpack::Decoder& decoder, const std::string& block) {
  std::vector<Got> got;
  auto status = decoder.decode(bytes(block), [&](const hpack::Decoded& d) {
    got.push_back({std::string(d.field.name), std::string(d.field.value), d.never_indexed});
  });
  EXPECT_EQ(status, hpack::Status::kOk);
  return got;
}

// A request of one client: its path, its credentials, its own fields, and fields any client has.
std::vector<hpack::Field> client_request(const std::string& who) {
  static std::map<std::string, std::vector<std::string>> keep;  // the views' text
  std::vector<std::string>& t = keep[who];
  // (Each ends in '0': a wrong guess ends in '1' instead, of the same Huffman length.)
  t = {"/account/" + who + "?token=" + who + "0",
       "session=" + who + "0",
       "Bearer " + who + "0",
       who + "-key0",
       "tenant-" + who + "0",
       "Agent/" + who + "0",
       "10.0.0.10"};
  return {{":method", "GET"},
          {":scheme", "https"},
          {":authority", "api.example"},
          {":path", t[0]},
          {"cookie", t[1]},
          {"authorization", t[2]},
          {"x-api-key", t[3]},
          {"x-tenant", t[4]},  // a name spindle has no rule for
          {"user-agent", t[5]},
          {"x-forwarded-for", t[6]},
          {"accept", "application/json"},
          {"accept-encoding", "gzip, br"},
          {"via", "2 spindle"}};
}

bool shared_value(std::string_view name) {
  const spindle::http::Token* token = spindle::http::find_token(name);
  return token != nullptr && (token->flags & spindle::http::field_flag::kSharedValue) != 0;
}

}  // namespace sharing

using namespace sharing;

// Client A's request, then client B's with one of A's values guessed right or wrong: on a
// shared table, B's block is as long either way, for every field a client's value is in; the
// table holds only values that name no client, and those go as references the second time.
TEST(HpackSharing, NoClientsValueBecomesAnothersReference) {
  const std::vector<hpack::Field> a = client_request("alice");
  for (std::size_t field = 3; field < a.size(); ++field) {
    if (shared_value(a[field].name)) continue;
    SCOPED_TRACE(std::string(a[field].name));
    std::size_t sizes[2];
    for (bool right : {false, true}) {
      hpack::Encoder encoder;
      encoder.share_between_clients();
      std::string first, second;
      encoder.encode(a, first);
      std::vector<hpack::Field> b = client_request("bobby");  // as long as alice's values
      std::string guess(a[field].value);
      if (!right) guess.back() = '1';
      b[field].value = guess;
      encoder.encode(b, second);
      sizes[right] = second.size();
      // The table: names with a value no client has, or the name of one new in every message.
      for (std::size_t i = 62; i < 62 + encoder.table().count(); ++i) {
        EXPECT_TRUE(shared_value(encoder.table().get(i)->name())) << encoder.table().get(i)->name();
      }
    }
    EXPECT_EQ(sizes[true], sizes[false]);
  }
  // The same on a client's own connection (a server's table): a right guess does shorten the
  // block (which is why a shared table must not), credentials aside.
  std::size_t own[2];
  for (bool right : {false, true}) {
    hpack::Encoder encoder;
    std::string first, second;
    encoder.encode(a, first);
    std::vector<hpack::Field> b = client_request("bobby");
    std::string guess(a[7].value);  // x-tenant
    if (!right) guess.back() = '1';
    b[7].value = guess;
    encoder.encode(b, second);
    own[right] = second.size();
  }
  EXPECT_LT(own[true], own[false]);
}

TEST(HpackSharing, ValuesThatNameNoClientAreSharedAndTheRestGoNeverIndexed) {
  hpack::Encoder encoder;
  encoder.share_between_clients();
  hpack::Decoder decoder;
  std::string first, second;
  encoder.encode(client_request("alice"), first);
  encoder.encode(client_request("bobby"), second);
  EXPECT_LT(second.size(), first.size());  // the shared values are references the second time
  for (const std::string* block : {&first, &second}) {
    for (const Got& g : decode_all(decoder, *block)) {
      const bool static_entry = g.name == ":method" || g.name == ":scheme";
      EXPECT_EQ(g.never_indexed, !shared_value(g.name) && !static_entry) << g.name;
    }
  }
  // The decoder's table (the upstream's view) holds nothing of either client.
  for (std::size_t i = 62; i < 62 + decoder.table().count(); ++i) {
    EXPECT_TRUE(shared_value(decoder.table().get(i)->name())) << decoder.table().get(i)->name();
  }
}

// A request id is new in every message: its name takes one entry, and later ids refer to the
// name only, even when one repeats the first (its value is never a reference).
TEST(HpackSharing, ARequestIdTakesAnEntryForItsNameOnly) {
  hpack::Encoder encoder;
  encoder.share_between_clients();
  hpack::Decoder decoder;
  std::string first, again;
  encoder.encode({{"x-request-id", "0123456789abcdef"}}, first);
  encoder.encode({{"x-request-id", "0123456789abcdef"}}, again);
  EXPECT_EQ(encoder.table().count(), 1u);
  EXPECT_GT(again.size(), std::string("0123456789abcdef").size());  // the value spelled out
  EXPECT_LT(again.size(), first.size());                            // the name referred to
  (void)decode_all(decoder, first);
  auto got = decode_all(decoder, again);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].value, "0123456789abcdef");
}

// Credentials (the token table's one list) are never indexed by either end, and say so; a field
// marked sensitive too; a never-indexed field decoded says so.
TEST(HpackSharing, CredentialsAreNeverIndexedOnEitherEnd) {
  for (bool shared : {false, true}) {
    hpack::Encoder encoder;
    if (shared) encoder.share_between_clients();
    hpack::Decoder decoder;
    std::vector<hpack::Field> fields;
    for (std::string_view name :
         {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key",
          "x-auth-token", "x-access-token", "x-goog-api-key", "x-csrf-token", "x-xsrf-token",
          "x-amz-security-token"}) {
      fields.push_back({name, "secret"});
    }
    fields.push_back({"x-mine", "marked", /*sensitive=*/true});
    for (int round = 0; round < 2; ++round) {
      std::string block;
      encoder.encode(fields, block);
      for (const Got& g : decode_all(decoder, block)) {
        EXPECT_TRUE(g.never_indexed) << g.name << (shared ? " shared" : "");
        EXPECT_EQ(g.value, g.name == "x-mine" ? "marked" : "secret");
      }
    }
    EXPECT_EQ(encoder.table().count(), 0u);
    EXPECT_EQ(decoder.table().count(), 0u);
  }
}

namespace sharing {

// What a server's handler was told of each field.
struct FieldLog : SessionHandler {
  std::vector<Got> fields;
  bool next_never_indexed = false;
  void on_never_indexed(std::uint32_t, const spindle::http::Field&) override {
    next_never_indexed = true;
  }
  void on_field(std::uint32_t, const spindle::http::Field& f) override {
    fields.push_back({std::string(f.name), std::string(f.value), next_never_indexed});
    next_never_indexed = false;
  }
  void on_headers(std::uint32_t, bool, bool) override {}
  void on_data(std::uint32_t, std::span<const std::uint8_t>, bool) override {}
  void on_reset(std::uint32_t, ErrorCode) override {}
  void on_window(std::uint32_t) override {}
};

}  // namespace sharing

// The client session's table is a shared one, and the server session tells its driver which
// field came never indexed (just before that field).
TEST(HpackSharing, AClientSessionSharesNothingOfOneRequestWithTheNext) {
  FieldLog client_log, server_log;
  ClientSession client(SessionLimits{}, client_log);
  ServerSession server(SessionLimits{}, server_log);
  auto c2s = client.take_output();
  ASSERT_TRUE(server.receive(bytes(c2s)));
  ASSERT_TRUE(client.receive(bytes(server.take_output())));
  (void)client.take_output();
  const std::vector<hpack::Field> a = client_request("alice"), b = client_request("bobby");
  client.open(a, true);
  client.open(b, true);
  ASSERT_TRUE(server.receive(bytes(client.take_output())));
  ASSERT_EQ(server_log.fields.size(), a.size() + b.size());
  for (const Got& g : server_log.fields) {
    const bool static_entry = g.name == ":method" || g.name == ":scheme";
    EXPECT_EQ(g.never_indexed, !shared_value(g.name) && !static_entry) << g.name;
  }
}
