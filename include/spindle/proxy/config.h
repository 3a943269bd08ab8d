#pragma once
/// The spindle configuration: a YAML file (or the embedded default of the binary) turned into
/// a checked model. Every error, whatever the shape of the YAML, is a ConfigError naming the
/// file, the line and the key; nothing else escapes the loader.

#include <chrono>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "spindle/http/server.h"
#include "spindle/net/address.h"

namespace spindle::proxy {

/// A configuration error: "FILE:LINE: KEY: what is wrong".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where and how access log lines are written.
struct AccessLogConfig {
  /// Off entirely.
  bool enabled = true;
  /// A file path, or "-" for standard output.
  std::string path = "-";
  /// "combined" (Apache/nginx combined format) or "json" (one JSON object per line).
  std::string format = "combined";
};

/// One `servers` entry.
struct ServerConfig {
  /// Where to listen.
  Address listen = Address::loopback_v4(8080);
  /// Serve the built-in site: a welcome page at /, /plaintext and /json.
  bool default_site = true;
  /// Serve static files from this directory ("" for none).
  std::string root;
  /// Compress text responses (gzip/brotli) for clients that accept it.
  bool compression = true;
  /// Limits and timeouts.
  http::ServerOptions http;
  /// The access log.
  AccessLogConfig access_log;
};

/// The whole configuration.
struct Config {
  /// Worker threads; 0 means one per core.
  std::size_t threads = 0;
  /// The servers.
  std::vector<ServerConfig> servers;
};

/// Parses YAML `text` read from `file` (used in error messages; relative paths in it are
/// relative to the file's folder). Throws ConfigError for anything wrong, and only that.
Config parse_config(const std::string& text, const std::string& file);

/// Reads and parses `file`. Throws ConfigError (also when it cannot be read).
Config load_config(const std::string& file);

}  // namespace spindle::proxy
