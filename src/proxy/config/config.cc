#include "spindle/proxy/config.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "config_reader.h"
#include "gateway_config.h"
#include "spindle/base/ascii.h"
#include "spindle/io/unique_fd.h"

namespace spindle::proxy {
namespace {

using detail::ConfigReader;

void read_limits(const ConfigReader& server, http::ServerOptions& http) {
  if (!server.has("limits")) return;
  ConfigReader r = server.nested("limits");
  r.only({"max_request_line", "max_header_size", "max_headers", "max_body",
          "max_requests_per_connection", "max_connections_per_worker"});
  http.parser.max_request_line = r.size("max_request_line", http.parser.max_request_line);
  http.parser.max_head = r.size("max_header_size", http.parser.max_head);
  http.parser.max_headers = r.number("max_headers", http.parser.max_headers, 10'000);
  http.max_body = r.size("max_body", http.max_body);
  http.max_requests_per_connection =
      r.number("max_requests_per_connection", http.max_requests_per_connection, 1'000'000'000);
  http.max_connections_per_worker =
      r.number("max_connections_per_worker", http.max_connections_per_worker, 1'000'000);
  if (http.parser.max_request_line > http.parser.max_head) {
    r.fail_key("max_request_line", "must not exceed max_header_size");
  }
  if (http.max_connections_per_worker == 0) {
    r.fail_key("max_connections_per_worker", "must be at least 1");
  }
}

void read_timeouts(const ConfigReader& server, http::ServerOptions& http) {
  if (!server.has("timeouts")) return;
  ConfigReader r = server.nested("timeouts");
  r.only({"header", "body", "keepalive", "write", "handshake"});
  http.header_timeout = r.duration("header", http.header_timeout);
  http.body_timeout = r.duration("body", http.body_timeout);
  http.keepalive_timeout = r.duration("keepalive", http.keepalive_timeout);
  http.write_timeout = r.duration("write", http.write_timeout);
  http.handshake_timeout = r.duration("handshake", http.handshake_timeout);
}

void read_access_log(const ConfigReader& server, AccessLogConfig& log) {
  YAML::Node node = server.get("access_log");
  if (!node) return;
  if (node.IsScalar()) {
    bool on = true;
    if (YAML::convert<bool>::decode(node, on) && !on) {
      log.enabled = false;
      return;
    }
    server.fail_key("access_log", "expected off, or a mapping with path/format");
  }
  ConfigReader r = server.nested("access_log");
  r.only({"path", "format", "buffer"});
  log.path = r.string("path", log.path);
  log.format = r.string("format", log.format);
  log.buffer = r.size("buffer", log.buffer);
  if (log.buffer < 64 * 1024) r.fail_key("buffer", "at least 64k (a few batches of lines)");
  if (log.path.empty()) r.fail_key("path", "expected a file, or - for standard output");
  if (log.format != "combined" && log.format != "json") {
    r.fail_key("format", "expected combined or json");
  }
}

// A hash of a file's contents (0 if it cannot be read: loading it fails later, and says why).
std::size_t file_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return std::hash<std::string>{}(text.str());
}

// One certificate: cert and key files, and optional SNI names.
TlsCertificate read_certificate(const ConfigReader& r, bool allow_sni) {
  if (allow_sni) {
    r.only({"cert", "key", "names", "sni"});
  } else {
    r.only({"cert", "key", "names"});
  }
  TlsCertificate cert;
  cert.cert_file = pem_file(r, "cert", "a PEM certificate chain");
  cert.key_file = pem_file(r, "key", "a PEM private key");
  cert.names = r.strings("names");
  return cert;
}

// tls: {cert, key, names, sni: [{cert, key, names}, ...]}: the TLS context, loaded now so that
// check-config finds unreadable or mismatched files too.
void read_tls(const ConfigReader& server, http::ServerOptions& http, std::string& fingerprint) {
  if (!server.has("tls")) return;
  ConfigReader r = server.nested("tls");
  TlsServerOptions options;
  if (http.http2) options.alpn = {"h2", "http/1.1"};
  if (http.http2_only) options.alpn = {"h2"};
  options.certificates.push_back(read_certificate(r, true));
  YAML::Node sni = r.sequence("sni", "{cert, key, names}");
  for (std::size_t i = 0; i < sni.size(); ++i) {
    ConfigReader entry(r.file(), sni[i], fmt::format("{}[{}]", r.key_path("sni"), i));
    options.certificates.push_back(read_certificate(entry, false));
  }
  // A reload reloads the certificates when their files changed, even under the same names.
  for (const TlsCertificate& cert : options.certificates) {
    fingerprint +=
        fmt::format("\ncert {:x} key {:x}", file_hash(cert.cert_file), file_hash(cert.key_file));
  }
  auto context = TlsServerContext::create(std::move(options));
  if (!context) server.fail_key("tls", context.error());
  http.tls = std::move(*context);
}

void read_http2(const ConfigReader& r, http::ServerOptions& http) {
  YAML::Node h2 = r.get("http2");
  if (!h2) return;
  bool on = false;
  if (h2.IsScalar() && h2.Scalar() == "only") {
    http.http2 = http.http2_only = true;
  } else if (h2.IsScalar() && YAML::convert<bool>::decode(h2, on)) {
    http.http2 = on;
  } else {
    r.fail_key("http2", "expected true, false or only");
  }
}

// http2_limits: an HTTP/2 connection's limits (ServerOptions::Http2Limits).
void read_http2_limits(const ConfigReader& server, http::ServerOptions& http) {
  if (!server.has("http2_limits")) return;
  ConfigReader r = server.nested("http2_limits");
  r.only({"max_concurrent_streams", "stream_window", "connection_window", "max_header_frames",
          "reset_budget", "running_reset_burst", "running_resets_per_second", "empty_frame_budget",
          "settings_budget", "max_unread_output"});
  auto& h = http.http2_limits;
  constexpr std::uint64_t kMaxWindow = 0x7fffffff;  // RFC 9113 §6.9.1
  h.max_concurrent_streams = static_cast<std::uint32_t>(
      r.number("max_concurrent_streams", h.max_concurrent_streams, 1'000'000));
  h.stream_window = static_cast<std::uint32_t>(r.size("stream_window", h.stream_window));
  h.connection_window =
      static_cast<std::uint32_t>(r.size("connection_window", h.connection_window));
  h.max_header_frames = r.number("max_header_frames", h.max_header_frames, 10'000);
  h.reset_budget = r.number("reset_budget", h.reset_budget, 1'000'000'000);
  h.running_reset_burst = r.number("running_reset_burst", h.running_reset_burst, 1'000'000'000);
  h.running_resets_per_second =
      r.number("running_resets_per_second", h.running_resets_per_second, 1'000'000'000);
  h.empty_frame_budget = r.number("empty_frame_budget", h.empty_frame_budget, 1'000'000'000);
  h.settings_budget = r.number("settings_budget", h.settings_budget, 1'000'000'000);
  h.max_unread_output = r.size("max_unread_output", h.max_unread_output);
  if (h.max_concurrent_streams == 0) r.fail_key("max_concurrent_streams", "must be at least 1");
  if (r.size("stream_window", 65535) > kMaxWindow || h.stream_window == 0) {
    r.fail_key("stream_window", "must be from 1 to 2^31-1 bytes");
  }
  if (r.size("connection_window", 65535) > kMaxWindow || h.connection_window < 65535) {
    r.fail_key("connection_window", "must be from 64k-1 (65535) to 2^31-1 bytes");
  }
  if (h.max_unread_output < 65536) r.fail_key("max_unread_output", "must be at least 64k");
}

// paths: {escaped_slashes, merge_slashes}: how request paths are normalised (http/target.h).
void read_paths(const ConfigReader& server, http::PathRules& paths) {
  if (!server.has("paths")) return;
  ConfigReader r = server.nested("paths");
  r.only({"escaped_slashes", "merge_slashes"});
  std::string slashes = r.string("escaped_slashes", "reject");
  if (slashes == "reject") {
    paths.escaped_slashes = http::PathRules::EscapedSlashes::kReject;
  } else if (slashes == "keep") {
    paths.escaped_slashes = http::PathRules::EscapedSlashes::kKeep;
  } else {
    r.fail_key("escaped_slashes", "expected reject or keep");
  }
  paths.merge_slashes = r.boolean("merge_slashes", paths.merge_slashes);
}

// root: a directory serve can read (the same check serve makes, so check-config finds it).
std::string read_root(const ConfigReader& r) {
  std::string root = r.string("root", "");
  if (root.empty()) return root;
  std::string path = detail::config_path(r.file(), root);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    r.fail_key("root", fmt::format("'{}': {}", path, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) r.fail_key("root", fmt::format("'{}' is not a directory", path));
  if (::access(path.c_str(), R_OK | X_OK) != 0) {
    r.fail_key("root", fmt::format("'{}': {}", path, std::strerror(errno)));
  }
  return path;
}

// listen: an address (required).
Address read_listen(const ConfigReader& r) {
  std::string listen = r.string("listen", "");
  auto address = Address::parse(listen);
  if (!address) {
    r.fail(r.has("listen") ? r.get("listen") : r.node(), r.key_path("listen"),
           listen.empty() ? "required (IPv4:PORT, [IPv6]:PORT or unix:PATH)"
                          : fmt::format("bad address '{}': expected IPv4:PORT, [IPv6]:PORT or "
                                        "unix:PATH",
                                        listen));
  }
  return *address;
}

ServerConfig read_server(const ConfigReader& r) {
  r.only({"name", "listen", "default_site", "root", "server_name", "compression", "limits",
          "timeouts", "access_log", "tls", "http2", "http2_limits", "trusted_proxies", "paths"});
  ServerConfig server;
  server.name = r.string("name", "");
  for (const std::string& text : r.strings("trusted_proxies")) {
    auto cidr = Cidr::parse(text);
    if (!cidr) {
      r.fail_key("trusted_proxies",
                 fmt::format("'{}' is not an address or network (10.0.0.0/8, fd00::/8)", text));
    }
    server.trusted_proxies.push_back(*cidr);
  }
  server.listen = read_listen(r);
  server.root = read_root(r);
  server.default_site = r.boolean("default_site", server.root.empty());
  server.compression = r.boolean("compression", server.compression);
  server.http.server_name = r.string("server_name", server.http.server_name);
  if (!http::is_field_value(server.http.server_name)) {
    r.fail_key("server_name", "must not hold control characters");
  }
  read_limits(r, server.http);
  read_paths(r, server.http.paths);
  read_timeouts(r, server.http);
  read_access_log(r, server.access_log);
  read_http2(r, server.http);
  read_http2_limits(r, server.http);
  server.fingerprint = YAML::Dump(r.node());
  read_tls(r, server.http, server.fingerprint);
  return server;
}

// True if two listeners would take the same address (an ephemeral port never clashes).
bool same_listener(const Address& a, const Address& b) {
  if (a.unix_path().empty() && a.port() == 0) return false;
  return a.to_string() == b.to_string();
}

// admin: {listen}: the admin listener (off unless given).
void read_admin(const ConfigReader& top, Config& config) {
  if (!top.has("admin")) return;
  ConfigReader r = top.nested("admin");
  r.only({"listen"});
  config.admin_listen = read_listen(r);
}

Config read_config(const YAML::Node& root, const std::string& file) {
  if (!root || root.IsNull()) {
    throw ConfigError(
        fmt::format("{}:1: servers: the file is empty (expected a list of servers)", file));
  }
  ConfigReader top(file, root, "");
  top.only({"threads", "huge_page_stacks", "drain_timeout", "admin", "redis", "dns", "servers",
            "routes", "services", "upstreams"});
  Config config;
  config.threads = top.number("threads", 0, 1024);
  config.huge_page_stacks = top.boolean("huge_page_stacks", config.huge_page_stacks);
  config.drain_timeout = top.duration("drain_timeout", config.drain_timeout);
  read_admin(top, config);
  YAML::Node servers = top.get("servers");
  if (!servers || !servers.IsSequence() || servers.size() == 0) {
    top.fail(servers ? servers : root, "servers", "expected a list with at least one server");
  }
  for (std::size_t i = 0; i < servers.size(); ++i) {
    ConfigReader r(file, servers[i], fmt::format("servers[{}]", i));
    config.servers.push_back(read_server(r));
    const ServerConfig& server = config.servers.back();
    for (std::size_t j = 0; j + 1 < config.servers.size(); ++j) {
      if (!server.name.empty() && config.servers[j].name == server.name) {
        r.fail_key("name", fmt::format("servers[{}] has that name already", j));
      }
      if (same_listener(config.servers[j].listen, server.listen)) {
        r.fail_key("listen", fmt::format("servers[{}] listens there already", j));
      }
    }
    if (config.admin_listen && same_listener(*config.admin_listen, server.listen)) {
      r.fail_key("listen", "the admin listener is there already");
    }
  }
  read_gateway(top, config);
  return config;
}

}  // namespace

std::string RedisConfig::address() const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

std::string ServerConfig::key() const { return name.empty() ? listen.to_string() : name; }

const ServiceConfig* Config::service(std::string_view name) const {
  for (const auto& s : services) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const UpstreamConfig* Config::upstream(std::string_view name) const {
  for (const auto& u : upstreams) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

Config parse_config(const std::string& text, const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}:{}: invalid YAML: {}", file, e.mark.line + 1, e.msg));
  }
  try {
    Config config = read_config(root, file);
    config.source = text;
    return config;
  } catch (const ConfigError&) {
    throw;
  } catch (const YAML::Exception& e) {
    // Every read goes through ConfigReader, which should leave yaml-cpp nothing to throw; if
    // it still does, the message keeps the promised form.
    throw ConfigError(fmt::format("{}:{}: invalid value: {}", file, e.mark.line + 1, e.msg));
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("{}:1: cannot be loaded: {}", file, e.what()));
  }
}

namespace {

// Keys whose values are secrets: shown as "<redacted>" by redacted_source(). Configuration
// keys and field names alike ("password", "api_key", "Authorization", "X-Auth-Token",
// "X-Api-Key"): compared without regard to case, '-' taken as '_', the word alone or after a
// '_'.
bool secret_key(std::string_view key) {
  static constexpr std::string_view kSecrets[] = {
      "password",      "passwd",      "secret", "token",   "api_key",    "apikey",
      "authorization", "credentials", "cookie", "session", "private_key"};
  std::string name = ascii_lower(key);
  std::ranges::replace(name, '-', '_');
  for (std::string_view s : kSecrets) {
    std::string_view n = name;
    if (n == s || (n.size() > s.size() && n.ends_with(s) && n[n.size() - s.size() - 1] == '_')) {
      return true;
    }
  }
  return false;
}

// Keys whose value is a map of field names to field values: a route's `match.headers` (a
// value a client must send: often a shared secret) and the `set` and `add` edits of the
// `headers` middleware (a value sent upstream: often a credential). Every value there is
// hidden, whatever the field's name.
bool fields_map_key(std::string_view key) {
  return key == "headers" || key == "set" || key == "add";
}

// A URL's credentials (scheme://user:password@host): hidden, the rest kept.
void redact_userinfo(YAML::Node node) {
  const std::string& text = node.Scalar();
  std::size_t scheme = text.find("://");
  if (scheme == std::string::npos) return;
  std::size_t authority = scheme + 3;
  std::size_t end = text.find_first_of("/?#", authority);
  std::size_t at = text.rfind('@', end == std::string::npos ? text.size() : end);
  if (at == std::string::npos || at < authority) return;
  node = text.substr(0, authority) + "<redacted>" + text.substr(at);
}

void redact(YAML::Node node) {
  if (node.IsMap()) {
    for (auto entry : node) {
      std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "";
      bool secret = secret_key(key) ||
                    (fields_map_key(key) && !entry.second.IsMap() && !entry.second.IsSequence());
      if (secret && !entry.second.IsNull()) {
        entry.second = "<redacted>";
      } else if (fields_map_key(key) && entry.second.IsMap()) {
        for (auto field : entry.second) {
          if (field.second.IsMap()) {
            redact(field.second);  // headers: {request: {set: ...}}
          } else if (!field.second.IsNull()) {
            field.second = "<redacted>";
          }
        }
      } else {
        redact(entry.second);
      }
    }
  } else if (node.IsSequence()) {
    for (auto item : node) redact(item);
  } else if (node.IsScalar()) {
    redact_userinfo(node);
  }
}

}  // namespace

std::string redacted_source(const Config& config) {
  try {
    YAML::Node root = YAML::Load(config.source);
    redact(root);
    YAML::Emitter out;
    out << root;
    return std::string(out.c_str()) + "\n";
  } catch (const YAML::Exception&) {
    return "";  // cannot happen: the text was loaded once already
  }
}

std::string read_config_file(const std::string& file) {
  constexpr off_t kLargest = off_t{64} << 20;
  struct stat path {};
  if (::stat(file.c_str(), &path) != 0) {
    throw ConfigError(fmt::format("{}: cannot read the file: {}", file, std::strerror(errno)));
  }
  if (!S_ISREG(path.st_mode)) throw ConfigError(fmt::format("{}: not a regular file", file));
  // Non-blocking: if a FIFO took the file's place since the stat, the open does not wait.
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  struct stat before {};
  if (!fd || ::fstat(fd.get(), &before) != 0) {
    throw ConfigError(fmt::format("{}: cannot read the file: {}", file, std::strerror(errno)));
  }
  if (!S_ISREG(before.st_mode)) throw ConfigError(fmt::format("{}: not a regular file", file));
  if (before.st_size > kLargest) {
    throw ConfigError(fmt::format("{}: larger than 64 MiB: not a configuration", file));
  }
  std::string text;
  char buffer[65536];
  ssize_t n;
  while ((n = ::read(fd.get(), buffer, sizeof buffer)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError(fmt::format("{}: {}", file, std::strerror(errno)));
    text.append(buffer, static_cast<std::size_t>(n));
    if (static_cast<off_t>(text.size()) > kLargest) {
      throw ConfigError(fmt::format("{}: larger than 64 MiB: not a configuration", file));
    }
  }
  struct stat after {};
  bool same = ::fstat(fd.get(), &after) == 0 && ::stat(file.c_str(), &path) == 0 &&
              after.st_size == before.st_size && static_cast<off_t>(text.size()) == after.st_size &&
              after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
              after.st_mtim.tv_nsec == before.st_mtim.tv_nsec && path.st_ino == after.st_ino &&
              path.st_dev == after.st_dev;
  if (!same) throw ConfigError(fmt::format("{}: changed while it was read", file));
  return text;
}

Config load_config(const std::string& file) { return parse_config(read_config_file(file), file); }

// A path from the configuration: relative ones are relative to the file's directory.
std::string detail::config_path(const std::string& file, const std::string& path) {
  if (path.empty() || path.front() == '/') return path;
  auto slash = file.rfind('/');
  return slash == std::string::npos ? path : file.substr(0, slash + 1) + path;
}

// A certificate or key file: it must be a regular file (OpenSSL would read a FIFO or a device
// for ever).
std::string detail::pem_file(const ConfigReader& r, std::string_view key, const std::string& what) {
  std::string path = config_path(r.file(), r.string(key, ""));
  if (path.empty()) r.fail(r.node(), r.key_path(key), "required (" + what + ")");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    r.fail_key(key, path + ": not a regular file");
  }
  return path;
}

}  // namespace spindle::proxy
