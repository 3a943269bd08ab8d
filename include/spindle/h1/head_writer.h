#pragma once
// Writing an HTTP/1 message head into room reserved for its longest form (private to
// src/http): the server's response heads and the client's request heads. The caller bounds the
// size first (fixed lines, each field's name and value plus 4, 20 digits for a number), then
// copies each piece in with no capacity check per piece.

#include <charconv>
#include <cstdint>
#include <string_view>

#include "spindle/http/bytes.h"

namespace spindle::http::detail {

/// Appends pieces at `at`, which has room for all of them.
struct HeadWriter {
  char* at;

  void put(std::string_view piece) {
    copy_bytes(at, piece.data(), piece.size());
    at += piece.size();
  }
  /// "name: value\r\n".
  void field(std::string_view name, std::string_view value) {
    put(name);
    put(": ");
    put(value);
    put("\r\n");
  }
  /// A decimal number (at most 20 digits).
  void number(std::uint64_t n) { at = std::to_chars(at, at + 20, n).ptr; }
};

}  // namespace spindle::http::detail
