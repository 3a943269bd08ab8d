#include "spindle/http/client.h"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "http2_frames.h"
#include "spindle/base/ascii.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/worker.h"
#include "spindle/http/chunked.h"
#include "spindle/http/http1_parser.h"
#include "spindle/http/rules.h"
#include "spindle/net/stream.h"
#include "spindle/sync/event.h"
#include "spindle/sync/wait_group.h"

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

// Fields a client never sends as given: Host, framing and connection management are its own.
bool client_managed(const ClientRequest& request, std::string_view name) {
  if (iequals(name, "host") || iequals(name, "content-length") || is_hop_by_hop(name)) {
    return true;
  }
  for (const auto& [n, v] : request.headers) {
    if (iequals(n, "connection") && list_has_token(v, name)) return true;
  }
  return false;
}

// True if every part of the request may go on the wire (rules.h): a token method, and field
// names and values that cannot end a line early (no request smuggling through the client).
bool sendable(const ClientRequest& request) {
  if (!is_method(request.method)) return false;
  for (const auto& [name, value] : request.headers) {
    if (!is_field_name(name) || !is_field_value(value)) return false;
  }
  return true;
}

// ---- HTTP/1.1 --------------------------------------------------------------------------------

// One request/response on an HTTP/1.1 connection. `reusable`: the connection may carry the next
// request; `untouched`: it failed before any response byte (a stale pooled connection).
Result<ClientResponse> http1_exchange(Stream& stream, const ClientRequest& request, const Url& url,
                                      const ClientOptions& options, Deadline deadline,
                                      bool& reusable, bool& untouched) {
  reusable = false;
  untouched = true;
  std::string out =
      request.method + " " + url.target + " HTTP/1.1\r\nHost: " + url.authority + "\r\n";
  for (const auto& [name, value] : request.headers) {
    if (client_managed(request, name)) continue;
    out += name + ": " + value + "\r\n";
  }
  if (!request.body.empty() || request.method == "POST" || request.method == "PUT" ||
      request.method == "PATCH") {
    out += "Content-Length: " + std::to_string(request.body.size()) + "\r\n";
  }
  out += "\r\n";
  out += request.body;
  if (auto w = stream.write_all(out, deadline); !w) return fail(w.error());

  std::string in;
  // Reads straight onto the end of `in` (fiber stacks are small: no big local buffer).
  auto read_more = [&]() -> Result<bool> {
    constexpr std::size_t kChunk = 16 * 1024;
    std::size_t at = in.size();
    in.resize(at + kChunk);
    auto n = stream.read({in.data() + at, kChunk}, deadline);
    in.resize(at + (n ? *n : 0));
    if (!n) return fail(n.error());
    if (*n == 0) return false;
    untouched = false;
    return true;
  };
  ResponseParser parser;
  ResponseHead head;
  std::size_t consumed = 0;
  for (;;) {
    auto parsed = parser.parse(in, head);
    if (parsed.state == ParseResult::State::kError) return fail(std::errc::protocol_error);
    if (parsed.state == ParseResult::State::kComplete) {
      if (head.status >= 200 || head.status == 101) {
        consumed = parsed.consumed;
        break;
      }
      in.erase(0, parsed.consumed);  // an interim 1xx: the real answer follows
      continue;
    }
    auto more = read_more();
    if (!more) return fail(more.error());
    if (!*more) return fail(std::errc::connection_reset);  // closed before a whole head
  }
  ClientResponse response;
  response.status = head.status;
  response.version = head.minor_version == 0 ? 10 : 11;
  for (const Field& f : head.headers) response.headers.add(f.name, f.value);
  bool keep_alive = head.keep_alive;
  in.erase(0, consumed);

  if (request.method == "HEAD" || head.status == 204 || head.status == 304 || head.status < 200) {
    reusable = keep_alive && in.empty();
    return response;
  }
  if (head.chunked) {
    ChunkedDecoder decoder(options.max_response_body);
    for (;;) {
      auto step = decoder.next(in);
      if (step.kind == ChunkedDecoder::Step::Kind::kError) {
        return fail(step.status == 413 ? std::errc::message_size : std::errc::protocol_error);
      }
      response.body.append(step.data);
      in.erase(0, step.consumed);
      if (step.kind == ChunkedDecoder::Step::Kind::kDone) break;
      if (step.kind == ChunkedDecoder::Step::Kind::kNeedMore) {
        auto more = read_more();
        if (!more) return fail(more.error());
        if (!*more) return fail(std::errc::connection_reset);
      }
    }
    reusable = keep_alive && in.empty();
    return response;
  }
  if (head.content_length) {
    if (*head.content_length > options.max_response_body) return fail(std::errc::message_size);
    auto length = static_cast<std::size_t>(*head.content_length);
    while (in.size() < length) {
      auto more = read_more();
      if (!more) return fail(more.error());
      if (!*more) return fail(std::errc::connection_reset);
    }
    response.body = in.substr(0, length);
    reusable = keep_alive && in.size() == length;
    return response;
  }
  // No length: the body ends with the connection.
  for (;;) {
    if (in.size() > options.max_response_body) return fail(std::errc::message_size);
    auto more = read_more();
    if (!more) return fail(more.error());
    if (!*more) break;
  }
  response.body = std::move(in);
  return response;
}

}  // namespace

// ---- HTTP/2 ----------------------------------------------------------------------------------

namespace {

// One request in flight on an HTTP/2 connection.
struct H2Exchange {
  ClientResponse response;
  std::string body_out;
  std::size_t body_out_pos = 0;
  std::size_t max_body = 0;
  std::error_code error;
  bool finished = false;
  Event done;
};

ssize_t read_request_body(nghttp2_session*, std::int32_t, std::uint8_t* buf, std::size_t length,
                          std::uint32_t* flags, nghttp2_data_source* source, void*) {
  auto* ex = static_cast<H2Exchange*>(source->ptr);
  std::size_t n = std::min(length, ex->body_out.size() - ex->body_out_pos);
  std::memcpy(buf, ex->body_out.data() + ex->body_out_pos, n);
  ex->body_out_pos += n;
  if (ex->body_out_pos == ex->body_out.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

}  // namespace

// An HTTP/2 client connection: a reader and a writer fiber move the bytes; callers submit
// streams and wait for them.
class H2Client : public std::enable_shared_from_this<H2Client> {
 public:
  explicit H2Client(Stream stream) : stream_(std::move(stream)) {}
  ~H2Client() { nghttp2_session_del(session_); }

  /// Starts the session and its fibers.
  void start();
  /// True while new requests may go on it.
  bool usable() const { return !broken_ && !goaway_; }
  /// One exchange on a new stream.
  Result<ClientResponse> exchange(const ClientRequest& request, const Url& url,
                                  const ClientOptions& options, Deadline deadline);
  /// Ends the connection; its fibers finish on their own.
  void close() {
    broken_ = true;
    (void)stream_.shutdown(TcpStream::Shutdown::kBoth);
    writer_wake_.set();
  }

 private:
  static H2Client& self(void* user) { return *static_cast<H2Client*>(user); }
  H2Exchange* find(std::int32_t id) {
    auto it = exchanges_.find(id);
    return it == exchanges_.end() ? nullptr : it->second.get();
  }
  void fail_all(std::error_code ec) {
    for (auto& [id, ex] : exchanges_) {
      if (!ex->finished) {
        ex->finished = true;
        ex->error = ec;
        ex->done.set();
      }
    }
    exchanges_.clear();
  }
  void read_loop();
  void write_loop();

  Stream stream_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<std::int32_t, std::shared_ptr<H2Exchange>> exchanges_;
  Event writer_wake_;
  bool broken_ = false;
  bool goaway_ = false;
};

void H2Client::start() {
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_header_callback(
      cb,
      [](nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name,
         std::size_t name_length, const std::uint8_t* value, std::size_t value_length, std::uint8_t,
         void* user) -> int {
        H2Exchange* ex = self(user).find(frame->hd.stream_id);
        if (ex == nullptr || frame->hd.type != NGHTTP2_HEADERS) return 0;
        std::string_view n(reinterpret_cast<const char*>(name), name_length);
        std::string_view v(reinterpret_cast<const char*>(value), value_length);
        if (n == ":status") {
          int status = 0;
          std::from_chars(v.data(), v.data() + v.size(), status);
          if (ex->response.status != 0 && ex->response.status < 200) ex->response.headers.clear();
          ex->response.status = status;
        } else if (frame->headers.cat != NGHTTP2_HCAT_HEADERS || ex->response.status >= 200) {
          ex->response.headers.add(n, v);  // fields, and trailers after them
        }
        return 0;
      });
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
      cb,
      [](nghttp2_session* session, std::uint8_t, std::int32_t id, const std::uint8_t* data,
         std::size_t length, void* user) -> int {
        H2Exchange* ex = self(user).find(id);
        if (ex == nullptr) return 0;
        if (ex->response.body.size() + length > ex->max_body) {
          ex->error = std::make_error_code(std::errc::message_size);
          nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
          return 0;
        }
        ex->response.body.append(reinterpret_cast<const char*>(data), length);
        return 0;
      });
  nghttp2_session_callbacks_set_on_stream_close_callback(
      cb, [](nghttp2_session*, std::int32_t id, std::uint32_t error_code, void* user) -> int {
        H2Client& c = self(user);
        auto it = c.exchanges_.find(id);
        if (it == c.exchanges_.end()) return 0;
        H2Exchange& ex = *it->second;
        if (!ex.error && (error_code != NGHTTP2_NO_ERROR || ex.response.status == 0)) {
          ex.error = std::make_error_code(std::errc::connection_reset);
        }
        ex.finished = true;
        ex.done.set();
        c.exchanges_.erase(it);
        return 0;
      });
  nghttp2_session_callbacks_set_on_frame_recv_callback(
      cb, [](nghttp2_session*, const nghttp2_frame* frame, void* user) -> int {
        if (frame->hd.type == NGHTTP2_GOAWAY) self(user).goaway_ = true;
        return 0;
      });
  nghttp2_session_client_new(&session_, cb, this);
  nghttp2_session_callbacks_del(cb);
  nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                       {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1u << 20}};
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, 16 << 20);
  spawn([self = shared_from_this()] { self->read_loop(); }).detach();
  spawn([self = shared_from_this()] { self->write_loop(); }).detach();
}

void H2Client::read_loop() {
  std::vector<char> buffer(16 * 1024);  // on the heap: fiber stacks are small
  while (!broken_) {
    auto n = stream_.read(buffer);
    if (!n || *n == 0) break;
    if (nghttp2_session_mem_recv(session_, reinterpret_cast<const std::uint8_t*>(buffer.data()),
                                 *n) < 0) {
      break;
    }
    writer_wake_.set();
    if (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_)) break;
  }
  broken_ = true;
  fail_all(std::make_error_code(std::errc::connection_aborted));
  writer_wake_.set();
  (void)stream_.shutdown(TcpStream::Shutdown::kWrite);  // the server may be waiting for our FIN
}

void H2Client::write_loop() {
  std::string out;
  while (!broken_ || nghttp2_session_want_write(session_)) {
    auto sent =
        detail::send_frames(session_, stream_, out, Deadline::after(std::chrono::seconds(30)));
    if (sent == detail::FramesSent::kSent) continue;
    if (sent == detail::FramesSent::kFailed) {
      close();
      break;
    }
    if (broken_ || this_fiber::stop_requested()) break;
    detail::wait_for_frames(writer_wake_);
  }
}

Result<ClientResponse> H2Client::exchange(const ClientRequest& request, const Url& url,
                                          const ClientOptions& options, Deadline deadline) {
  if (!usable()) return fail(std::errc::connection_aborted);
  std::vector<std::string> storage;
  storage.reserve(8 + request.headers.size() * 2);
  std::vector<nghttp2_nv> nv;
  auto add = [&](std::string name, std::string_view value) {
    storage.push_back(std::move(name));
    std::string& n = storage.back();
    storage.emplace_back(value);
    std::string& v = storage.back();
    nv.push_back({reinterpret_cast<std::uint8_t*>(n.data()),
                  reinterpret_cast<std::uint8_t*>(v.data()), n.size(), v.size(),
                  NGHTTP2_NV_FLAG_NONE});
  };
  add(":method", request.method);
  add(":scheme", url.tls ? "https" : "http");
  add(":authority", url.authority);
  add(":path", url.target);
  for (const auto& [name, value] : request.headers) {
    if (client_managed(request, name)) continue;
    add(ascii_lower(name), value);
  }
  auto ex = std::make_shared<H2Exchange>();
  ex->max_body = options.max_response_body;
  ex->body_out = request.body;
  nghttp2_data_provider provider{};
  provider.source.ptr = ex.get();
  provider.read_callback = &read_request_body;
  std::int32_t id = nghttp2_submit_request(session_, nullptr, nv.data(), nv.size(),
                                           request.body.empty() ? nullptr : &provider, nullptr);
  if (id < 0) return fail(std::errc::protocol_error);
  exchanges_[id] = ex;  // the connection keeps it (and its body) until the stream closes
  writer_wake_.set();
  if (auto ec = ex->done.wait(deadline)) {
    if (!ex->finished) {
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
      writer_wake_.set();
    }
    return fail(ec);
  }
  if (ex->error) return fail(ex->error);
  ex->response.version = 20;
  return std::move(ex->response);
}

// ---- the client ------------------------------------------------------------------------------

struct HttpClient::Pool {
  /// Idle HTTP/1.1 connections by origin, the most recent last.
  std::unordered_map<std::string, std::vector<Stream>> idle;
  /// The HTTP/2 connection of each origin that speaks it.
  std::unordered_map<std::string, std::shared_ptr<H2Client>> http2;

  ~Pool() {
    for (auto& [origin, c] : http2) c->close();
  }
};

HttpClient::HttpClient(Runtime& runtime, ClientOptions options)
    : runtime_(runtime), options_(std::move(options)), pools_(runtime.size()) {
  if (!options_.tls) {
    TlsClientOptions tls;
    tls.alpn = options_.http2 ? std::vector<std::string>{"h2", "http/1.1"}
                              : std::vector<std::string>{"http/1.1"};
    auto ctx = TlsClientContext::create(std::move(tls));
    if (ctx) options_.tls = std::move(*ctx);  // else https:// requests fail at connect
  }
}

HttpClient::~HttpClient() {
  // Each pool holds sockets of its worker: it is closed there.
  WaitGroup closed;
  Worker* here = Worker::current();
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    if (!pools_[i]) continue;
    if (here != nullptr && here->index() == i) {
      pools_[i].reset();
      continue;
    }
    closed.add();
    runtime_.worker(i).post([this, i, &closed] {
      pools_[i].reset();
      closed.done();
    });
  }
  (void)closed.wait();
}

Result<ClientResponse> HttpClient::send(const ClientRequest& request) {
  Worker* worker = Worker::current();
  if (worker == nullptr) return fail(std::errc::operation_not_permitted);
  auto url = parse_url(request.url);
  if (!url || !sendable(request)) return fail(std::errc::invalid_argument);
  auto& slot = pools_.at(worker->index());
  if (!slot) slot = std::make_unique<Pool>();
  Pool& pool = *slot;
  Deadline deadline = Deadline::after(options_.request_timeout);

  if (auto it = pool.http2.find(url->origin); it != pool.http2.end()) {
    std::shared_ptr<H2Client> c = it->second;
    if (c->usable()) return c->exchange(request, *url, options_, deadline);
    pool.http2.erase(it);
  }
  auto& idle = pool.idle[url->origin];
  for (int attempt = 0;; ++attempt) {
    Stream stream;
    bool reused = !idle.empty();
    if (reused) {
      stream = std::move(idle.back());
      idle.pop_back();
    } else {
      // A new connection: resolve, connect, handshake.
      Deadline connect_by = Deadline::after(options_.connect_timeout);
      auto addresses = resolver_.resolve(url->host, url->port, connect_by);
      if (!addresses) return fail(addresses.error());
      Result<TcpStream> tcp = fail(std::errc::host_unreachable);
      for (const Address& address : *addresses) {
        tcp = TcpStream::connect(address, connect_by);
        if (tcp) break;
      }
      if (!tcp) return fail(tcp.error());
      (void)tcp->set_nodelay(true);
      bool h2 = false;
      if (url->tls) {
        if (!options_.tls) return fail(std::errc::protocol_not_supported);
        auto tls = TlsStream::connect(std::move(*tcp), options_.tls, url->host, connect_by);
        if (!tls) return fail(tls.error());
        h2 = tls->alpn() == "h2";  // what the server will speak, whatever we preferred
        stream = Stream(std::move(*tls));
      } else {
        h2 = options_.h2c_prior_knowledge;
        stream = Stream(std::move(*tcp));
      }
      if (h2) {
        // Another fiber may have connected meanwhile: one HTTP/2 connection per origin.
        if (auto it = pool.http2.find(url->origin);
            it != pool.http2.end() && it->second->usable()) {
          return std::shared_ptr<H2Client>(it->second)->exchange(request, *url, options_, deadline);
        }
        auto c = std::make_shared<H2Client>(std::move(stream));
        c->start();
        if (auto it = pool.http2.find(url->origin); it != pool.http2.end()) it->second->close();
        pool.http2[url->origin] = c;
        return c->exchange(request, *url, options_, deadline);
      }
    }
    bool reusable = false, untouched = false;
    auto response = http1_exchange(stream, request, *url, options_, deadline, reusable, untouched);
    // A pooled connection the server closed meanwhile fails before any answer: try again on a
    // fresh one, if the request may be sent twice.
    if (!response && reused && untouched && attempt == 0 && is_idempotent(request.method)) continue;
    if (response && reusable && idle.size() < options_.max_idle_per_origin) {
      idle.push_back(std::move(stream));
    }
    return response;
  }
}

}  // namespace spindle::http
