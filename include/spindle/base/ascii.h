#pragma once
/// ASCII case folding for protocol names (host names, header field names): locale-free.

#include <string>
#include <string_view>

namespace spindle {

/// `text` with A-Z turned into a-z; every other byte as it is.
inline std::string ascii_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

/// Appends `text` lower-cased to `out`; the view of what was appended (it stays valid while
/// `out` does not grow past its capacity).
inline std::string_view append_ascii_lower(std::string& out, std::string_view text) {
  const std::size_t at = out.size();
  out.resize(at + text.size());
  char* p = out.data() + at;
  for (char c : text) *p++ = c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  return {out.data() + at, text.size()};
}

}  // namespace spindle
