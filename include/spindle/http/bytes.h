#pragma once
// Bytes a word at a time: loading the words of a name or a value, and copying the short pieces
// a message head is made of (names, values, status lines) without a call.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace spindle::http {

namespace detail {
/// Eight bytes from `p`.
inline std::uint64_t word_at(const char* p) {
  std::uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

/// For n of 4 to 8: the first four bytes of `p` and its last four (overlapping) in one word.
inline std::uint64_t ends_of(const char* p, std::size_t n) {
  std::uint32_t lo, hi;
  std::memcpy(&lo, p, 4);
  std::memcpy(&hi, p + n - 4, 4);
  return std::uint64_t{lo} | (std::uint64_t{hi} << 32);
}

// Copies n bytes, W <= n <= 2W, as the first W and the last W (which overlap when n < 2W).
template <std::size_t W>
inline void copy_ends(char* to, const char* from, std::size_t n) {
  char head[W], tail[W];
  std::memcpy(head, from, W);
  std::memcpy(tail, from + n - W, W);
  std::memcpy(to, head, W);
  std::memcpy(to + n - W, tail, W);
}
}  // namespace detail

/// True if `a` and `b` are the same bytes. Up to 16 bytes in place, as two words that overlap
/// (a call to memcmp costs more than the compare for these), anything longer by memcmp.
inline bool equal_bytes(std::string_view a, std::string_view b) {
  const std::size_t n = a.size();
  if (n != b.size()) return false;
  if (n > 16) return std::memcmp(a.data(), b.data(), n) == 0;
  if (n >= 8) {
    return ((detail::word_at(a.data()) ^ detail::word_at(b.data())) |
            (detail::word_at(a.data() + n - 8) ^ detail::word_at(b.data() + n - 8))) == 0;
  }
  if (n >= 4) return detail::ends_of(a.data(), n) == detail::ends_of(b.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

/// Copies `n` bytes from `from` to `to` (which do not overlap). A piece of at most 32 bytes is
/// copied in place (a call to memcpy costs more than the copy for these), anything longer by
/// memcpy.
inline void copy_bytes(char* to, const char* from, std::size_t n) {
  if (n >= 16) {
    if (n <= 32) return detail::copy_ends<16>(to, from, n);
    std::memcpy(to, from, n);
  } else if (n >= 8) {
    detail::copy_ends<8>(to, from, n);
  } else if (n >= 4) {
    detail::copy_ends<4>(to, from, n);
  } else if (n >= 2) {
    detail::copy_ends<2>(to, from, n);
  } else if (n == 1) {
    *to = *from;
  }
}

}  // namespace spindle::http
