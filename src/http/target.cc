#include "spindle/http/target.h"

#include <array>
#include <bit>
#include <cstring>

#include "spindle/http/bytes.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace spindle::http {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

char upper_hex(char c) { return c >= 'a' && c <= 'f' ? static_cast<char>(c - 32) : c; }

// RFC 3986 §2.3: ALPHA / DIGIT / "-" / "." / "_" / "~".
bool unreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

// Step 1 and 2: decodes the escapes of unreserved characters in [begin, end) in place; returns
// the new end.
std::expected<char*, TargetError> decode_escapes(char* begin, char* end, const PathRules& rules) {
  const bool keep = rules.escaped_slashes == PathRules::EscapedSlashes::kKeep;
  char* w = begin;
  for (char* r = begin; r < end;) {
    char c = *r;
    if (c == '\\' && !keep) return std::unexpected(TargetError{"backslash in path"});
    if (c != '%') {
      *w++ = c;
      ++r;
      continue;
    }
    if (end - r < 3) return std::unexpected(TargetError{"bad percent-encoding in path"});
    int high = hex_value(r[1]), low = hex_value(r[2]);
    if (high < 0 || low < 0) return std::unexpected(TargetError{"bad percent-encoding in path"});
    auto value = static_cast<unsigned char>(high * 16 + low);
    if (value == 0) return std::unexpected(TargetError{"encoded NUL in path"});
    if ((value == '/' || value == '\\') && !keep) {
      return std::unexpected(TargetError{"encoded slash in path"});
    }
    if (unreserved(value)) {
      *w++ = static_cast<char>(value);
    } else {
      w[0] = '%';
      w[1] = upper_hex(r[1]);
      w[2] = upper_hex(r[2]);
      w += 3;
    }
    r += 3;
  }
  return w;
}

// Steps 3 and 4: removes dot segments (and merges slashes) of the path [begin, end), which
// starts with '/', in place; returns the new end. The output never overtakes the input: each
// segment is written at or before where it was read.
char* remove_dot_segments(char* begin, char* end, bool merge_slashes) {
  char* w = begin;  // the output is a run of "/segment" pieces
  bool trailing_slash = false;
  for (char* r = begin + 1;;) {
    char* next = static_cast<char*>(std::memchr(r, '/', static_cast<std::size_t>(end - r)));
    if (next == nullptr) next = end;
    std::string_view segment(r, static_cast<std::size_t>(next - r));
    const bool last = next == end;
    if (segment == "." || segment == "..") {
      if (segment == ".." && w > begin) {
        do --w;
        while (*w != '/');  // back to the start of the last piece
      }
      trailing_slash = last;
    } else if (segment.empty()) {
      if (last) {
        trailing_slash = true;
      } else if (!merge_slashes) {
        *w++ = '/';
      }
    } else {
      *w++ = '/';
      std::memmove(w, r, segment.size());
      w += segment.size();
    }
    if (last) break;
    r = next + 1;
  }
  if (trailing_slash || w == begin) *w++ = '/';
  return w;
}

}  // namespace

namespace {

// The characters a target's scan stops at: '#' (refused), '?' (the path ends), and what may
// make the full pass change a path: '%', '\\', and '/' (followed by '.' or, merging, '/').
constexpr std::array<bool, 256> kNotable = [] {
  std::array<bool, 256> notable{};
  for (unsigned char c : {'#', '?', '%', '\\', '/'}) notable[c] = true;
  return notable;
}();

// In `path` (no query), at `c` (notable, not '#' or '?'), whose next character is `next` (0 at
// the end): true if the full pass may change something there.
bool needs_full_pass(char c, char next, const PathRules& rules) {
  if (c != '/') return true;  // '%' or '\\'
  return next == '.' || (next == '/' && rules.merge_slashes);
}

}  // namespace

bool path_is_normal(std::string_view path, const PathRules& rules) {
  // Conservative: any '%', '\\', '#', "/." or (merging) "//" takes the full pass, which may
  // find nothing to change.
  for (std::size_t i = 0; i < path.size(); ++i) {
    const char c = path[i];
    if (!kNotable[static_cast<unsigned char>(c)] || c == '?') continue;
    if (c == '#') return false;
    if (needs_full_pass(c, i + 1 < path.size() ? path[i + 1] : '\0', rules)) return false;
  }
  return true;
}

std::expected<std::size_t, TargetError> normalize_target(char* target, std::size_t size,
                                                         const PathRules& rules) {
  std::string_view whole(target, size);
  if (whole.empty() || whole == "*") return size;
  if (whole.front() == '/') {
    // The origin form, nearly every request: one scan finds a fragment, the query and whether
    // the path is already normal.
    std::size_t query_at = size;
    bool normal = true;
#if defined(__SSE2__)
    // Sixteen bytes at a time, each beside the one after it (a copy, zeros past the end, for
    // the last piece): masks of '#', '?', and of what needs the full pass ('%', '\\', "/." and,
    // merging, "//"), the last counted only before the query.
    for (std::size_t i = 0; i < size; i += 16) {
      __m128i v, next;
      if (size - i >= 17) {
        v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(target + i));
        next = _mm_loadu_si128(reinterpret_cast<const __m128i*>(target + i + 1));
      } else {
        alignas(16) char piece[33] = {};
        copy_bytes(piece, target + i, size - i);
        v = _mm_load_si128(reinterpret_cast<const __m128i*>(piece));
        next = _mm_loadu_si128(reinterpret_cast<const __m128i*>(piece + 1));
      }
      auto mask = [](__m128i bytes, char c) {
        return static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_set1_epi8(c))));
      };
      if (mask(v, '#') != 0) return std::unexpected(TargetError{"fragment in request target"});
      if (query_at != size) continue;
      unsigned full =
          mask(v, '%') | mask(v, '\\') |
          (mask(v, '/') & (mask(next, '.') | (rules.merge_slashes ? mask(next, '/') : 0)));
      if (unsigned query = mask(v, '?'); query != 0) {
        query_at = i + static_cast<std::size_t>(std::countr_zero(query));
        full &= (query & -query) - 1;  // only the bytes before it
      }
      normal = normal && full == 0;
    }
#else
    for (std::size_t i = 0; i < size; ++i) {
      const char c = target[i];
      if (!kNotable[static_cast<unsigned char>(c)]) continue;
      if (c == '#') return std::unexpected(TargetError{"fragment in request target"});
      if (c == '?') {
        if (query_at == size) query_at = i;
      } else if (query_at == size && normal) {
        normal = !needs_full_pass(c, i + 1 < size ? target[i + 1] : '\0', rules);
      }
    }
#endif
    if (normal) return size;
    auto decoded = decode_escapes(target, target + query_at, rules);
    if (!decoded) return std::unexpected(decoded.error());
    char* path_end = remove_dot_segments(target, *decoded, rules.merge_slashes);
    std::size_t query_size = size - query_at;
    std::memmove(path_end, target + query_at, query_size);
    return static_cast<std::size_t>(path_end - target) + query_size;
  }
  if (whole.find('#') != std::string_view::npos) {
    return std::unexpected(TargetError{"fragment in request target"});
  }
  std::size_t path_at = 0;
  if (whole.front() != '/') {
    std::size_t scheme = whole.find("://");
    if (scheme == std::string_view::npos) return size;  // authority form (CONNECT)
    path_at = whole.find_first_of("/?", scheme + 3);
    if (path_at == std::string_view::npos || whole[path_at] != '/') return size;  // no path
  }
  std::size_t query_at = whole.find('?', path_at);
  if (query_at == std::string_view::npos) query_at = size;
  if (path_is_normal(whole.substr(path_at, query_at - path_at), rules)) return size;

  char* path = target + path_at;
  auto decoded = decode_escapes(path, target + query_at, rules);
  if (!decoded) return std::unexpected(decoded.error());
  char* path_end = remove_dot_segments(path, *decoded, rules.merge_slashes);
  std::size_t query_size = size - query_at;
  std::memmove(path_end, target + query_at, query_size);
  return static_cast<std::size_t>(path_end - target) + query_size;
}

}  // namespace spindle::http
