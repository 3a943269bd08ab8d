#include "config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

namespace spindle::app {

const char* const kDefaultConfig = R"(# spindle's built-in configuration
threads: 0            # one worker per core
servers:
  - listen: 127.0.0.1:8080
    default_site: true
    access_log: {path: "-", format: combined}
)";

namespace {

// Reads one YAML mapping, checking every key is known and every value well-formed.
class Reader {
 public:
  Reader(std::string file, const YAML::Node& node, std::string path)
      : file_(std::move(file)), node_(node), path_(std::move(path)) {
    if (!node_.IsMap()) fail(node_, path_, "expected a mapping");
  }

  /// Throws for keys not in `known`.
  void only(std::initializer_list<const char*> known) const {
    std::set<std::string> allowed(known.begin(), known.end());
    for (const auto& entry : node_) {
      auto key = entry.first.as<std::string>();
      if (!allowed.count(key)) {
        fail(entry.first, path_.empty() ? key : path_ + "." + key,
             fmt::format("unknown key (expected one of: {})", fmt::join(known, ", ")));
      }
    }
  }

  YAML::Node get(const char* key) const { return node_[key]; }
  std::string key_path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  std::string string(const char* key, std::string fallback) const {
    auto n = get(key);
    if (!n) return fallback;
    if (!n.IsScalar()) fail(n, key_path(key), "expected a string");
    return n.as<std::string>();
  }

  bool boolean(const char* key, bool fallback) const {
    auto n = get(key);
    if (!n) return fallback;
    bool value;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, value)) {
      fail(n, key_path(key), "expected true or false");
    }
    return value;
  }

  std::uint64_t number(const char* key, std::uint64_t fallback, std::uint64_t max) const {
    auto n = get(key);
    if (!n) return fallback;
    std::string text = n.IsScalar() ? n.as<std::string>() : "";
    std::uint64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value > max) {
      fail(n, key_path(key), fmt::format("expected a whole number from 0 to {}", max));
    }
    return value;
  }

  // Sizes: a number of bytes, or with k/m/g (1024-based): "16k", "1m".
  std::uint64_t size(const char* key, std::uint64_t fallback) const {
    auto n = get(key);
    if (!n) return fallback;
    std::string text = n.IsScalar() ? n.as<std::string>() : "";
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
      fail(n, key_path(key), "expected a size such as 8192, 16k or 1m");
    }
    return value * scale;
  }

  // Durations: "250ms", "10s", "2m".
  std::chrono::milliseconds duration(const char* key, std::chrono::milliseconds fallback) const {
    auto n = get(key);
    if (!n) return fallback;
    std::string text = n.IsScalar() ? n.as<std::string>() : "";
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
    }
    std::uint64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (scale == 0 || text.empty() || ec != std::errc() || end != text.data() + text.size() ||
        value > 86'400'000 / scale) {
      fail(n, key_path(key), "expected a duration such as 500ms, 10s or 2m");
    }
    return std::chrono::milliseconds(value * scale);
  }

  [[noreturn]] void fail(const YAML::Node& at, const std::string& key,
                         const std::string& what) const {
    throw ConfigError(fmt::format("{}:{}: {}: {}", file_, at.Mark().line + 1, key, what));
  }

  /// A reader for the mapping under `key`.
  Reader nested(const char* key) const { return Reader(file_, get(key), key_path(key)); }

 private:
  std::string file_;
  YAML::Node node_;
  std::string path_;
};

void read_limits(const Reader& server, http::ServerOptions& http) {
  auto node = server.get("limits");
  if (!node) return;
  Reader r = server.nested("limits");
  r.only({"max_request_line", "max_header_size", "max_headers", "max_body",
          "max_requests_per_connection"});
  http.parser.max_request_line = r.size("max_request_line", http.parser.max_request_line);
  http.parser.max_head = r.size("max_header_size", http.parser.max_head);
  http.parser.max_headers = r.number("max_headers", http.parser.max_headers, 10'000);
  http.max_body = r.size("max_body", http.max_body);
  http.max_requests_per_connection =
      r.number("max_requests_per_connection", http.max_requests_per_connection, 1'000'000'000);
  http.max_connections_per_worker =
      r.number("max_connections_per_worker", http.max_connections_per_worker, 1'000'000);
  if (http.parser.max_request_line > http.parser.max_head) {
    r.fail(node, r.key_path("max_request_line"), "must not exceed max_header_size");
  }
}

void read_timeouts(const Reader& server, http::ServerOptions& http) {
  auto node = server.get("timeouts");
  if (!node) return;
  Reader r = server.nested("timeouts");
  r.only({"header", "body", "keepalive", "write", "handshake"});
  http.header_timeout = r.duration("header", http.header_timeout);
  http.body_timeout = r.duration("body", http.body_timeout);
  http.keepalive_timeout = r.duration("keepalive", http.keepalive_timeout);
  http.write_timeout = r.duration("write", http.write_timeout);
  http.handshake_timeout = r.duration("handshake", http.handshake_timeout);
}

void read_access_log(const Reader& server, AccessLogConfig& log) {
  auto node = server.get("access_log");
  if (!node) return;
  if (node.IsScalar()) {
    bool on;
    if (YAML::convert<bool>::decode(node, on) && !on) {
      log.enabled = false;
      return;
    }
    server.fail(node, server.key_path("access_log"), "expected off, or a mapping with path/format");
  }
  Reader r = server.nested("access_log");
  r.only({"path", "format"});
  log.path = r.string("path", log.path);
  log.format = r.string("format", log.format);
  if (log.format != "combined" && log.format != "json") {
    r.fail(r.get("format"), r.key_path("format"), "expected combined or json");
  }
}

// A path from the configuration: relative ones are relative to the file's directory.
std::string config_path(const std::string& file, const std::string& path) {
  if (path.empty() || path.front() == '/') return path;
  auto slash = file.rfind('/');
  return slash == std::string::npos ? path : file.substr(0, slash + 1) + path;
}

// One certificate: cert and key files, and optional SNI names.
TlsCertificate read_certificate(const Reader& r, const std::string& file, const YAML::Node& at,
                                bool allow_sni) {
  if (allow_sni) {
    r.only({"cert", "key", "names", "sni"});
  } else {
    r.only({"cert", "key", "names"});
  }
  TlsCertificate cert;
  cert.cert_file = config_path(file, r.string("cert", ""));
  cert.key_file = config_path(file, r.string("key", ""));
  if (cert.cert_file.empty()) r.fail(at, r.key_path("cert"), "required (a PEM certificate chain)");
  if (cert.key_file.empty()) r.fail(at, r.key_path("key"), "required (a PEM private key)");
  if (auto names = r.get("names")) {
    if (!names.IsSequence()) r.fail(names, r.key_path("names"), "expected a list of host names");
    for (const auto& n : names) cert.names.push_back(n.as<std::string>());
  }
  return cert;
}

// tls: {cert, key, names, sni: [{cert, key, names}, ...]}: the TLS context, loaded now so that
// check-config finds unreadable or mismatched files too.
void read_tls(const Reader& server, const std::string& file, http::ServerOptions& http) {
  auto node = server.get("tls");
  if (!node) return;
  Reader r = server.nested("tls");
  TlsServerOptions options;
  if (http.http2) options.alpn = {"h2", "http/1.1"};
  if (http.http2_only) options.alpn = {"h2"};
  options.certificates.push_back(read_certificate(r, file, node, true));
  if (auto sni = r.get("sni")) {
    if (!sni.IsSequence()) r.fail(sni, r.key_path("sni"), "expected a list of {cert, key, names}");
    for (std::size_t i = 0; i < sni.size(); ++i) {
      Reader entry(file, sni[i], fmt::format("{}[{}]", r.key_path("sni"), i));
      options.certificates.push_back(read_certificate(entry, file, sni[i], false));
    }
  }
  auto context = TlsServerContext::create(std::move(options));
  if (!context) r.fail(node, server.key_path("tls"), context.error());
  http.tls = std::move(*context);
}

}  // namespace

Config parse_config(const std::string& text, const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}:{}: invalid YAML: {}", file, e.mark.line + 1, e.msg));
  }
  Reader top(file, root, "");
  top.only({"threads", "servers"});
  Config config;
  config.threads = top.number("threads", 0, 1024);
  auto servers = root["servers"];
  if (!servers || !servers.IsSequence() || servers.size() == 0) {
    top.fail(servers ? servers : root, "servers", "expected a list with at least one server");
  }
  for (std::size_t i = 0; i < servers.size(); ++i) {
    Reader r(file, servers[i], fmt::format("servers[{}]", i));
    r.only({"listen", "default_site", "root", "server_name", "compression", "limits", "timeouts",
            "access_log", "tls", "http2"});
    ServerConfig server;
    std::string listen = r.string("listen", "");
    auto address = Address::parse(listen);
    if (!address) {
      r.fail(r.get("listen") ? r.get("listen") : servers[i], r.key_path("listen"),
             fmt::format("bad address '{}': expected IPv4:PORT, [IPv6]:PORT or unix:PATH", listen));
    }
    server.listen = *address;
    server.root = r.string("root", "");
    server.default_site = r.boolean("default_site", server.root.empty());
    server.compression = r.boolean("compression", server.compression);
    server.http.server_name = r.string("server_name", server.http.server_name);
    read_limits(r, server.http);
    read_timeouts(r, server.http);
    read_access_log(r, server.access_log);
    if (auto h2 = r.get("http2")) {
      bool on = false;
      if (h2.IsScalar() && h2.as<std::string>() == "only") {
        server.http.http2 = server.http.http2_only = true;
      } else if (h2.IsScalar() && YAML::convert<bool>::decode(h2, on)) {
        server.http.http2 = on;
      } else {
        r.fail(h2, r.key_path("http2"), "expected true, false or only");
      }
    }
    read_tls(r, file, server.http);
    config.servers.push_back(std::move(server));
  }
  return config;
}

Config load_config(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError(fmt::format("{}: cannot read the file", file));
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), file);
}

}  // namespace spindle::app
