#pragma once
// The `serve` and `check-config` commands of the spindle binary.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "spindle/net/address.h"

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
  /// --handover PATH: the Unix socket where a running spindle hands its listening sockets
  /// to the one replacing it ("" for none).
  std::string handover;
  /// The whole command line (an upgrade starts the binary again with it).
  std::vector<std::string> argv;
  /// Where the listening sockets passed to the process listen (systemd's socket activation, or
  /// the spindle this one replaces): filled in by serve(), not by a flag. Without --config and
  /// --listen, the built-in configuration serves there (a server on each), not on
  /// 127.0.0.1:8080.
  std::vector<Address> passed;
};

/// Runs the server until SIGTERM/SIGINT; returns the process exit code.
int serve(const ServeFlags& flags);

/// Asks the spindle serving with --handover `handover` to start its replacement; returns the
/// exit code.
int upgrade(const std::string& handover);

/// Validates a configuration file, printing the first error; returns the exit code.
int check_config(const std::string& file);

}  // namespace spindle::app
