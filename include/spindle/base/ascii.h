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

}  // namespace spindle
