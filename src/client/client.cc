#include "spindle/client/client.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <unordered_map>

#include "spindle/fiber/worker.h"
#include "spindle/http/rules.h"

namespace spindle::http {
namespace {

// The parts of a URL a request needs.
struct Url {
  bool tls = false;
  std::string host;
  std::uint16_t port = 0;
  std::string authority;  // host[:port] as sent in Host / :authority
  std::string target;     // path and query
  std::string origin;     // scheme://host:port, the pool key
};

// host[:port] as RFC 3986 allows it (reg-name or IP literal): nothing that could end the Host
// field or the request line early.
bool is_authority(std::string_view s) {
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              std::string_view("-._~!$&'()*+,;=:%[]").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return !s.empty();
}

std::optional<Url> parse_url(std::string_view text) {
  Url url;
  if (text.starts_with("https://")) {
    url.tls = true;
    text.remove_prefix(8);
  } else if (text.starts_with("http://")) {
    text.remove_prefix(7);
  } else {
    return std::nullopt;
  }
  std::size_t slash = text.find_first_of("/?");
  std::string_view authority = text.substr(0, slash);
  url.target = slash == std::string_view::npos ? "/" : std::string(text.substr(slash));
  if (url.target.front() == '?') url.target.insert(0, "/");
  if (authority.empty() || authority.find('@') != std::string_view::npos) return std::nullopt;
  url.authority = authority;
  std::string_view host = authority, port;
  if (authority.front() == '[') {
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return std::nullopt;
      port = authority.substr(close + 2);
    }
  } else if (std::size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  url.port = url.tls ? 443 : 80;
  if (!port.empty()) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return std::nullopt;
    }
    url.port = static_cast<std::uint16_t>(value);
  }
  if (host.empty() || !is_request_target(url.target) || !is_authority(authority)) {
    return std::nullopt;
  }
  url.host = host;
  url.origin = (url.tls ? "https://" : "http://") + url.host + ":" + std::to_string(url.port);
  return url;
}

// True if every part of the request may go on the wire (rules.h): a token method, and field
// names and values that cannot end a line early (no request smuggling through the client).
bool sendable(const ClientRequest& request) {
  if (!is_method(request.method)) return false;
  for (const Field& f : request.headers) {
    if (!is_field_name(f.name) || !is_field_value(f.value)) return false;
  }
  return true;
}

// Reads the whole response of `exchange`, within `max_body`.
Result<ClientResponse> read_whole(ClientExchange& exchange, std::size_t max_body) {
  auto head = exchange.read_head();
  if (!head) return fail(head.error());
  ClientResponse response;
  response.status = (*head)->status;
  response.version = (*head)->version;
  for (const Field& f : (*head)->headers) response.headers.add(f);
  if ((*head)->content_length && *(*head)->content_length > max_body) {
    return fail(std::errc::message_size);
  }
  constexpr std::size_t kPiece = 16 * 1024;
  for (;;) {
    std::size_t at = response.body.size();
    response.body.resize(at + kPiece);
    auto n = exchange.read({response.body.data() + at, kPiece});
    response.body.resize(at + (n ? *n : 0));
    if (!n) return fail(n.error());
    if (*n == 0) break;
    if (response.body.size() > max_body) return fail(std::errc::message_size);
  }
  for (const Field& f : exchange.trailers()) response.headers.add(f);
  return response;
}

}  // namespace

// ---- the client ------------------------------------------------------------------------------

struct HttpClient::Pool {
  /// The address each origin resolved to (forgotten when connecting to it fails).
  std::unordered_map<std::string, Address> addresses;
};

HttpClient::HttpClient(Runtime& runtime, ClientOptions options)
    : runtime_(runtime),
      options_(std::move(options)),
      connections_(runtime),
      pools_(runtime.size()) {
  if (!options_.tls) {
    TlsClientOptions tls;
    tls.alpn = options_.http2 ? std::vector<std::string>{"h2", "http/1.1"}
                              : std::vector<std::string>{"http/1.1"};
    auto ctx = TlsClientContext::create(std::move(tls));
    if (ctx) options_.tls = std::move(*ctx);  // else https:// requests fail at connect
  }
}

HttpClient::~HttpClient() = default;

Result<ClientResponse> HttpClient::send(const ClientRequest& request) {
  Worker* worker = Worker::current();
  if (worker == nullptr) return fail(std::errc::operation_not_permitted);
  auto url = parse_url(request.url);
  if (!url || !sendable(request)) return fail(std::errc::invalid_argument);
  if (url->tls && !options_.tls) return fail(std::errc::protocol_not_supported);
  auto& slot = pools_.at(worker->index());
  if (!slot) slot = std::make_unique<Pool>();
  Pool& pool = *slot;
  Deadline deadline = Deadline::after(options_.request_timeout);

  Endpoint endpoint;
  endpoint.protocol =
      !url->tls && options_.h2c_prior_knowledge ? WireProtocol::kH2c : WireProtocol::kHttp1;
  if (url->tls) endpoint.tls = options_.tls;
  endpoint.server_name = url->host;
  if (auto known = pool.addresses.find(url->origin); known != pool.addresses.end()) {
    endpoint.address = known->second;
  } else {
    auto addresses =
        resolver_.resolve(url->host, url->port, Deadline::after(options_.connect_timeout));
    if (!addresses) return fail(addresses.error());
    if (addresses->empty()) return fail(std::errc::host_unreachable);
    endpoint.address = addresses->front();
    pool.addresses.insert_or_assign(url->origin, endpoint.address);
  }

  RequestHead head;
  head.method = request.method;
  head.target = url->target;
  for (const Field& f : request.headers) head.headers.add_view(f);
  if (!request.body.empty() || request.method == "POST" || request.method == "PUT" ||
      request.method == "PATCH") {
    head.content_length = request.body.size();
  }
  auto remaining = [&] {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline.when() - Clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  };
  ExchangeTimeouts timeouts{.connect = std::min(options_.connect_timeout, remaining()),
                            .first_byte = remaining(),
                            .read = remaining(),
                            .write = remaining()};
  PoolLimits limits{.max_idle = options_.max_idle_per_origin};
  unsigned turned_away = 0;
  for (int attempt = 0;; ++attempt) {
    auto exchange = connections_.open(endpoint, head, url->authority, timeouts, limits);
    if (!exchange) {
      if (is_connect_failure(exchange.error())) pool.addresses.erase(url->origin);
      return fail(exchange.error());
    }
    bool reused = (*exchange)->reused();
    Result<ClientResponse> response = fail(std::errc::io_error);
    if (auto w = (*exchange)->write(request.body); !w) {
      response = fail(w.error());
    } else if (auto f = (*exchange)->finish(); !f) {
      response = fail(f.error());
    } else {
      response = read_whole(**exchange, options_.max_response_body);
    }
    // A stream the server turned away unprocessed as it closed the connection: again on
    // another (the body is in memory).
    if (!response && resend_turned_away(response.error(), turned_away)) {
      --attempt;
      continue;
    }
    // A pooled connection the server had closed: again on a fresh one, when nothing reached
    // the server, or when the request may be sent twice.
    if (!response && reused && attempt == 0 &&
        (nothing_reached_upstream(response.error()) ||
         (response.error() == ExchangeErrc::kClosedBeforeResponse &&
          is_idempotent(request.method)))) {
      continue;
    }
    return response;
  }
}

}  // namespace spindle::http
