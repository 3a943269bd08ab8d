#pragma once
/// The spindle configuration: a YAML file (or the embedded default of the binary) turned into
/// a checked model. Every error, whatever the shape of the YAML, is a ConfigError naming the
/// file, the line and the key; nothing else escapes the loader.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "spindle/net/address.h"
#include "spindle/net/cidr.h"
#include "spindle/server/server.h"

namespace re2 {
class RE2;
}

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
  /// Most bytes of lines waiting to be written (an output slower than the lines come, a
  /// reader that stopped); lines past it are dropped and counted.
  std::size_t buffer = 4 << 20;
};

/// One `servers` entry.
struct ServerConfig {
  /// The name routes use to pick servers ("" if unnamed: such a server gets the routes that
  /// name no servers).
  std::string name;
  /// Peers whose X-Forwarded-For is believed (and kept, with the peer added) when proxying.
  std::vector<Cidr> trusted_proxies;
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
  /// Its settings as written (and its certificates' contents): a reload restarts the server's
  /// configuration only when this changed.
  std::string fingerprint;
  /// How routes and reloads know it: its name, or its listen address when unnamed.
  std::string key() const;
};

// ---- the gateway: routes → services → upstreams ---------------------------------------------

/// What a request must have for a route to take it (every condition given must hold).
struct RouteMatch {
  /// Host names ("api.example.com") or "*.example.com" (one or more labels in front); empty:
  /// any host. Lower case, without port.
  std::vector<std::string> hosts;
  /// At most one of these three: an exact path, a path prefix, a regular expression (RE2
  /// syntax, searched in the path; anchor it with ^ and $ as needed).
  std::string path;
  std::string path_prefix;
  std::string path_regex;
  /// Methods; empty: any.
  std::vector<std::string> methods;
  /// Fields that must be present with exactly these values (names lower case).
  std::vector<std::pair<std::string, std::string>> headers;
};

/// One `routes` entry.
/// Field edits of a `headers` middleware, for one direction.
struct HeaderEdits {
  /// Replace every field of that name with this one.
  std::vector<std::pair<std::string, std::string>> set;
  /// Add a field (beside any of the same name).
  std::vector<std::pair<std::string, std::string>> add;
  /// Remove every field of these names.
  std::vector<std::string> remove;

  bool empty() const { return set.empty() && add.empty() && remove.empty(); }
};

/// `redis`: the Redis that shared rate limits keep their counts in.
struct RedisConfig {
  /// A host name or IP address, and the port.
  std::string host;
  std::uint16_t port = 6379;
  /// How long one call (connecting included) may take before the rate limit's failure_mode
  /// decides.
  std::chrono::milliseconds timeout{50};
  /// AUTH password; none if empty.
  std::string password;
  /// SELECT database.
  unsigned database = 0;
  /// How long a connection that failed or timed out is left alone before the next try
  /// (meanwhile calls fail at once).
  std::chrono::milliseconds backoff{1000};

  /// "host:port".
  std::string address() const;
};

/// `rate_limit`: requests allowed per key (GCRA: a steady rate, and bursts up to `burst`).
struct RateLimitConfig {
  /// What a request is counted by: the client's address, a request field's value, the route as
  /// a whole, or a claim of the request's JSON Web Token.
  enum class Key { kClientIp, kHeader, kRoute, kClaim } key = Key::kClientIp;
  /// The field, for kHeader (lower case); the claim, for kClaim (a jwt earlier in the route
  /// checked the token).
  std::string header;
  /// Requests per second, on average.
  double rate = 1;
  /// Requests allowed at once, after a quiet time.
  unsigned burst = 1;
  /// "rate" as written, for logs and headers ("100/s").
  std::string rate_text;
  /// Where the counts are kept: in this process (exact across its workers), or in the
  /// configuration's Redis, shared by every instance that uses it.
  enum class Store { kLocal, kRedis } store = Store::kLocal;
  /// With store: redis, what a request meets while Redis cannot be reached in time: let
  /// through (open) or refused with 503 (closed).
  bool fail_open = true;
  /// With store: redis, tokens a worker takes from Redis at a time (0: a tenth of the burst,
  /// at least 1).
  unsigned batch = 0;
};

/// `cors`: which cross-origin requests browsers may make.
struct CorsConfig {
  /// Allowed origins ("https://app.example"), or "*" for any.
  std::vector<std::string> origins;
  bool any_origin = false;
  /// Methods and request fields a preflight may ask for (fields lower case; "*": any).
  std::vector<std::string> methods{"GET", "HEAD", "POST"};
  std::vector<std::string> headers;
  bool any_header = false;
  /// Response fields the page may read.
  std::vector<std::string> expose;
  /// Whether cookies and credentials go along (Access-Control-Allow-Credentials).
  bool credentials = false;
  /// How long a browser may keep a preflight's answer.
  std::chrono::seconds max_age{600};
};

/// `basic_auth`: the users of an htpasswd file (bcrypt or {SHA} hashes).
struct BasicAuthConfig {
  /// The realm named in WWW-Authenticate.
  std::string realm = "spindle";
  /// User name -> password hash, as in the file.
  std::map<std::string, std::string, std::less<>> users;
};

class JwtKeys;

/// `jwt`: requests need a valid JSON Web Token.
struct JwtConfig {
  /// The keys tokens may be signed with (from jwks_file).
  std::shared_ptr<const JwtKeys> keys;
  /// Algorithms accepted (HS256, RS256, ES256).
  std::vector<std::string> algorithms{"HS256", "RS256", "ES256"};
  /// When given: the iss claim must be this, and aud must name one of these.
  std::string issuer;
  std::vector<std::string> audiences;
  /// Clock skew allowed on exp and nbf.
  std::chrono::seconds leeway{0};
  /// Where the token is: the Authorization field (Bearer), or a cookie of this name.
  std::string cookie;
  /// Claim -> request field sent upstream (a field of that name from the client is removed).
  std::vector<std::pair<std::string, std::string>> claims_to_headers;
  /// The claims a request keeps (those above, sub, and those a rate_limit of the route counts
  /// by).
  std::vector<std::string> kept_claims;
  /// The realm named in WWW-Authenticate.
  std::string realm = "spindle";
};

/// `forward_auth`: a sub-request to an authentication service decides.
struct ForwardAuthConfig {
  /// The service asked (a service of the configuration), and the path asked for.
  std::string service;
  std::string path = "/";
  /// The client's fields sent along (lower case; empty: all but those about its body).
  std::vector<std::string> request_headers;
  /// Fields of the service's 2xx answer set on the request that goes on (lower case).
  std::vector<std::string> response_headers;
};

/// `mirror`: a copy of each request sent to another service, its answer thrown away.
struct MirrorConfig {
  std::string service;
  /// Share of requests mirrored, 0 to 100.
  double percent = 100;
  /// Copies in flight at once per worker; beyond, a copy is dropped (the request goes on).
  std::size_t max_in_flight = 64;
  /// How long a copy may take in all (each wait of its exchange is bounded by it too, so a
  /// copy ends within twice this): a mirror target that trickles its answer holds no slot for
  /// longer.
  std::chrono::milliseconds timeout{std::chrono::seconds(5)};
};

/// `traffic_split`: requests shared between services by weight.
struct TrafficSplitConfig {
  struct Share {
    std::string service;
    unsigned weight = 1;
  };
  std::vector<Share> shares;
  /// With a cookie name: a client's first pick is set in that cookie and kept.
  std::string cookie;
};

/// One entry of `routes[].middlewares`: what it is and its settings.
struct MiddlewareConfig {
  enum class Kind {
    kHeaders,
    kStripPrefix,
    kAddPrefix,
    kReplacePath,
    kReplacePathRegex,
    kRateLimit,
    kIpAllow,
    kIpDeny,
    kMaxBody,
    kRedirect,
    kRespond,
    kCors,
    kBasicAuth,
    kTrafficSplit,
    kJwt,
    kForwardAuth,
    kMirror,
    kCompression,
  };
  Kind kind = Kind::kHeaders;
  /// rate_limit: its settings.
  RateLimitConfig rate_limit;
  /// cors: its settings.
  CorsConfig cors;
  /// traffic_split: the services and their weights.
  TrafficSplitConfig traffic_split;
  /// basic_auth: its users.
  std::shared_ptr<const BasicAuthConfig> basic_auth;
  /// jwt: its keys and checks.
  std::shared_ptr<const JwtConfig> jwt;
  /// forward_auth: whom to ask, and which fields go and come back.
  std::shared_ptr<const ForwardAuthConfig> forward_auth;
  /// mirror: where copies go, and how many.
  MirrorConfig mirror;
  /// compression: the middleware that compresses the route's answers.
  std::shared_ptr<const http::Middleware> compress;
  /// replace_path: the new path; replace_path_regex: the replacement (\1 for a group).
  std::string replacement;
  /// replace_path_regex: the pattern (RE2), searched in the path.
  std::shared_ptr<const re2::RE2> regex;
  /// ip_allow / ip_deny: the networks.
  std::vector<Cidr> networks;
  /// max_body: the largest request body, in bytes.
  std::uint64_t max_body = 0;
  /// redirect: what changes ("" / 0: as in the request), and the status; respond: the status,
  /// body and type of the answer.
  std::string scheme, host, path;
  std::uint16_t port = 0;
  int status = 0;
  std::string body, content_type;
  /// headers: the edits to the request sent upstream and to the response sent back.
  HeaderEdits request, response;
  /// strip_prefix / add_prefix: the path prefix.
  std::string prefix;
};

struct RouteConfig {
  std::string name;
  /// Names of the servers it applies to; empty: every server.
  std::vector<std::string> servers;
  RouteMatch match;
  /// Run in order on the way to the service, in reverse order on the way back.
  std::vector<MiddlewareConfig> middlewares;
  /// The service that answers.
  std::string service;
  /// The protocols a client may switch to through this route (Upgrade tokens' names, lower
  /// case; an HTTP/2 client's extended CONNECT `:protocol` too). Any other Upgrade token is
  /// removed and the request goes on as a plain one. Never "h2c" (a tunnel past every route).
  std::vector<std::string> upgrades{"websocket"};
};

/// How a service talks to its upstream.
enum class UpstreamProtocol { kHttp1, kH2, kH2c };

/// Time limits of one upstream exchange.
struct UpstreamTimeouts {
  std::chrono::milliseconds connect{std::chrono::seconds(5)};
  std::chrono::milliseconds first_byte{std::chrono::seconds(60)};
  std::chrono::milliseconds read{std::chrono::seconds(60)};
  std::chrono::milliseconds write{std::chrono::seconds(60)};
  std::chrono::milliseconds idle{std::chrono::seconds(60)};
  /// The longest an upgraded connection (WebSocket) lives, busy or not; 0: no limit.
  std::chrono::milliseconds tunnel{0};
};

/// When a failed attempt is tried again on another target.
struct RetryPolicy {
  /// Most attempts per request, the first included (1: never retried).
  unsigned attempts = 2;
  /// Retries allowed as a share of the service's recent requests (0.2 for "20%").
  double budget = 0.2;
};

/// One `services` entry.
struct ServiceConfig {
  std::string name;
  /// The upstream whose targets serve it (for `url:`, an upstream of one target made for it,
  /// named "<service>.url").
  std::string upstream;
  UpstreamProtocol protocol = UpstreamProtocol::kHttp1;
  /// TLS to the upstream (h2 always; http when the url is https:// or `tls` is given).
  bool tls = false;
  /// With tls: the CA bundle to verify against (empty: the system store), whether to verify
  /// at all, and the name sent by SNI and verified (empty: the target's host).
  std::string tls_ca_file;
  bool tls_verify = true;
  std::string tls_server_name;
  UpstreamTimeouts timeouts;
  RetryPolicy retries;
  /// Request bodies up to this size are read whole from the client before a target is chosen
  /// (they can then be sent again, and a slow client costs the upstream nothing); larger ones
  /// are streamed as they come.
  std::uint64_t request_buffering = 64 * 1024;
};

/// How an upstream picks a target for a request.
enum class BalancerKind { kRoundRobin, kWeighted, kLeastConnections, kRandomTwo, kConsistentHash };

/// What consistent_hash hashes.
struct HashKey {
  enum class By { kHeader, kCookie, kClientIp } by = By::kClientIp;
  /// The header or cookie name (empty for client_ip).
  std::string key;
};

/// One target of an upstream.
struct TargetConfig {
  /// A host name or IP address, and the port.
  std::string host;
  std::uint16_t port = 0;
  unsigned weight = 1;
  /// From SRV records only: the targets of the lowest priority with one up take the requests.
  unsigned priority = 0;
};

/// Probing targets with requests of our own.
struct ActiveHealthConfig {
  bool enabled = false;
  std::string path = "/healthz";
  std::chrono::milliseconds interval{std::chrono::seconds(2)};
  std::chrono::milliseconds timeout{std::chrono::seconds(1)};
  /// Consecutive successes that make a target healthy again, failures that make it unhealthy.
  unsigned healthy = 2;
  unsigned unhealthy = 3;
};

/// Taking a target out after failures of real requests (max_fails 0: never).
struct PassiveHealthConfig {
  unsigned max_fails = 3;
  std::chrono::milliseconds fail_timeout{std::chrono::seconds(10)};
  /// The most targets of the upstream passive checks may have ejected at once, in percent of
  /// them (at least one may be, and one always stays eligible).
  unsigned max_ejection_percent = 10;
};

/// Idle upstream connections kept per worker and target.
struct KeepaliveConfig {
  /// Unless given: the upstream's max_connections (256 when that is 0, no limit).
  std::size_t max_idle = 256;
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(30)};
};

/// `upstreams.NAME.limits`: how many connections each worker opens to one target, and how
/// many requests may wait for one of them.
struct UpstreamLimits {
  /// HTTP/1.1 requests in flight per worker and target (0: no limit); more wait their turn.
  std::size_t max_connections = 256;
  /// Requests waiting their turn at once (0: no limit); more get 503.
  std::size_t max_pending = 0;
  /// While requests wait their turn: a request whose client has taken nothing of its answer
  /// (or sent nothing of its body) for this long gives its connection up to them (0: never).
  std::chrono::milliseconds preempt_stalled{std::chrono::seconds(2)};
};

/// One `upstreams` entry.
struct UpstreamConfig {
  std::string name;
  BalancerKind balancer = BalancerKind::kRoundRobin;
  HashKey hash;
  std::vector<TargetConfig> targets;
  /// A DNS SRV name whose records give the targets (host, port, weight), instead of `targets`.
  std::string srv;
  ActiveHealthConfig active_health;
  PassiveHealthConfig passive_health;
  /// Below this share of healthy targets (percent), the balancer spreads requests over all of
  /// them, healthy or not: what looks like every target failing is more likely the checks
  /// (or the clients) than the targets. 0: never.
  unsigned panic_threshold = 50;
  KeepaliveConfig keepalive;
  UpstreamLimits limits;
};

/// `dns`: how target names are resolved, and again on their TTL.
struct DnsConfig {
  /// Name servers ("127.0.0.1:5353"); the system's (/etc/resolv.conf) if empty.
  std::vector<std::string> servers;
  /// A TTL is taken within these bounds.
  std::chrono::milliseconds min_ttl{std::chrono::seconds(1)};
  std::chrono::milliseconds max_ttl{std::chrono::minutes(5)};
  /// How often SRV records are asked again (c-ares does not give their TTL).
  std::chrono::milliseconds srv_refresh{std::chrono::seconds(10)};
  /// How long one lookup may take.
  std::chrono::milliseconds timeout{std::chrono::seconds(2)};
  /// How long past its TTL a last answer is still used while lookups of the name fail.
  std::chrono::milliseconds stale_grace{std::chrono::hours(1)};
};

/// The whole configuration.
struct Config {
  /// Worker threads; 0 means one per core.
  std::size_t threads = 0;
  /// Fiber stacks from huge-page chunks (RuntimeOptions::huge_page_stacks).
  bool huge_page_stacks = false;
  /// How long a shutdown waits for requests in flight before it closes their connections.
  std::chrono::milliseconds drain_timeout{std::chrono::seconds(10)};
  /// Where the admin listener (metrics, health, readiness, configuration) listens; none if
  /// not given.
  std::optional<Address> admin_listen;
  /// The Redis that rate limits with store: redis share, if given.
  std::optional<RedisConfig> redis;
  /// How names are resolved.
  DnsConfig dns;
  /// The text it was read from.
  std::string source;
  /// The servers.
  std::vector<ServerConfig> servers;
  /// The gateway, in declared order.
  std::vector<RouteConfig> routes;
  std::vector<ServiceConfig> services;
  std::vector<UpstreamConfig> upstreams;

  /// The service or upstream named `name`, or nullptr.
  const ServiceConfig* service(std::string_view name) const;
  const UpstreamConfig* upstream(std::string_view name) const;
};

/// Parses YAML `text` read from `file` (used in error messages; relative paths in it are
/// relative to the file's folder). Throws ConfigError for anything wrong, and only that.
Config parse_config(const std::string& text, const std::string& file);

/// The name a configuration gives middleware `m`'s kind ("forward_auth").
std::string_view middleware_name(const MiddlewareConfig& m);

/// The phases `m` acts in, in the order a request meets them ("answer, request"): answer (on
/// the way in, in the order written, it may answer in the service's place), request (it edits
/// the request that goes up, in the order written), forward (as the request is sent: a copy,
/// the service, a body's limit), response (on the way back, in reverse order). docs/gateway.md,
/// "The middleware chain".
std::string_view middleware_phases(const MiddlewareConfig& m);

/// One line per route with middlewares: "route NAME: 1 KIND [PHASES], 2 ...", in the order
/// written (what check-config prints).
std::string describe_chains(const Config& config);

/// The text `config` was read from, comments dropped and the values of secret keys
/// (password, secret, token, api_key, authorization, credentials, and NAME_password and the
/// like) shown as "<redacted>".
std::string redacted_source(const Config& config);

/// The whole text of the configuration file `file`, read in one go. Throws ConfigError when it
/// cannot be read, is not a regular file (a FIFO or a device is refused, never waited on),
/// is larger than 64 MiB, or changed (size, modification time, or another file renamed into
/// its place) while it was read: a writer is at work, and its next change is the one to load.
std::string read_config_file(const std::string& file);

/// Reads (read_config_file) and parses `file`. Throws ConfigError (also when it cannot be read).
Config load_config(const std::string& file);

}  // namespace spindle::proxy
