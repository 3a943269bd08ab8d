// libFuzzer driver for the configuration loader. Checks, beyond "no crash, no sanitizer
// report": nothing but a ConfigError comes out of it, whatever the YAML (an uncaught exception
// aborts), and every error reads "FILE:LINE: KEY: WHY" (or "FILE: WHY" for the file itself).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_checks.h"
#include "spindle/proxy/config.h"

namespace {

// "fuzz.yaml:<digits>: <something>: <something>"
bool well_formed(std::string_view message) {
  constexpr std::string_view kFile = "fuzz.yaml:";
  if (!message.starts_with(kFile)) return false;
  message.remove_prefix(kFile.size());
  std::size_t digits = 0;
  while (digits < message.size() && message[digits] >= '0' && message[digits] <= '9') ++digits;
  if (digits == 0 || message.substr(digits, 2) != ": ") return false;
  message.remove_prefix(digits + 2);
  std::size_t colon = message.find(": ");
  return colon != std::string_view::npos && colon > 0 && colon + 2 < message.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto config = spindle::proxy::parse_config(text, "fuzz.yaml");
    check(!config.servers.empty());
  } catch (const spindle::proxy::ConfigError& e) {
    check(well_formed(e.what()));
  }
  return 0;
}
