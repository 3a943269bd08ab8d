#include "spindle/http/rules.h"

#include <gtest/gtest.h>

#include <string>

#include "spindle/h1/parser.h"
#include "spindle/http/status.h"

using namespace spindle::http;
using Kind = BodyFraming::Kind;

namespace {

HeaderMap fields(std::initializer_list<std::pair<std::string_view, std::string_view>> list) {
  HeaderMap map;
  for (auto [name, value] : list) map.add(name, value);
  return map;
}

// The request framing of `headers` (HTTP/1.1): the kind, or the error status as a negative.
int request_kind(const HeaderMap& headers, int minor = 1, std::uint64_t* length = nullptr) {
  BodyFraming out;
  if (auto e = request_framing(headers, collect_framing_fields(headers), minor, out)) {
    return -e->status;
  }
  if (length) *length = out.length;
  return static_cast<int>(out.kind);
}

int response_kind(const HeaderMap& headers, int status, std::string_view method = "GET") {
  BodyFraming out;
  if (auto e = response_framing(headers, collect_framing_fields(headers), status, method, out)) {
    return -e->status;
  }
  return static_cast<int>(out.kind);
}

}  // namespace

TEST(HttpRules, FieldValuesRefuseEveryControlCharacterButTab) {
  for (int c = 0; c < 256; ++c) {
    std::string value = "abc" + std::string(1, static_cast<char>(c)) + "defghijklmnop";
    bool allowed = c == '\t' || (c >= 0x20 && c != 0x7f);
    EXPECT_EQ(is_field_value(value), allowed) << "byte " << c;
    // The same answer at every position of values of 1 to 40 bytes (sixteen and eight bytes at
    // a time: whole blocks, an overlapping last one, a padded short word).
    for (std::size_t size = 1; size <= 40; ++size) {
      for (std::size_t at = 0; at < size; ++at) {
        std::string v(size, 'x');
        v[at] = static_cast<char>(c);
        ASSERT_EQ(is_field_value(v), allowed) << "byte " << c << " at " << at << " of " << size;
      }
    }
  }
  EXPECT_TRUE(is_field_value(""));
  EXPECT_FALSE(is_field_value("ok\r\nSet-Cookie: evil=1"));
}

// A tab is the one control byte a value may hold: the check goes on past it, so a forbidden
// byte anywhere after one (in the same block, or blocks later) is still refused.
TEST(HttpRules, AFieldValueIsCheckedOnPastEachTab) {
  for (std::size_t tab = 0; tab < 40; ++tab) {
    std::string v(40, 'x');
    v[tab] = '\t';
    ASSERT_TRUE(is_field_value(v)) << "tab at " << tab;
    for (std::size_t at = tab + 1; at < 40; ++at) {
      for (char bad : {'\0', '\r', '\n', '\x1f', '\x7f'}) {
        std::string w = v;
        w[at] = bad;
        ASSERT_FALSE(is_field_value(w))
            << "tab at " << tab << ", byte " << int(bad) << " at " << at;
      }
    }
  }
  EXPECT_TRUE(is_field_value(std::string(33, '\t')));
}

// The parsers take a line's end and a name's end from these two: each must give the exact
// offset (not only a yes or no), for every byte at every place of 0 to 40 bytes.
TEST(HttpRules, TheFirstControlByteAndTheTokenRunAreFoundExactly) {
  using spindle::http::detail::first_control;
  using spindle::http::detail::token_run;
  for (std::size_t size = 0; size <= 40; ++size) {
    for (std::size_t at = 0; at < size; ++at) {
      for (int c = 0; c < 256; ++c) {
        std::string value(size, 'x');
        value[at] = static_cast<char>(c);
        const bool control = c < 0x20 || c == 0x7f;
        ASSERT_EQ(first_control(value.data(), value.size()), control ? at : size)
            << "byte " << c << " at " << at << " of " << size;
        std::string name(size, 'a');
        name[at] = static_cast<char>(c);
        ASSERT_EQ(token_run(name.data(), name.size()), is_tchar(static_cast<char>(c)) ? size : at)
            << "byte " << c << " at " << at << " of " << size;
      }
    }
  }
}

TEST(HttpRules, NamesAndMethodsAreTokens) {
  EXPECT_TRUE(is_field_name("X-Request-Id"));
  EXPECT_TRUE(is_method("PROPFIND"));
  for (std::string_view bad : {"", "X Y", "X:Y", "X\r\nY", "Ü", "a(b)", "a/b", "GET\n"}) {
    EXPECT_FALSE(is_field_name(bad)) << bad;
    EXPECT_FALSE(is_method(bad)) << bad;
  }
}

TEST(HttpRules, EveryByteAtEveryPlaceOfANameIsJudgedAsTheTokenTableSays) {
  // Names of 1 to 20 characters, each byte value at each place: the words checked eight at a
  // time must agree with the table byte for byte.
  for (std::size_t size = 1; size <= 20; ++size) {
    for (std::size_t at = 0; at < size; ++at) {
      for (int b = 0; b < 256; ++b) {
        std::string name(size, 'a');
        name[at] = static_cast<char>(b);
        ASSERT_EQ(is_field_name(name), detail::kTokenChars[b]) << size << " " << at << " " << b;
      }
    }
  }
  EXPECT_TRUE(is_field_name("X-Forwarded-For-0123456789"));
  EXPECT_TRUE(is_field_name("x_custom.thing~1|2"));
}

TEST(HttpRules, RequestTargetsAreVisibleAsciiInAKnownForm) {
  for (std::string_view ok : {"/", "/a?b=c", "*", "http://h/x", "example.com:443"}) {
    EXPECT_TRUE(is_request_target(ok)) << ok;
  }
  for (std::string_view bad :
       {"", "/a b", "/a\r\nHost: evil", "/\x01", "/\x7f", "/é", "relative", "://x"}) {
    EXPECT_FALSE(is_request_target(bad)) << bad;
  }
}

TEST(HttpRules, HopByHopIsTheRfc9110SetAnyCase) {
  for (std::string_view name :
       {"Connection", "keep-alive", "PROXY-CONNECTION", "TE", "Transfer-Encoding", "upgrade"}) {
    EXPECT_TRUE(is_hop_by_hop(name)) << name;
  }
  for (std::string_view name : {"Content-Length", "Trailer", "Host", "X-Te", "Upgrades"}) {
    EXPECT_FALSE(is_hop_by_hop(name)) << name;
  }
}

TEST(HttpRules, OneTableNamesEveryFieldWithARuleInAnyCase) {
  using namespace field_flag;
  EXPECT_EQ(field_flags("Transfer-Encoding"), kHopByHop | kFraming | kNotInTrailers);
  EXPECT_EQ(field_flags("content-LENGTH"), kFraming | kNotInTrailers);
  EXPECT_EQ(field_flags("Host"), kHost | kNotInTrailers | kSingleton);
  // Asked for some rules only: those bits, or nothing.
  EXPECT_EQ(field_flags("Transfer-Encoding", kFraming | kHost), kFraming);
  EXPECT_EQ(field_flags("Content-Type", kHopByHop), 0);
  EXPECT_EQ(field_flags("Via", kHopByHop | kSetByProxy), kSetByProxy);
  for (std::string_view name :
       {"Via", "Expect", "traceparent", "X-Request-Id", "X-Forwarded-For", "x-forwarded-host",
        "X-FORWARDED-PROTO", "Forwarded", "X-Real-IP", "X-Forwarded-Port", "x-forwarded-uri",
        "X-Forwarded-Method", "X-Original-URL", "X-HTTP-Method-Override"}) {
    EXPECT_EQ(field_flags(name) & ~(kUniquePerMessage | kSharedValue), kSetByProxy) << name;
  }
  // What HPACK reads from the same table: never indexed (credentials, under their usual names),
  // not worth indexing, and (on a table many clients share) the values that name no client.
  for (std::string_view name :
       {"Authorization", "proxy-authorization", "Cookie", "set-cookie", "X-Api-Key", "api-key",
        "x-auth-token", "X-Access-Token", "x-goog-api-key", "x-csrf-token", "X-XSRF-TOKEN",
        "x-amz-security-token"}) {
    EXPECT_EQ(field_flags(name, ~kSingleton), kSensitive) << name;
  }
  // Once at most in a request.
  for (std::string_view name : {"Host", "Authorization", "content-type", "Range", "User-Agent",
                                "Origin", "Sec-WebSocket-Key"}) {
    EXPECT_EQ(field_flags(name, kSingleton), kSingleton) << name;
  }
  for (std::string_view name : {"Cookie", "Accept", "X-Forwarded-For", "Via", "Content-Length"}) {
    EXPECT_EQ(field_flags(name, kSingleton), 0) << name;
  }
  EXPECT_EQ(field_flags("X-Request-Id", kUniquePerMessage), kUniquePerMessage);
  for (std::string_view name : {":method", ":authority", "accept", "Accept-Encoding", "Via",
                                "content-type", "X-Forwarded-Proto", "TE"}) {
    EXPECT_EQ(field_flags(name, kSharedValue), kSharedValue) << name;
  }
  for (std::string_view name : {":path", "user-agent", "referer", "origin", "X-Forwarded-For",
                                "X-Request-Id", "if-none-match", "cookie", "x-tenant"}) {
    EXPECT_EQ(field_flags(name, kSharedValue), 0) << name;
  }
  for (std::string_view name : {"HTTP2-Settings", "Keep-Alive", "Proxy-Connection"}) {
    EXPECT_EQ(field_flags(name), kHopByHop) << name;
  }
  // Names of the same length as a ruled one, and longer than any, have none.
  for (std::string_view name : {"", "tf", "vie", "hosts", "x-request-ix", "content-lengthy",
                                "x-forwarded-protocol", "accepts", "cookies"}) {
    EXPECT_EQ(field_flags(name), 0) << name;
  }
}

TEST(HttpRules, TrailersAreEndToEndFieldsThatDoNotDescribeTheMessage) {
  for (auto [name, value] : std::initializer_list<std::pair<std::string_view, std::string_view>>{
           {"grpc-status", "0"}, {"Server-Timing", "db;dur=53"}, {"ETag", "\"x\""}}) {
    EXPECT_TRUE(is_trailer_sendable(name, value)) << name;
  }
  for (auto [name, value] : std::initializer_list<std::pair<std::string_view, std::string_view>>{
           {"Content-Length", "5"},
           {"transfer-encoding", "chunked"},
           {"Trailer", "x"},
           {"HOST", "a"},
           {"Content-Type", "text/plain"},
           {"content-encoding", "gzip"},
           {"Content-Range", "bytes 0-1/2"},
           {"Connection", "close"},
           {"TE", "trailers"},
           {"x-split", "a\r\nb"},
           {"bad name", "v"},
           {"", "v"}}) {
    EXPECT_FALSE(is_trailer_sendable(name, value)) << name;
  }
}

TEST(HttpRules, RemovesHopByHopFieldsAndThoseConnectionNames) {
  HeaderMap h = fields({{"Host", "a"},
                        {"Connection", "keep-alive, X-Secret, x-other"},
                        {"X-Secret", "1"},
                        {"Keep-Alive", "timeout=5"},
                        {"X-Other", "2"},
                        {"X-Kept", "3"},
                        {"Proxy-Connection", "X-Proxied"},
                        {"X-Proxied", "4"},
                        {"TE", "trailers"},
                        {"Upgrade", "websocket"}});
  EXPECT_TRUE(connection_nominates(h, "x-secret"));
  EXPECT_FALSE(connection_nominates(h, "x-kept"));
  std::vector<std::string> kept;
  for_each_end_to_end(h, [&](const Field& f) { kept.emplace_back(f.name); });
  EXPECT_EQ(kept, (std::vector<std::string>{"Host", "X-Kept"}));
  EXPECT_EQ(remove_hop_by_hop(h), 8u);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].name, "Host");
  EXPECT_EQ(h[1].name, "X-Kept");
}

TEST(HttpRules, ForwardableDecidesWhatEachSenderPassesOnFromOneTable) {
  HeaderMap h = fields({{"Host", "a"},
                        {"Content-Length", "5"},
                        {"Transfer-Encoding", "chunked"},
                        {"Connection", "X-Named"},
                        {"X-Named", "1"},
                        {"TE", "trailers"},
                        {"X-Forwarded-For", "10.0.0.1"},
                        {"Via", "1.1 other"},
                        {"X-Kept", "2"}});
  NominatedFields nominated(h);
  auto passed = [&](FieldsFor to) {
    std::vector<std::string> names;
    for (const Field& f : h) {
      if (forwardable(f.name, nominated, to)) names.emplace_back(f.name);
    }
    return names;
  };
  using Names = std::vector<std::string>;
  // Every sender: no hop-by-hop field, nothing Connection names.
  EXPECT_EQ(passed(FieldsFor::kEndToEnd),
            (Names{"Host", "Content-Length", "X-Forwarded-For", "Via", "X-Kept"}));
  // A client writes its own Host and framing.
  EXPECT_EQ(passed(FieldsFor::kRequest), (Names{"X-Forwarded-For", "Via", "X-Kept"}));
  // A server writes its own framing.
  EXPECT_EQ(passed(FieldsFor::kResponse), (Names{"Host", "X-Forwarded-For", "Via", "X-Kept"}));
  // The gateway sets the forwarded fields itself (the client under it, Host and framing).
  EXPECT_EQ(passed(FieldsFor::kProxiedRequest), (Names{"Host", "Content-Length", "X-Kept"}));
  // forward_auth's request: none of the client's Host, framing or forwarded fields.
  EXPECT_EQ(passed(FieldsFor::kAuthRequest), (Names{"X-Kept"}));
  // Any case.
  EXPECT_FALSE(forwardable("x-NAMED", nominated, FieldsFor::kEndToEnd));
  EXPECT_FALSE(forwardable("HOST", nominated, FieldsFor::kRequest));
}

TEST(HttpRules, NominatedFieldsAreReadOnceAndAgreeWithConnectionNominates) {
  HeaderMap h = fields({{"Connection", "keep-alive, X-Secret,, x-other "},
                        {"X-Kept", "3"},
                        {"proxy-connection", "X-Proxied"}});
  NominatedFields nominated(h);
  EXPECT_FALSE(nominated.empty());
  for (std::string_view name : {"x-secret", "X-OTHER", "x-proxied", "Keep-Alive"}) {
    EXPECT_TRUE(nominated.contains(name)) << name;
    EXPECT_TRUE(connection_nominates(h, name)) << name;
  }
  for (std::string_view name : {"x-kept", "x-secre", "connection", ""}) {
    EXPECT_FALSE(nominated.contains(name)) << name;
  }
  EXPECT_TRUE(NominatedFields(fields({{"Host", "a"}})).empty());
  // A listed name spindle knows is matched by its token, one it does not by its text: each
  // field of a message (which carries its name's token) agrees with connection_nominates.
  HeaderMap mixed = fields({{"Connection", "DATE, x-Unknown"},
                            {"Date", "today"},
                            {"X-UNKNOWN", "1"},
                            {"X-Unknow", "2"},
                            {"Server", "s"},
                            {"Content-Type", "a/b"}});
  NominatedFields listed(mixed);
  std::vector<std::string> found;
  for (const Field& f : mixed) {
    EXPECT_EQ(listed.contains(f), connection_nominates(mixed, f.name)) << f.name;
    if (listed.contains(f)) found.emplace_back(f.name);
  }
  EXPECT_EQ(found, (std::vector<std::string>{"Date", "X-UNKNOWN"}));
  EXPECT_TRUE(listed.contains("date") && listed.contains("X-unknown"));
  EXPECT_FALSE(listed.contains("x-unknow") || listed.contains("dat") || listed.contains("server"));
  // A field made without its name's token is still matched by its name.
  EXPECT_TRUE(listed.contains(Field{"Date", "today", nullptr}));
  // More names than it keeps inline: it asks the message instead, with the same answers.
  std::string many;
  for (int i = 0; i < 12; ++i) many += "x-" + std::to_string(i) + ", ";
  HeaderMap lots = fields({{"Connection", many}});
  NominatedFields all(lots);
  EXPECT_TRUE(all.contains("x-0") && all.contains("X-11"));
  EXPECT_FALSE(all.contains("x-12"));
}

TEST(HttpRules, RequestFramingFollowsRfc9112Section6_3) {
  std::uint64_t length = 0;
  EXPECT_EQ(request_kind(fields({})), static_cast<int>(Kind::kNone));
  EXPECT_EQ(request_kind(fields({{"Content-Length", "0"}})), static_cast<int>(Kind::kNone));
  EXPECT_EQ(request_kind(fields({{"Content-Length", "12"}}), 1, &length),
            static_cast<int>(Kind::kLength));
  EXPECT_EQ(length, 12u);
  EXPECT_EQ(request_kind(fields({{"Content-Length", "7, 7"}}), 1, &length),
            static_cast<int>(Kind::kLength));
  EXPECT_EQ(request_kind(fields({{"Transfer-Encoding", "chunked"}})),
            static_cast<int>(Kind::kChunked));
  EXPECT_EQ(request_kind(fields({{"Transfer-Encoding", "gzip, chunked"}})), -501);
  EXPECT_EQ(request_kind(fields({{"Transfer-Encoding", "chunked, gzip"}})), -400);
  EXPECT_EQ(request_kind(fields({{"Transfer-Encoding", "chunked, chunked"}})), -400);
  EXPECT_EQ(request_kind(fields({{"Transfer-Encoding", "chunked"}, {"Content-Length", "3"}})),
            -400);
  EXPECT_EQ(request_kind(fields({{"Transfer-Encoding", "chunked"}}), 0), -400);
  EXPECT_EQ(request_kind(fields({{"Content-Length", "1"}, {"Content-Length", "2"}})), -400);
  EXPECT_EQ(request_kind(fields({{"Content-Length", "-1"}})), -400);
  EXPECT_EQ(request_kind(fields({{"Content-Length", "0x10"}})), -400);
  EXPECT_EQ(request_kind(fields({{"Content-Length", "99999999999999999999"}})), -400);
}

TEST(HttpRules, ResponseFramingFollowsRfc9112Section6_3) {
  HeaderMap sized = fields({{"Content-Length", "5"}});
  EXPECT_EQ(response_kind(sized, 200), static_cast<int>(Kind::kLength));
  EXPECT_EQ(response_kind(sized, 200, "HEAD"), static_cast<int>(Kind::kNone));
  EXPECT_EQ(response_kind(sized, 204), static_cast<int>(Kind::kNone));
  EXPECT_EQ(response_kind(sized, 304), static_cast<int>(Kind::kNone));
  EXPECT_EQ(response_kind(fields({}), 103), static_cast<int>(Kind::kNone));
  EXPECT_EQ(response_kind(fields({}), 101), static_cast<int>(Kind::kTunnel));
  EXPECT_EQ(response_kind(sized, 200, "CONNECT"), static_cast<int>(Kind::kTunnel));
  EXPECT_EQ(response_kind(sized, 407, "CONNECT"), static_cast<int>(Kind::kLength));
  // Transfer-Encoding overrides Content-Length; a final coding other than chunked reads to
  // the close.
  EXPECT_EQ(response_kind(fields({{"Transfer-Encoding", "chunked"}, {"Content-Length", "5"}}), 200),
            static_cast<int>(Kind::kChunked));
  EXPECT_EQ(response_kind(fields({{"Transfer-Encoding", "chunked, gzip"}}), 200),
            static_cast<int>(Kind::kUntilClose));
  EXPECT_EQ(response_kind(fields({}), 200), static_cast<int>(Kind::kUntilClose));
  EXPECT_EQ(response_kind(fields({{"Content-Length", "5, 6"}}), 200), -502);
}

// A 101, or any 2xx to CONNECT, and nothing else makes the connection a tunnel (RFC 9110
// §15.2.2, §9.3.6): whatever the request's method, whatever framing fields the head carries
// (a 204 to CONNECT too: it is a 2xx). Past that, HEAD and the statuses without a body have none.
TEST(HttpRules, A101OrA2xxToConnectAndNothingElseOpensATunnel) {
  const HeaderMap heads[] = {fields({}), fields({{"Content-Length", "5"}}),
                             fields({{"Transfer-Encoding", "chunked"}})};
  for (std::string_view method : {"GET", "HEAD", "POST", "CONNECT", "OPTIONS"}) {
    for (int status = 100; status <= 599; ++status) {
      bool tunnel = status == 101 || (method == "CONNECT" && status / 100 == 2);
      EXPECT_EQ(opens_tunnel(status, method == "CONNECT"), tunnel) << method << " " << status;
      bool no_body = method == "HEAD" || status / 100 == 1 || status == 204 || status == 304;
      for (const HeaderMap& head : heads) {
        int kind = response_kind(head, status, method);
        if (tunnel) {
          EXPECT_EQ(kind, static_cast<int>(Kind::kTunnel)) << method << " " << status;
        } else if (no_body) {
          EXPECT_EQ(kind, static_cast<int>(Kind::kNone)) << method << " " << status;
        } else {
          EXPECT_NE(kind, static_cast<int>(Kind::kTunnel)) << method << " " << status;
          EXPECT_NE(kind, static_cast<int>(Kind::kNone)) << method << " " << status;
        }
      }
    }
  }
}

TEST(HttpRules, TheParsersDecideFramingThroughTheRules) {
  // Request: Content-Length with chunked is refused whichever comes first.
  RequestParser parser;
  RequestHead head;
  auto r = parser.parse(
      "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
      head);
  EXPECT_EQ(r.state, ParseResult::State::kError);
  EXPECT_EQ(r.status, 400);
  // Response: chunked wins over Content-Length, and a body without length ends the connection.
  ResponseParser responses;
  ResponseHead rh;
  auto c = responses.parse(
      "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", rh);
  ASSERT_EQ(c.state, ParseResult::State::kComplete);
  EXPECT_EQ(rh.framing.kind, Kind::kChunked);
  EXPECT_FALSE(rh.content_length.has_value());
  auto u = responses.parse("HTTP/1.1 200 OK\r\nServer: x\r\n\r\n", rh);
  ASSERT_EQ(u.state, ParseResult::State::kComplete);
  EXPECT_EQ(rh.framing.kind, Kind::kUntilClose);
  EXPECT_FALSE(rh.keep_alive);
}

TEST(HttpRules, IdempotentMethodsAreRfc9110s) {
  for (std::string_view m : {"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"}) {
    EXPECT_TRUE(is_idempotent(m)) << m;
  }
  for (std::string_view m : {"POST", "PATCH", "CONNECT", "get"})
    EXPECT_FALSE(is_idempotent(m)) << m;
}
