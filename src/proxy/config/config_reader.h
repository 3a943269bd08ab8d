#pragma once
// ConfigReader: reads one YAML mapping of the configuration, checking every key and value, and
// turning every problem — whatever the shape of the YAML — into a ConfigError that names the
// file, the line and the key (private to src/proxy).

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/proxy/config.h"

namespace spindle::proxy::detail {

/// One mapping of the configuration file, at `path` ("servers[0].limits").
class ConfigReader {
 public:
  /// Fails unless `node` is a mapping.
  ConfigReader(const std::string& file, const YAML::Node& node, std::string path);

  /// Fails for a key not in `known`, a key that is not a plain string, or a key given twice.
  void only(std::initializer_list<std::string_view> known) const;

  /// The value of `key` (an undefined node if absent).
  YAML::Node get(std::string_view key) const;
  /// True if `key` is present.
  bool has(std::string_view key) const { return static_cast<bool>(get(key)); }
  /// "path.key".
  std::string key_path(std::string_view key) const;
  /// The file.
  const std::string& file() const { return file_; }
  /// The mapping.
  const YAML::Node& node() const { return node_; }

  /// A string value (a scalar), or `fallback` if absent.
  std::string string(std::string_view key, std::string fallback) const;
  /// A list of strings (a single string counts as a list of one); empty if absent.
  std::vector<std::string> strings(std::string_view key) const;
  /// true / false.
  bool boolean(std::string_view key, bool fallback) const;
  /// A whole number from 0 to `max`.
  std::uint64_t number(std::string_view key, std::uint64_t fallback, std::uint64_t max) const;
  /// A size: bytes, or with k/m/g (1024-based): "16k", "1m".
  std::uint64_t size(std::string_view key, std::uint64_t fallback) const;
  /// A duration: "250ms", "10s", "2m", "1h".
  std::chrono::milliseconds duration(std::string_view key,
                                     std::chrono::milliseconds fallback) const;

  /// The mapping under `key`.
  ConfigReader nested(std::string_view key) const;
  /// The sequence under `key` (empty if absent); fails if it is something else.
  YAML::Node sequence(std::string_view key, std::string_view what) const;

  /// Throws "FILE:LINE: KEY: WHAT", LINE being `at`'s (or the mapping's if `at` has none).
  [[noreturn]] void fail(const YAML::Node& at, const std::string& key,
                         const std::string& what) const;
  /// Throws for `key` of this mapping, at its value's line (or the mapping's).
  [[noreturn]] void fail_key(std::string_view key, const std::string& what) const;

 private:
  /// The file name, for messages.
  std::string file_;
  /// The mapping.
  YAML::Node node_;
  /// Where it is ("" at the top).
  std::string path_;
};

/// The text of scalar `node`; fails as `reader.fail` for a sequence or a mapping.
std::string scalar_text(const ConfigReader& reader, const YAML::Node& node, const std::string& key);

/// The line (1-based) of `node`, or of `fallback` if `node` has none.
int line_of(const YAML::Node& node, const YAML::Node& fallback);

/// A path from the configuration: relative ones are relative to `file`'s directory.
std::string config_path(const std::string& file, const std::string& path);

/// The PEM file named by `key` (required; `what` says what it holds): a regular file, its path
/// relative to the configuration file's directory.
std::string pem_file(const ConfigReader& r, std::string_view key, const std::string& what);

}  // namespace spindle::proxy::detail
