#pragma once
/// The HTTP rules every part of spindle follows, written once: which bytes may form a method, a
/// field name, a field value or a request target (RFC 9110 §5, §9, §7.1); which fields belong to
/// one connection only (hop-by-hop, RFC 9110 §7.6.1, including those `Connection` names); and
/// how a message's body is delimited (RFC 9112 §6.3). The HTTP/1 parsers, the server's HTTP/1
/// and HTTP/2 drivers and the client (HTTP/1 and HTTP/2) all decide through these functions.
/// No I/O, no allocation.

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "spindle/http/bytes.h"
#include "spindle/http/header_map.h"
#include "spindle/http/tokens.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace spindle::http {

namespace detail {
/// RFC 9110 tchar: the characters of a token.
constexpr std::array<bool, 256> make_token_table() {
  std::array<bool, 256> t{};
  for (int c = '0'; c <= '9'; ++c) t[c] = true;
  for (int c = 'a'; c <= 'z'; ++c) t[c] = true;
  for (int c = 'A'; c <= 'Z'; ++c) t[c] = true;
  for (char c : std::string_view("!#$%&'*+-.^_`|~")) t[static_cast<unsigned char>(c)] = true;
  return t;
}
inline constexpr std::array<bool, 256> kTokenChars = make_token_table();

/// Eight bytes at a time (the common case is all valid): any byte below n (n <= 128), equal
/// to b, or at least 0x7f. Exact as yes/no answers; a bytewise check then finds the one.
constexpr std::uint64_t kOnes = 0x0101010101010101ull;
constexpr std::uint64_t kHighs = 0x8080808080808080ull;
/// The high bit of each byte below n (or equal to b): the lowest one set is exact; a byte above
/// a flagged one may be flagged wrongly (a borrow), never one below.
inline std::uint64_t below_mask(std::uint64_t w, unsigned n) {
  return (w - kOnes * n) & ~w & kHighs;
}
inline std::uint64_t equal_mask(std::uint64_t w, unsigned b) {
  std::uint64_t x = w ^ (kOnes * b);
  return (x - kOnes) & ~x & kHighs;
}
inline bool any_below(std::uint64_t w, unsigned n) { return below_mask(w, n) != 0; }
inline bool any_at_least_7f(std::uint64_t w) {
  return ((((w & ~kHighs) + kOnes) | w) & kHighs) != 0;
}

/// The length of the prefix of `s` whose characters all pass `ok`; `suspect` flags words that
/// may hold one that does not (the words it passes are skipped, the rest checked bytewise).
template <typename Suspect, typename Ok>
std::size_t valid_prefix(std::string_view s, Suspect suspect, Ok ok) {
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    if (suspect(w)) break;
  }
  while (i < s.size() && ok(s[i])) ++i;
  return i;
}
}  // namespace detail

// ---- characters ------------------------------------------------------------------------------

/// True if `c` may appear in a token (method, field name, transfer coding).
inline bool is_tchar(char c) { return detail::kTokenChars[static_cast<unsigned char>(c)]; }

/// True if `s` is a non-empty token (RFC 9110 §5.6.2).
inline bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_tchar(c)) return false;
  }
  return true;
}

/// A field name is a token (RFC 9110 §5.1).
inline bool is_field_name(std::string_view s) { return is_token(s); }

/// A method is a token (RFC 9110 §9.1).
inline bool is_method(std::string_view s) { return is_token(s); }

/// True if `c` may appear in a field value: HTAB, SP, visible ASCII and obs-text; never NUL,
/// CR, LF or another control character (RFC 9110 §5.5). What a sender could use to end a field
/// early (response splitting, request smuggling) is exactly what this refuses.
inline bool is_field_value_char(char c) {
  auto u = static_cast<unsigned char>(c);
  return u == '\t' || (u >= 0x20 && u != 0x7f);
}

namespace detail {
/// The offset of the first byte of [p, p + n) below 0x20 or equal to 0x7f — the bytes a field
/// value may hold only as HTAB, or never — or n if there is none. Sixteen bytes at a time
/// where SSE2 is there (every x86-64), eight at a time otherwise; the last bytes as a load that
/// overlaps bytes already passed (clean, so the first byte it flags is the answer).
inline std::size_t first_control(const char* p, std::size_t n) {
  std::size_t i = 0;
#if defined(__SSE2__)
  if (n >= 16) {
    const __m128i space = _mm_set1_epi8(0x20);
    const __m128i del = _mm_set1_epi8(0x7f);
    // The bytes from `at` flagged: below 0x20 (unsigned: max(v, 0x20) differs from v) or 0x7f.
    auto stops_at = [&](std::size_t at) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at));
      const unsigned printable =
          static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(v, space), v)));
      return (~printable & 0xffffu) |
             static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, del)));
    };
    for (; i + 16 <= n; i += 16) {
      if (unsigned stops = stops_at(i); stops != 0) return i + std::countr_zero(stops);
    }
    if (i == n) return n;
    const unsigned stops = stops_at(n - 16);
    return stops == 0 ? n : n - 16 + std::countr_zero(stops);
  }
#endif
  auto stops_in = [](std::uint64_t w) { return below_mask(w, 0x20) | equal_mask(w, 0x7f); };
  std::uint64_t w;
  if (n < 8) {
    w = kOnes * 'a';  // padding that passes
    copy_bytes(reinterpret_cast<char*>(&w), p, n);
    const std::uint64_t stops = stops_in(w);
    return stops == 0 ? n : static_cast<std::size_t>(std::countr_zero(stops)) / 8;
  }
  for (; i + 8 <= n; i += 8) {
    std::memcpy(&w, p + i, 8);
    if (std::uint64_t stops = stops_in(w); stops != 0) {
      return i + static_cast<std::size_t>(std::countr_zero(stops)) / 8;
    }
  }
  if (i == n) return n;
  std::memcpy(&w, p + n - 8, 8);
  const std::uint64_t stops = stops_in(w);
  return stops == 0 ? n : n - 8 + static_cast<std::size_t>(std::countr_zero(stops)) / 8;
}

/// The length of the token characters that begin [p, p + n). Letters, digits and '-' (nearly
/// all of every field name) sixteen at a time where SSE2 is there; the other tchars one by one.
inline std::size_t token_run(const char* p, std::size_t n) {
  std::size_t i = 0;
#if defined(__SSE2__)
  const __m128i case_bit = _mm_set1_epi8(0x20);
  while (i + 16 <= n) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    // A letter: v | 0x20 in 'a'..'z' (min(x, 25) == x: x at most 25, unsigned). A digit alike.
    const __m128i letter = _mm_sub_epi8(_mm_or_si128(v, case_bit), _mm_set1_epi8('a'));
    const __m128i digit = _mm_sub_epi8(v, _mm_set1_epi8('0'));
    const __m128i ok =
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(_mm_min_epu8(letter, _mm_set1_epi8(25)), letter),
                                  _mm_cmpeq_epi8(_mm_min_epu8(digit, _mm_set1_epi8(9)), digit)),
                     _mm_cmpeq_epi8(v, _mm_set1_epi8('-')));
    const unsigned mask = static_cast<unsigned>(_mm_movemask_epi8(ok));
    if (mask == 0xffffu) {
      i += 16;
      continue;
    }
    i += static_cast<std::size_t>(std::countr_zero(~mask));
    if (!kTokenChars[static_cast<unsigned char>(p[i])]) return i;
    ++i;
  }
#endif
  while (i < n && kTokenChars[static_cast<unsigned char>(p[i])]) ++i;
  return i;
}
}  // namespace detail

/// True if every character of `s` may appear in a field value (the empty value may).
inline bool is_field_value(std::string_view s) {
  std::size_t i = detail::first_control(s.data(), s.size());
  while (i < s.size()) {
    if (s[i] != '\t') return false;
    ++i;
    i += detail::first_control(s.data() + i, s.size() - i);
  }
  return true;
}

/// True if `c` may appear in a request target as sent on the wire: visible ASCII only.
inline bool is_target_char(char c) {
  auto u = static_cast<unsigned char>(c);
  return u > 0x20 && u < 0x7f;
}

/// The length of the longest prefix of `s` made of request-target characters: sixteen bytes
/// at a time where SSE2 is there (as bytes taken signed, 0x21..0x7e are those above 0x20 and
/// below 0x7f), else eight.
inline std::size_t target_prefix_length(std::string_view s) {
#if defined(__SSE2__)
  if (s.size() >= 16) {
    auto stops_at = [&](std::size_t at) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.data() + at));
      const __m128i ok = _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8(0x20)),
                                       _mm_cmplt_epi8(v, _mm_set1_epi8(0x7f)));
      return ~static_cast<unsigned>(_mm_movemask_epi8(ok)) & 0xffffu;
    };
    std::size_t i = 0;
    for (; i + 16 <= s.size(); i += 16) {
      if (unsigned stops = stops_at(i); stops != 0) return i + std::countr_zero(stops);
    }
    if (i == s.size()) return i;
    const unsigned stops = stops_at(s.size() - 16);
    return stops == 0 ? s.size() : s.size() - 16 + std::countr_zero(stops);
  }
#endif
  auto suspect = [](std::uint64_t w) {
    return detail::any_below(w, 0x21) || detail::any_at_least_7f(w);
  };
  return detail::valid_prefix(s, suspect, is_target_char);
}

/// True if `s` is a request target that may be sent: non-empty, visible ASCII only, and in
/// origin form ("/path?query"), asterisk form ("*"), or absolute or authority form.
bool is_request_target(std::string_view s);

// ---- field names with a rule -----------------------------------------------------------------

/// The field_flag bits of `name` (any case) among `wanted`; 0 for a name no rule names (the
/// token table, tokens.h, holds them).
inline std::uint16_t field_flags(std::string_view name, std::uint16_t wanted = 0xffff) {
  const Token* token = find_token(name);
  return token == nullptr ? 0 : token->flags & wanted;
}
/// The same for a field, from the token it carries: one load.
inline std::uint16_t field_flags(const Field& field, std::uint16_t wanted = 0xffff) {
  return field.token == nullptr ? 0 : field.token->flags & wanted;
}

// ---- fields that belong to one connection ----------------------------------------------------

/// True for the fields that describe one connection and are never forwarded as they are:
/// Connection, Proxy-Connection, Keep-Alive, TE, Transfer-Encoding, Upgrade (RFC 9110 §7.6.1;
/// the same set is connection-specific in HTTP/2, RFC 9113 §8.2.2), and HTTP2-Settings (which
/// only means something on the connection that asks for h2c, RFC 9113 §3.2.1).
inline bool is_hop_by_hop(std::string_view name) {
  return field_flags(name, field_flag::kHopByHop) != 0;
}

/// True if a trailer field may be sent on (by the server to its client, by the client to an
/// upstream; HTTP/1.1 chunked or HTTP/2): a valid name and value, not hop-by-hop, and none of
/// the fields RFC 9110 §6.5.1 keeps out of trailers because a recipient would act on them as if
/// they were in the head (framing: Content-Length, Transfer-Encoding, Trailer; routing: Host;
/// the content's own description: Content-Encoding, Content-Type, Content-Range). The one rule
/// for trailers, on every path.
bool is_trailer_sendable(std::string_view name, std::string_view value);

/// True if a Connection field of `headers` lists `name` (so it is hop-by-hop too).
bool connection_nominates(const HeaderMap& headers, std::string_view name);

/// The names a message's Connection and Proxy-Connection fields list, read once: checking each
/// field of the message against them is then a look at a few names, not a scan of the whole
/// message per field (connection_nominates). A listed name spindle knows is kept as its token,
/// so a field with a token is checked by pointer (a HeaderMap field has its name's token when
/// it has one). Refers to `headers`, which must outlive it.
class NominatedFields {
 public:
  explicit NominatedFields(const HeaderMap& headers) : headers_(headers) {
    // Connection and Proxy-Connection are hop-by-hop: most maps (every HTTP/2 message's) have
    // no such field, and need no scan.
    if (headers.may_hold(field_flag::kHopByHop)) read();
  }
  /// True if the field's name is listed (names compared without regard to case). Most
  /// messages list none: then no call.
  bool contains(const Field& field) const { return !empty() && listed(field); }
  bool contains(std::string_view name) const { return contains(Field{name, {}, find_token(name)}); }
  bool empty() const { return count_ == 0 && !overflow_; }

 private:
  static constexpr std::size_t kInline = 8;
  /// A listed name, and its token if it has one.
  struct Name {
    std::string_view text;
    const Token* token;
  };
  const HeaderMap& headers_;
  /// Reads the names listed.
  void read();
  /// contains() of a message that lists some.
  bool listed(const Field& field) const;
  std::array<Name, kInline> names_;  // the first count_ are set
  std::size_t count_ = 0;
  /// More than kInline names: contains() asks connection_nominates.
  bool overflow_ = false;
};

/// Where the fields of a message are going, for forwardable(). Whoever sends a message writes
/// some fields itself and leaves the given ones of those names out; every sender leaves out the
/// hop-by-hop fields and those a Connection field names.
enum class FieldsFor : std::uint16_t {
  /// Any message an intermediary passes on: only what describes the connection stays.
  kEndToEnd = field_flag::kHopByHop,
  /// A request a client writes (HTTP/1.1 or HTTP/2): it writes Host (from the authority) and
  /// the framing of the body it sends.
  kRequest = field_flag::kHopByHop | field_flag::kFraming | field_flag::kHost,
  /// A response a server writes: it writes the framing.
  kResponse = field_flag::kHopByHop | field_flag::kFraming,
  /// A request the gateway passes on to its upstream: it sets the forwarded fields itself
  /// (kSetByProxy); the client it hands the request to then writes Host and the framing.
  kProxiedRequest = field_flag::kHopByHop | field_flag::kSetByProxy,
  /// A request the gateway makes of an auth service from its client's (forward_auth): none of
  /// the client's Host, framing or forwarded fields go.
  kAuthRequest = kRequest | field_flag::kSetByProxy,
};

/// True if the field `name` of a message goes on as given where `to` says: the one filter of
/// what the client, the server and the gateway pass on, decided by the flags of the field rule
/// table and the names the message's Connection fields list (`nominated`). The exceptions a
/// sender makes stay with it (a 101 keeps Upgrade and Connection; TE: trailers goes upstream).
inline bool forwardable(const Field& field, const NominatedFields& nominated, FieldsFor to) {
  return field_flags(field, static_cast<std::uint16_t>(to)) == 0 && !nominated.contains(field);
}
/// The same for a field known by its name only.
inline bool forwardable(std::string_view name, const NominatedFields& nominated, FieldsFor to) {
  return field_flags(name, static_cast<std::uint16_t>(to)) == 0 && !nominated.contains(name);
}

/// Removes every hop-by-hop field and every field the Connection fields name. Returns how many.
std::size_t remove_hop_by_hop(HeaderMap& headers);

/// Calls `fn(field)` for each field of `headers` that is not hop-by-hop (nor named by a
/// Connection field), in order: the fields an intermediary forwards.
template <typename Fn>
void for_each_end_to_end(const HeaderMap& headers, Fn&& fn) {
  NominatedFields nominated(headers);
  for (const Field& f : headers) {
    if (forwardable(f, nominated, FieldsFor::kEndToEnd)) fn(f);
  }
}

// ---- framing (RFC 9112 §6.3) -----------------------------------------------------------------

/// How a message body is delimited.
struct BodyFraming {
  enum class Kind {
    kNone,        ///< no body at all (HEAD responses, 1xx, 204, 304, requests without length)
    kLength,      ///< exactly `length` bytes
    kChunked,     ///< chunked transfer coding
    kUntilClose,  ///< responses only: the body ends when the connection does
    kTunnel,      ///< 2xx to CONNECT, 101: the connection becomes a tunnel
  };
  Kind kind = Kind::kNone;
  /// kLength: the body size.
  std::uint64_t length = 0;
};

/// A framing decision that went wrong: the status to answer (requests: 400 or 501; responses:
/// 502) and why.
struct FramingError {
  int status = 400;
  std::string_view reason;
};

/// Content-Length: 1*DIGIT, or a list of identical ones ("5, 5", which RFC 9110 §8.6 lets a
/// recipient accept). Signs, hex, spaces inside and overflow are nullopt.
std::optional<std::uint64_t> parse_content_length(std::string_view value);

/// What the Transfer-Encoding fields of a message say.
struct TransferCodings {
  /// A Transfer-Encoding field is present.
  bool present = false;
  /// Its final coding is chunked (RFC 9112 §6.3 rules 3 and 4 turn on it).
  bool chunked_last = false;
  /// A coding other than chunked is listed (we decode none).
  bool other = false;
  /// Malformed: empty codings, or chunked listed twice.
  bool malformed = false;
};

/// Reads every Transfer-Encoding field of `headers`.
TransferCodings transfer_codings(const HeaderMap& headers);

/// The fields of a message that decide its framing, gathered in one pass by a parser (or by
/// collect_framing_fields).
struct FramingFields {
  /// How many Content-Length fields there were, and the value all of them agree on.
  std::size_t content_length_fields = 0;
  std::optional<std::uint64_t> content_length;
  /// A Content-Length field was malformed, or two disagreed.
  bool content_length_invalid = false;
  /// A Transfer-Encoding field was present.
  bool transfer_encoding = false;

  /// Notes one Content-Length value.
  void note_content_length(std::string_view value);
};

/// Gathers the framing fields of `headers` (for messages not built by a parser).
FramingFields collect_framing_fields(const HeaderMap& headers);

/// The framing of a request (RFC 9112 §6.3 rules 4-6, strict): chunked if Transfer-Encoding
/// ends in chunked (501 for other codings, 400 if it does not end in chunked, with
/// Content-Length too, or in HTTP/1.0); else Content-Length (400 if invalid); else no body.
/// `headers` is read only when fields.transfer_encoding is set.
[[nodiscard]] std::optional<FramingError> request_framing(const HeaderMap& headers,
                                                          const FramingFields& fields,
                                                          int minor_version, BodyFraming& out);

/// The framing of a response to `request_method` (RFC 9112 §6.3 rules 1-7): none for HEAD,
/// 1xx, 204 and 304; a tunnel for 2xx to CONNECT; chunked if Transfer-Encoding ends in chunked
/// (it overrides Content-Length), until close if it lists another final coding; else
/// Content-Length (502 if invalid); else until close.
[[nodiscard]] std::optional<FramingError> response_framing(const HeaderMap& headers,
                                                           const FramingFields& fields, int status,
                                                           std::string_view request_method,
                                                           BodyFraming& out);

/// True for methods whose request may be repeated with the same effect (RFC 9110 §9.2.2):
/// GET, HEAD, OPTIONS, TRACE, PUT, DELETE.
bool is_idempotent(std::string_view method);

}  // namespace spindle::http
