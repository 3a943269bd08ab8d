#pragma once
// The `serve` and `check-config` commands of the spindle binary.

#include <cstddef>
#include <optional>
#include <string>

namespace spindle::app {

/// The version printed by --version.
inline constexpr const char* kVersion = "0.1.0";

/// Command-line flags of `spindle serve`; each overrides the configuration.
struct ServeFlags {
  /// --config FILE ("" for the embedded default).
  std::string config;
  /// --listen ADDRESS.
  std::optional<std::string> listen;
  /// --threads N.
  std::optional<std::size_t> threads;
  /// --root DIR.
  std::optional<std::string> root;
};

/// Runs the server until SIGTERM/SIGINT; returns the process exit code.
int serve(const ServeFlags& flags);

/// Validates a configuration file, printing the first error; returns the exit code.
int check_config(const std::string& file);

}  // namespace spindle::app
