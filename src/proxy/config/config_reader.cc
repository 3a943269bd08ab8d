#include "config_reader.h"

#include <fmt/format.h>

#include <charconv>
#include <set>

namespace spindle::proxy::detail {
namespace {

// A message as it is shown: control characters (a NUL would end it early, a newline would
// forge another line) as \xNN; the rest, UTF-8 included, as it is.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

int line_of(const YAML::Node& node, const YAML::Node& fallback) {
  // An absent node has no position (Mark() throws for an invalid one); use its mapping's.
  for (const YAML::Node* n : {&node, &fallback}) {
    try {
      int line = n->Mark().line;
      if (line >= 0) return line + 1;
    } catch (const YAML::Exception&) {
    }
  }
  return 1;
}

std::string scalar_text(const ConfigReader& reader, const YAML::Node& node,
                        const std::string& key) {
  if (!node.IsScalar()) {
    reader.fail(node, key,
                node.IsSequence() ? "expected a single value, not a list"
                                  : "expected a single value, not a mapping");
  }
  return node.Scalar();
}

ConfigReader::ConfigReader(const std::string& file, const YAML::Node& node, std::string path)
    : file_(file), node_(node), path_(std::move(path)) {
  if (!node_.IsMap()) fail(node_, path_.empty() ? "(top level)" : path_, "expected a mapping");
}

void ConfigReader::only(std::initializer_list<std::string_view> known) const {
  std::set<std::string> seen;
  for (const auto& entry : node_) {
    if (!entry.first.IsScalar()) {
      fail(entry.first, path_.empty() ? "(top level)" : path_, "a key must be a plain name");
    }
    const std::string& key = entry.first.Scalar();
    if (key.empty()) fail(entry.first, key_path("\"\""), "a key must be a plain name");
    bool allowed = false;
    for (std::string_view k : known) allowed = allowed || k == key;
    if (!allowed) {
      fail(entry.first, key_path(key),
           fmt::format("unknown key (expected one of: {})", fmt::join(known, ", ")));
    }
    if (!seen.insert(key).second) fail(entry.first, key_path(key), "given twice");
  }
}

YAML::Node ConfigReader::get(std::string_view key) const {
  // Looked up by hand: operator[] would compare keys by converting them, which throws for
  // keys that are not scalars.
  for (const auto& entry : node_) {
    if (entry.first.IsScalar() && entry.first.Scalar() == key) return entry.second;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

std::string ConfigReader::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

std::string ConfigReader::string(std::string_view key, std::string fallback) const {
  YAML::Node n = get(key);
  if (!n) return fallback;
  if (n.IsNull()) fail_key(key, "expected a value");
  return scalar_text(*this, n, key_path(key));
}

std::vector<std::string> ConfigReader::strings(std::string_view key) const {
  YAML::Node n = get(key);
  std::vector<std::string> out;
  if (!n) return out;
  if (n.IsScalar()) {
    out.push_back(n.Scalar());
    return out;
  }
  if (!n.IsSequence()) fail_key(key, "expected a list of values");
  for (std::size_t i = 0; i < n.size(); ++i) {
    out.push_back(scalar_text(*this, n[i], fmt::format("{}[{}]", key_path(key), i)));
  }
  return out;
}

bool ConfigReader::boolean(std::string_view key, bool fallback) const {
  YAML::Node n = get(key);
  if (!n) return fallback;
  bool value = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, value)) {
    fail_key(key, "expected true or false");
  }
  return value;
}

std::uint64_t ConfigReader::number(std::string_view key, std::uint64_t fallback,
                                   std::uint64_t max) const {
  YAML::Node n = get(key);
  if (!n) return fallback;
  std::string text = n.IsScalar() ? n.Scalar() : "";
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value > max) {
    fail_key(key, fmt::format("expected a whole number from 0 to {}", max));
  }
  return value;
}

std::uint64_t ConfigReader::size(std::string_view key, std::uint64_t fallback) const {
  YAML::Node n = get(key);
  if (!n) return fallback;
  std::string text = n.IsScalar() ? n.Scalar() : "";
  std::uint64_t scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'k':
      case 'K':
        scale = 1024;
        break;
      case 'm':
      case 'M':
        scale = 1024 * 1024;
        break;
      case 'g':
      case 'G':
        scale = 1024 * 1024 * 1024;
        break;
      default:
        break;
    }
    if (scale != 1) text.pop_back();
  }
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
      value > (std::uint64_t{1} << 40) / scale) {
    fail_key(key, "expected a size such as 8192, 16k or 1m");
  }
  return value * scale;
}

std::chrono::milliseconds ConfigReader::duration(std::string_view key,
                                                 std::chrono::milliseconds fallback) const {
  YAML::Node n = get(key);
  if (!n) return fallback;
  std::string text = n.IsScalar() ? n.Scalar() : "";
  std::uint64_t scale = 0;
  if (text.ends_with("ms")) {
    scale = 1;
    text.resize(text.size() - 2);
  } else if (text.ends_with('s')) {
    scale = 1000;
    text.pop_back();
  } else if (text.ends_with('m')) {
    scale = 60'000;
    text.pop_back();
  } else if (text.ends_with('h')) {
    scale = 3'600'000;
    text.pop_back();
  }
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (scale == 0 || text.empty() || ec != std::errc() || end != text.data() + text.size() ||
      value > 86'400'000 / scale) {
    fail_key(key, "expected a duration such as 500ms, 10s, 2m or 1h (at most a day)");
  }
  return std::chrono::milliseconds(value * scale);
}

ConfigReader ConfigReader::nested(std::string_view key) const {
  return ConfigReader(file_, get(key), key_path(key));
}

YAML::Node ConfigReader::sequence(std::string_view key, std::string_view what) const {
  YAML::Node n = get(key);
  if (!n) return YAML::Node(YAML::NodeType::Sequence);
  if (!n.IsSequence()) fail_key(key, fmt::format("expected a list of {}", what));
  return n;
}

void ConfigReader::fail(const YAML::Node& at, const std::string& key,
                        const std::string& what) const {
  throw ConfigError(printable(fmt::format("{}:{}: {}: {}", file_, line_of(at, node_), key, what)));
}

void ConfigReader::fail_key(std::string_view key, const std::string& what) const {
  fail(get(key), key_path(key), what);
}

}  // namespace spindle::proxy::detail
