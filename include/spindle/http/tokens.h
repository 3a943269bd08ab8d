#pragma once
/// The field names spindle knows, each written once: the names of HPACK's static table (RFC
/// 7541 Appendix A) and every name one of spindle's rules names, with what the rules say of
/// it. A field parsed by the HTTP/1 parser, decoded by HPACK or added to a HeaderMap carries
/// its name's token (Field::token) when it has one: whether it is a given known field is then
/// one pointer compare, and what the rules say of it one load.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "spindle/http/bytes.h"

namespace spindle::http {

/// What spindle's rules say of a field name (Token::flags).
namespace field_flag {
/// Describes one connection (RFC 9110 §7.6.1; RFC 9113 §8.2.2; HTTP2-Settings, §3.2.1).
inline constexpr std::uint16_t kHopByHop = 1;
/// Delimits the message's body (Content-Length, Transfer-Encoding): whoever sends a message
/// writes its own.
inline constexpr std::uint16_t kFraming = 2;
/// Names the target's authority (Host): the client writes its own.
inline constexpr std::uint16_t kHost = 4;
/// Describes the message itself, never a trailer (RFC 9110 §6.5.1: Trailer, Content-Type,
/// Content-Encoding, Content-Range, with the framing and Host).
inline constexpr std::uint16_t kNotInTrailers = 8;
/// Owned by the gateway: it says what the request was, and who sent it, to the upstream and to
/// a forward_auth service (Via, Forwarded, X-Forwarded-*, X-Real-IP, X-Request-Id, traceparent,
/// the original URL and method; Expect, which it answers itself). A client's own never go on as
/// sent: the gateway writes its own (folding in a trusted proxy's, where it says so) or none.
inline constexpr std::uint16_t kSetByProxy = 16;
/// Its values are secrets (credentials, sessions, API keys): HPACK never indexes them, and
/// says so to the next hop (RFC 7541 §7.1.3).
inline constexpr std::uint16_t kSensitive = 32;
/// Its value is new in every message (the request id and trace context a gateway writes):
/// HPACK does not index it, as it would never be named again.
inline constexpr std::uint16_t kUniquePerMessage = 64;
/// A request has it once at most (RFC 9110's fields whose value is not a list, and those of
/// CORS and WebSocket said to appear once): two are ambiguous (which one did the gateway judge,
/// which one will the upstream read?) and the request is refused (canonical.h).
inline constexpr std::uint16_t kSingleton = 128;
/// Its values are the same for many clients and name none of them (a method, a media type, a
/// language, the gateway's own Via): an HPACK table shared by many clients' messages (a
/// gateway's upstream connection) indexes these values and no other (docs/security.md).
inline constexpr std::uint16_t kSharedValue = 256;
}  // namespace field_flag

/// A known field name.
struct Token {
  /// Lower case.
  std::string_view name;
  /// field_flag bits.
  std::uint16_t flags = 0;
  /// Its first entry in HPACK's static table (entries of one name are together); 0 if none.
  std::uint8_t hpack_index = 0;
};

namespace detail {
/// True if `a` and `b`, of the same size, are equal without regard to ASCII case (header_map.cc:
/// a word at a time).
bool iequals_same_size(std::string_view a, std::string_view b);

/// ASCII lower case of eight bytes at once: each byte's low seven bits plus 0x3f (0x25) carries
/// into its high bit exactly when they are at least 'A' (above 'Z'), and no byte carries into
/// the next; letters of bytes below 0x80 get 0x20 (the bit is clear in 'A'..'Z').
constexpr std::uint64_t lower8(std::uint64_t w) {
  constexpr std::uint64_t kOnes = 0x0101010101010101ull;
  constexpr std::uint64_t kHighs = kOnes * 0x80;
  std::uint64_t low7 = w & ~kHighs;
  std::uint64_t at_least_a = low7 + kOnes * (0x80 - 'A');
  std::uint64_t above_z = low7 + kOnes * (0x80 - 'Z' - 1);
  std::uint64_t upper = at_least_a & ~above_z & ~w & kHighs;
  return w | (upper >> 2);
}

/// True if `name` is `lower` (lower case, of the same size) without regard to ASCII case: only
/// `name` needs lowering, and a word at a time.
inline bool equals_lower_case(std::string_view lower, std::string_view name) {
  const std::size_t n = name.size();
  if (n >= 8) {
    for (std::size_t i = 0; i + 8 <= n; i += 8) {
      if (lower8(word_at(name.data() + i)) != word_at(lower.data() + i)) return false;
    }
    return lower8(word_at(name.data() + n - 8)) == word_at(lower.data() + n - 8);
  }
  if (n >= 4) return lower8(ends_of(name.data(), n)) == ends_of(lower.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    char c = name[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    if (c != lower[i]) return false;
  }
  return true;
}

namespace f = field_flag;
// Every known name, once.
inline constexpr Token kTokens[] = {
    // HPACK's static table, its names in its order (RFC 7541 Appendix A).
    {":authority", f::kSharedValue, 1},
    {":method", f::kSharedValue, 2},
    {":path", 0, 4},
    {":scheme", f::kSharedValue, 6},
    {":status", f::kSharedValue, 8},
    {"accept-charset", f::kSharedValue, 15},
    {"accept-encoding", f::kSharedValue, 16},
    {"accept-language", f::kSharedValue, 17},
    {"accept-ranges", 0, 18},
    {"accept", f::kSharedValue, 19},
    {"access-control-allow-origin", 0, 20},
    {"age", 0, 21},
    {"allow", 0, 22},
    {"authorization", f::kSensitive | f::kSingleton, 23},
    {"cache-control", f::kSharedValue, 24},
    {"content-disposition", 0, 25},
    {"content-encoding", f::kNotInTrailers | f::kSharedValue, 26},
    {"content-language", f::kSharedValue, 27},
    {"content-length", f::kFraming | f::kNotInTrailers, 28},
    {"content-location", f::kSingleton, 29},
    {"content-range", f::kNotInTrailers | f::kSingleton, 30},
    {"content-type", f::kNotInTrailers | f::kSingleton | f::kSharedValue, 31},
    {"cookie", f::kSensitive, 32},
    {"date", f::kSingleton, 33},
    {"etag", 0, 34},
    {"expect", f::kSetByProxy | f::kSharedValue, 35},
    {"expires", 0, 36},
    {"from", f::kSingleton, 37},
    {"host", f::kHost | f::kNotInTrailers | f::kSingleton, 38},
    {"if-match", 0, 39},
    {"if-modified-since", f::kSingleton, 40},
    {"if-none-match", 0, 41},
    {"if-range", f::kSingleton, 42},
    {"if-unmodified-since", f::kSingleton, 43},
    {"last-modified", 0, 44},
    {"link", 0, 45},
    {"location", 0, 46},
    {"max-forwards", f::kSingleton, 47},
    {"proxy-authenticate", 0, 48},
    {"proxy-authorization", f::kSensitive | f::kSingleton, 49},
    {"range", f::kSingleton, 50},
    {"referer", f::kSingleton, 51},
    {"refresh", 0, 52},
    {"retry-after", 0, 53},
    {"server", 0, 54},
    {"set-cookie", f::kSensitive, 55},
    {"strict-transport-security", 0, 56},
    {"transfer-encoding", f::kHopByHop | f::kFraming | f::kNotInTrailers, 57},
    {"user-agent", f::kSingleton, 58},
    {"vary", 0, 59},
    {"via", f::kSetByProxy | f::kSharedValue, 60},
    {"www-authenticate", 0, 61},
    // The names of spindle's rules HPACK's table does not have.
    {":protocol", 0, 0},  // RFC 8441
    {"connection", f::kHopByHop, 0},
    {"proxy-connection", f::kHopByHop, 0},
    {"keep-alive", f::kHopByHop, 0},
    {"te", f::kHopByHop | f::kSharedValue, 0},
    {"upgrade", f::kHopByHop, 0},
    {"http2-settings", f::kHopByHop, 0},
    {"trailer", f::kNotInTrailers, 0},
    {"x-forwarded-for", f::kSetByProxy, 0},
    {"x-forwarded-proto", f::kSetByProxy | f::kSharedValue, 0},
    {"x-forwarded-host", f::kSetByProxy | f::kSharedValue, 0},
    {"x-request-id", f::kSetByProxy | f::kUniquePerMessage, 0},
    {"traceparent", f::kSetByProxy | f::kUniquePerMessage, 0},
    // What the gateway alone says of a request (kSetByProxy): who sent it, and what it was
    // before the gateway (auth services, and frameworks behind proxies, read these).
    {"forwarded", f::kSetByProxy, 0},
    {"x-real-ip", f::kSetByProxy, 0},
    {"x-forwarded-port", f::kSetByProxy, 0},
    {"x-forwarded-prefix", f::kSetByProxy, 0},
    {"x-forwarded-server", f::kSetByProxy, 0},
    {"x-forwarded-ssl", f::kSetByProxy, 0},
    {"x-forwarded-scheme", f::kSetByProxy, 0},
    {"x-forwarded-uri", f::kSetByProxy, 0},
    {"x-forwarded-method", f::kSetByProxy, 0},
    {"x-original-url", f::kSetByProxy, 0},
    {"x-original-uri", f::kSetByProxy, 0},
    {"x-original-method", f::kSetByProxy, 0},
    {"x-rewrite-url", f::kSetByProxy, 0},
    {"x-http-method-override", f::kSetByProxy, 0},
    {"x-http-method", f::kSetByProxy, 0},
    {"x-method-override", f::kSetByProxy, 0},
    {"tracestate", 0, 0},
    {"origin", f::kSingleton, 0},
    {"access-control-request-method", f::kSingleton | f::kSharedValue, 0},
    {"access-control-request-headers", f::kSharedValue, 0},
    {"sec-websocket-key", f::kSingleton, 0},
    {"sec-websocket-accept", 0, 0},
    {"sec-websocket-version", f::kSingleton | f::kSharedValue, 0},
    // Credentials under names of their own (API gateways' and frameworks' usual ones).
    {"x-api-key", f::kSensitive, 0},
    {"api-key", f::kSensitive, 0},
    {"x-auth-token", f::kSensitive, 0},
    {"x-access-token", f::kSensitive, 0},
    {"x-goog-api-key", f::kSensitive, 0},
    {"x-csrf-token", f::kSensitive, 0},
    {"x-xsrf-token", f::kSensitive, 0},
    {"x-amz-security-token", f::kSensitive, 0},
};

// Each name has a slot of its own in a table of 1024: a key from its length, its first byte, its
// last two and its third, any case (| 0x20 lower-cases letters and leaves the other bytes of known
// names as they are), times a multiplier, top ten bits. The multiplier is the first of a sequence
// under which no two known names share a slot, found while compiling: a lookup is one slot and
// at most one compare, with no probing. (With 88 names, 512 slots took 7,679 tries, past
// clang's constexpr step limit; 1024 take 12 for today's 96.)
inline constexpr unsigned kTokenSlotBits = 10;
constexpr std::uint32_t token_key(std::string_view name) {  // name.size() >= 2
  auto byte = [](char c) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(c) | 0x20);
  };
  // (Not the second byte: "x-forwarded-host" and "-port" differ only near their ends; the
  // third folded into the last: "x-csrf-token" and "x-xsrf-token" differ only there.)
  return (static_cast<std::uint32_t>(name.size()) & 0xff) | byte(name[0]) << 8 |
         byte(name[name.size() - 2]) << 16 |
         (byte(name.back()) ^ byte(name[name.size() > 2 ? 2 : 1])) << 24;
}
constexpr std::size_t token_slot(std::uint32_t key, std::uint32_t multiplier) {
  return (key * multiplier) >> (32 - kTokenSlotBits);
}
struct TokenTable {
  std::uint32_t multiplier = 0;
  /// kTokens by slot: index + 1; 0 for a slot no known name has.
  std::array<std::uint8_t, std::size_t{1} << kTokenSlotBits> index{};
};
inline constexpr TokenTable kTokenTable = [] {
  for (std::uint32_t i = 1;; ++i) {
    TokenTable table{.multiplier = (i * 0x9e3779b1u) | 1u};
    bool clash = false;
    for (std::size_t k = 0; k < std::size(kTokens) && !clash; ++k) {
      std::uint8_t& slot = table.index[token_slot(token_key(kTokens[k].name), table.multiplier)];
      clash = slot != 0;
      slot = static_cast<std::uint8_t>(k + 1);
    }
    if (!clash) return table;
  }
}();
static_assert(std::size(kTokens) < 256, "a token's index + 1 must fit a byte");

consteval const Token& named(std::string_view name) {
  for (const Token& token : kTokens) {
    if (token.name == name) return token;
  }
  throw "not a known field name";
}
}  // namespace detail

/// The token of `name` (any case), or nullptr for a name spindle has no rule for: one slot is
/// looked at, and its name compared only where the length matches.
inline const Token* find_token(std::string_view name) {
  if (name.size() < 2) return nullptr;  // no known name is shorter
  const std::uint8_t at =
      detail::kTokenTable
          .index[detail::token_slot(detail::token_key(name), detail::kTokenTable.multiplier)];
  if (at == 0) return nullptr;
  const Token& token = detail::kTokens[at - 1];
  return token.name.size() == name.size() && detail::equals_lower_case(token.name, name) ? &token
                                                                                         : nullptr;
}

/// Every known name, by name: `token::kContentLength` is "content-length".
namespace token {
inline constexpr const Token& kAuthority = detail::named(":authority");
inline constexpr const Token& kMethod = detail::named(":method");
inline constexpr const Token& kPath = detail::named(":path");
inline constexpr const Token& kScheme = detail::named(":scheme");
inline constexpr const Token& kStatus = detail::named(":status");
inline constexpr const Token& kAcceptCharset = detail::named("accept-charset");
inline constexpr const Token& kAcceptEncoding = detail::named("accept-encoding");
inline constexpr const Token& kAcceptLanguage = detail::named("accept-language");
inline constexpr const Token& kAcceptRanges = detail::named("accept-ranges");
inline constexpr const Token& kAccept = detail::named("accept");
inline constexpr const Token& kAccessControlAllowOrigin =
    detail::named("access-control-allow-origin");
inline constexpr const Token& kAge = detail::named("age");
inline constexpr const Token& kAllow = detail::named("allow");
inline constexpr const Token& kAuthorization = detail::named("authorization");
inline constexpr const Token& kCacheControl = detail::named("cache-control");
inline constexpr const Token& kContentDisposition = detail::named("content-disposition");
inline constexpr const Token& kContentEncoding = detail::named("content-encoding");
inline constexpr const Token& kContentLanguage = detail::named("content-language");
inline constexpr const Token& kContentLength = detail::named("content-length");
inline constexpr const Token& kContentLocation = detail::named("content-location");
inline constexpr const Token& kContentRange = detail::named("content-range");
inline constexpr const Token& kContentType = detail::named("content-type");
inline constexpr const Token& kCookie = detail::named("cookie");
inline constexpr const Token& kDate = detail::named("date");
inline constexpr const Token& kEtag = detail::named("etag");
inline constexpr const Token& kExpect = detail::named("expect");
inline constexpr const Token& kExpires = detail::named("expires");
inline constexpr const Token& kFrom = detail::named("from");
inline constexpr const Token& kHost = detail::named("host");
inline constexpr const Token& kIfMatch = detail::named("if-match");
inline constexpr const Token& kIfModifiedSince = detail::named("if-modified-since");
inline constexpr const Token& kIfNoneMatch = detail::named("if-none-match");
inline constexpr const Token& kIfRange = detail::named("if-range");
inline constexpr const Token& kIfUnmodifiedSince = detail::named("if-unmodified-since");
inline constexpr const Token& kLastModified = detail::named("last-modified");
inline constexpr const Token& kLink = detail::named("link");
inline constexpr const Token& kLocation = detail::named("location");
inline constexpr const Token& kMaxForwards = detail::named("max-forwards");
inline constexpr const Token& kProxyAuthenticate = detail::named("proxy-authenticate");
inline constexpr const Token& kProxyAuthorization = detail::named("proxy-authorization");
inline constexpr const Token& kRange = detail::named("range");
inline constexpr const Token& kReferer = detail::named("referer");
inline constexpr const Token& kRefresh = detail::named("refresh");
inline constexpr const Token& kRetryAfter = detail::named("retry-after");
inline constexpr const Token& kServer = detail::named("server");
inline constexpr const Token& kSetCookie = detail::named("set-cookie");
inline constexpr const Token& kStrictTransportSecurity = detail::named("strict-transport-security");
inline constexpr const Token& kTransferEncoding = detail::named("transfer-encoding");
inline constexpr const Token& kUserAgent = detail::named("user-agent");
inline constexpr const Token& kVary = detail::named("vary");
inline constexpr const Token& kVia = detail::named("via");
inline constexpr const Token& kWwwAuthenticate = detail::named("www-authenticate");
inline constexpr const Token& kProtocol = detail::named(":protocol");
inline constexpr const Token& kConnection = detail::named("connection");
inline constexpr const Token& kProxyConnection = detail::named("proxy-connection");
inline constexpr const Token& kKeepAlive = detail::named("keep-alive");
inline constexpr const Token& kTe = detail::named("te");
inline constexpr const Token& kUpgrade = detail::named("upgrade");
inline constexpr const Token& kHttp2Settings = detail::named("http2-settings");
inline constexpr const Token& kTrailer = detail::named("trailer");
inline constexpr const Token& kXForwardedFor = detail::named("x-forwarded-for");
inline constexpr const Token& kXForwardedProto = detail::named("x-forwarded-proto");
inline constexpr const Token& kXForwardedHost = detail::named("x-forwarded-host");
inline constexpr const Token& kXRequestId = detail::named("x-request-id");
inline constexpr const Token& kTraceparent = detail::named("traceparent");
inline constexpr const Token& kForwarded = detail::named("forwarded");
inline constexpr const Token& kXRealIp = detail::named("x-real-ip");
inline constexpr const Token& kXForwardedPort = detail::named("x-forwarded-port");
inline constexpr const Token& kXForwardedPrefix = detail::named("x-forwarded-prefix");
inline constexpr const Token& kXForwardedServer = detail::named("x-forwarded-server");
inline constexpr const Token& kXForwardedSsl = detail::named("x-forwarded-ssl");
inline constexpr const Token& kXForwardedScheme = detail::named("x-forwarded-scheme");
inline constexpr const Token& kXForwardedUri = detail::named("x-forwarded-uri");
inline constexpr const Token& kXForwardedMethod = detail::named("x-forwarded-method");
inline constexpr const Token& kXOriginalUrl = detail::named("x-original-url");
inline constexpr const Token& kXOriginalUri = detail::named("x-original-uri");
inline constexpr const Token& kXOriginalMethod = detail::named("x-original-method");
inline constexpr const Token& kXRewriteUrl = detail::named("x-rewrite-url");
inline constexpr const Token& kXHttpMethodOverride = detail::named("x-http-method-override");
inline constexpr const Token& kXHttpMethod = detail::named("x-http-method");
inline constexpr const Token& kXMethodOverride = detail::named("x-method-override");
inline constexpr const Token& kTracestate = detail::named("tracestate");
inline constexpr const Token& kOrigin = detail::named("origin");
inline constexpr const Token& kAccessControlRequestMethod =
    detail::named("access-control-request-method");
inline constexpr const Token& kAccessControlRequestHeaders =
    detail::named("access-control-request-headers");
inline constexpr const Token& kSecWebsocketKey = detail::named("sec-websocket-key");
inline constexpr const Token& kSecWebsocketAccept = detail::named("sec-websocket-accept");
inline constexpr const Token& kSecWebsocketVersion = detail::named("sec-websocket-version");
}  // namespace token

}  // namespace spindle::http
