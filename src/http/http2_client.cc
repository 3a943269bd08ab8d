// The HTTP/2 client session and its streaming exchanges. Everything runs on one worker: the
// reader fiber feeds nghttp2, the writer fiber sends what nghttp2 produces, and each exchange
// waits on its own stream's state. Request bodies are handed to nghttp2 through a deferred
// data source (backpressure: write() waits while 64 KiB are still unsent); response bodies
// are acknowledged (WINDOW_UPDATE) only as the exchange reads them, so a slow reader holds at
// most one stream window of the upstream's bytes.
#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <deque>
#include <unordered_map>

#include "exchange_internal.h"
#include "http2_frames.h"
#include "spindle/base/ascii.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/http/rules.h"
#include "spindle/sync/event.h"

namespace spindle::http::detail {
namespace {

// What a stream may receive ahead of its reader, and the connection as a whole.
constexpr std::int32_t kStreamWindow = 256 * 1024;
constexpr std::int32_t kConnectionWindow = 16 << 20;
// Request body bytes handed over but not yet sent, beyond which write() waits.
constexpr std::size_t kMaxUnsent = 64 * 1024;

std::error_code error(ExchangeErrc e) { return make_error_code(e); }

// One stream's state, shared by the session (until nghttp2 closes the stream) and its exchange.
struct Call {
  std::int32_t id = -1;
  // The request body handed over and not yet taken by nghttp2; whether it ended.
  std::string out;
  std::size_t out_pos = 0;
  bool out_end = false;
  bool deferred = false;
  HeaderMap out_trailers;
  bool headers_sent = false;
  // The response.
  ClientResponseHead head;
  bool have_head = false;
  // Interim (1xx) heads received and not yet passed to the exchange's callback.
  std::deque<ClientResponseHead> interim;
  std::string in;
  std::size_t in_pos = 0;
  bool in_end = false;
  HeaderMap trailers;
  // Set when the stream is over (error_code says how, if badly).
  bool closed = false;
  std::error_code error;
  // Set on any change an exchange may wait for.
  Event wake;
};

}  // namespace

struct Http2Session::Impl {
  Stream stream;
  nghttp2_session* session = nullptr;
  std::unordered_map<std::int32_t, std::shared_ptr<Call>> calls;
  Event writer_wake;
  bool broken = false;
  bool goaway = false;
  std::int32_t goaway_last_id = INT32_MAX;

  ~Impl() { nghttp2_session_del(session); }

  Call* find(std::int32_t id) {
    auto it = calls.find(id);
    return it == calls.end() ? nullptr : it->second.get();
  }
  void fail_all() {
    for (auto& [id, call] : calls) {
      if (call->closed) continue;
      call->closed = true;
      if (!call->headers_sent) {
        call->error = error(ExchangeErrc::kClosedBeforeWrite);
      } else if (!call->have_head) {
        call->error = error(ExchangeErrc::kClosedBeforeResponse);
      } else if (!call->in_end) {
        call->error = error(ExchangeErrc::kResponseCut);
      }
      call->wake.set();
    }
    calls.clear();
  }
  void read_loop();
  void write_loop();
};

namespace {

Http2Session::Impl& impl(void* user) { return *static_cast<Http2Session::Impl*>(user); }

ssize_t read_body(nghttp2_session* session, std::int32_t id, std::uint8_t* buf, std::size_t length,
                  std::uint32_t* flags, nghttp2_data_source* source, void*) {
  auto* call = static_cast<Call*>(source->ptr);
  std::size_t n = std::min(length, call->out.size() - call->out_pos);
  std::memcpy(buf, call->out.data() + call->out_pos, n);
  call->out_pos += n;
  if (call->out_pos == call->out.size()) {
    call->out.clear();
    call->out_pos = 0;
    call->wake.set();  // room for the next piece
    if (call->out_end) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      submit_trailers(session, id, call->out_trailers, flags);
    } else if (n == 0) {
      call->deferred = true;
      return NGHTTP2_ERR_DEFERRED;
    }
  }
  return static_cast<ssize_t>(n);
}

int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name,
              std::size_t name_length, const std::uint8_t* value, std::size_t value_length,
              std::uint8_t, void* user) {
  Call* call = impl(user).find(frame->hd.stream_id);
  if (call == nullptr || frame->hd.type != NGHTTP2_HEADERS) return 0;
  std::string_view n(reinterpret_cast<const char*>(name), name_length);
  std::string_view v(reinterpret_cast<const char*>(value), value_length);
  if (call->have_head) {
    call->trailers.add(n, v);  // fields after the final head: trailers
    return 0;
  }
  if (n == ":status") {
    // Three digits, 100 to 599 (RFC 9110 15); anything else resets the stream: a 502.
    int status = 0;
    auto parsed = std::from_chars(v.data(), v.data() + v.size(), status);
    if (v.size() != 3 || parsed.ptr != v.data() + v.size() || status < 100 || status > 599) {
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    call->head.status = status;
    call->head.headers.clear();
  } else if (!n.starts_with(':')) {
    call->head.headers.add(n, v);  // an interim head's fields too (on_frame_recv moves them)
  }
  return 0;
}

int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
  Http2Session::Impl& s = impl(user);
  if (frame->hd.type == NGHTTP2_GOAWAY) {
    s.goaway = true;
    s.goaway_last_id = frame->goaway.last_stream_id;
    return 0;
  }
  Call* call = s.find(frame->hd.stream_id);
  if (call == nullptr) return 0;
  if (frame->hd.type == NGHTTP2_HEADERS && !call->have_head && call->head.status >= 100 &&
      call->head.status < 200) {
    // An interim head: the exchange passes it on from its own fiber (this is the reader's).
    if (call->head.status != 100) {
      ClientResponseHead& interim = call->interim.emplace_back();
      interim.status = call->head.status;
      interim.version = 20;
      interim.no_body = true;
      interim.headers = std::move(call->head.headers);
      call->wake.set();
    }
    call->head.status = 0;
    call->head.headers.clear();
    return 0;
  }
  if (frame->hd.type == NGHTTP2_HEADERS && !call->have_head && call->head.status >= 200) {
    call->have_head = true;
    call->head.version = 20;
    if (auto length = call->head.headers.get("content-length")) {
      call->head.content_length = parse_content_length(*length);
    }
    call->wake.set();
  }
  if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
      (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
    call->in_end = true;
    call->wake.set();
  }
  return 0;
}

int on_frame_send(nghttp2_session*, const nghttp2_frame* frame, void* user) {
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  if (Call* call = impl(user).find(frame->hd.stream_id)) call->headers_sent = true;
  return 0;
}

int on_data(nghttp2_session*, std::uint8_t, std::int32_t id, const std::uint8_t* data,
            std::size_t length, void* user) {
  Call* call = impl(user).find(id);
  if (call == nullptr) return 0;
  if (call->in_pos == call->in.size()) {
    call->in.clear();
    call->in_pos = 0;
  }
  call->in.append(reinterpret_cast<const char*>(data), length);
  call->wake.set();
  return 0;
}

int on_close(nghttp2_session*, std::int32_t id, std::uint32_t code, void* user) {
  Http2Session::Impl& s = impl(user);
  auto it = s.calls.find(id);
  if (it == s.calls.end()) return 0;
  Call& call = *it->second;
  call.closed = true;
  if (!call.error) {
    if (code == NGHTTP2_REFUSED_STREAM) {
      call.error =
          error(id > s.goaway_last_id ? ExchangeErrc::kAboveGoaway : ExchangeErrc::kRefusedStream);
    } else if (!call.have_head) {
      call.error = error(call.headers_sent ? ExchangeErrc::kClosedBeforeResponse
                                           : ExchangeErrc::kClosedBeforeWrite);
    } else if (!call.in_end) {
      call.error = error(ExchangeErrc::kResponseCut);
    }
  }
  call.wake.set();
  s.calls.erase(it);
  return 0;
}

// One stream's exchange.
class Http2Exchange final : public ClientExchange {
 public:
  Http2Exchange(std::shared_ptr<Http2Session> owner, Http2Session::Impl& s,
                std::shared_ptr<Call> call, const ExchangeTimeouts& timeouts, bool has_body)
      : owner_(std::move(owner)), s_(s), call_(std::move(call)), timeouts_(timeouts) {
    if (!has_body) call_->out_end = true;
  }
  ~Http2Exchange() override {
    if (!call_->closed) {
      // Abandoned before its end: the upstream is told to stop.
      nghttp2_submit_rst_stream(s_.session, NGHTTP2_FLAG_NONE, call_->id, NGHTTP2_CANCEL);
      s_.writer_wake.set();
    }
  }

  Result<void> write(std::string_view data) override {
    if (auto failed = check()) return fail(failed);
    if (data.empty()) return {};
    if (call_->out_end) return fail(std::errc::invalid_argument);
    call_->out.append(data);
    resume();
    Deadline deadline = Deadline::after(timeouts_.write);
    while (call_->out.size() - call_->out_pos > kMaxUnsent) {
      call_->wake.reset();
      if (auto failed = check()) return fail(failed);
      if (call_->wake.wait(deadline) == std::errc::timed_out) {
        return fail(error(ExchangeErrc::kWriteTimeout));
      }
    }
    return {};
  }

  Result<void> finish(const HeaderMap* trailers) override {
    if (auto failed = check()) return fail(failed);
    if (call_->out_end) return {};
    if (trailers != nullptr && !trailers->empty()) {
      for (const Field& f : *trailers) {
        if (!is_hop_by_hop(f.name)) call_->out_trailers.add(ascii_lower(f.name), f.value);
      }
    }
    call_->out_end = true;
    resume();
    return {};
  }

  Result<const ClientResponseHead*> read_head() override {
    Deadline deadline = Deadline::after(timeouts_.first_byte);
    for (;;) {
      while (!call_->interim.empty()) {
        ClientResponseHead interim = std::move(call_->interim.front());
        call_->interim.pop_front();
        informational(interim);
      }
      if (call_->have_head) break;
      if (auto failed = check()) return fail(failed);
      call_->wake.reset();
      if (call_->wake.wait(deadline) == std::errc::timed_out) {
        return fail(error(ExchangeErrc::kFirstByteTimeout));
      }
    }
    if (call_->head.status == 204 || call_->head.status == 304 || head_request_) {
      call_->head.no_body = true;
    }
    return &call_->head;
  }

  Result<std::size_t> read(std::span<char> buffer) override {
    if (!call_->have_head) {
      if (auto head = read_head(); !head) return fail(head.error());
    }
    Deadline deadline = Deadline::after(timeouts_.read);
    for (;;) {
      if (call_->in_pos < call_->in.size()) {
        std::size_t n = std::min(buffer.size(), call_->in.size() - call_->in_pos);
        std::memcpy(buffer.data(), call_->in.data() + call_->in_pos, n);
        call_->in_pos += n;
        if (!call_->closed) {
          nghttp2_session_consume(s_.session, call_->id, n);  // the window opens as we read
          s_.writer_wake.set();
        }
        return n;
      }
      if (call_->in_end) return 0;
      if (auto failed = check()) return fail(failed);
      call_->wake.reset();
      if (call_->wake.wait(deadline) == std::errc::timed_out) {
        return fail(error(ExchangeErrc::kReadTimeout));
      }
    }
  }

  const HeaderMap& trailers() const override { return call_->trailers; }

  void cancel() override {
    if (call_->closed) return;
    call_->error = error(ExchangeErrc::kCancelled);
    nghttp2_submit_rst_stream(s_.session, NGHTTP2_FLAG_NONE, call_->id, NGHTTP2_CANCEL);
    s_.writer_wake.set();
    call_->wake.set();
  }

  Result<Stream> take_connection(std::string&) override {
    return fail(std::errc::operation_not_supported);
  }

  void set_head_request() { head_request_ = true; }

 private:
  // The error the stream ended with, or {} while it may go on. A stream closed cleanly after
  // its whole response is not an error for reads.
  std::error_code check() const {
    if (call_->error) return call_->error;
    if (call_->closed && !(call_->have_head && call_->in_end)) {
      return error(ExchangeErrc::kResponseCut);
    }
    return {};
  }
  void resume() {
    if (call_->deferred) {
      call_->deferred = false;
      nghttp2_session_resume_data(s_.session, call_->id);
    }
    s_.writer_wake.set();
  }

  std::shared_ptr<Http2Session> owner_;
  Http2Session::Impl& s_;
  std::shared_ptr<Call> call_;
  ExchangeTimeouts timeouts_;
  bool head_request_ = false;
};

}  // namespace

Http2Session::Http2Session(Stream stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = std::move(stream);
}

Http2Session::~Http2Session() = default;

bool Http2Session::usable() const { return !impl_->broken && !impl_->goaway; }

void Http2Session::close() {
  impl_->broken = true;
  (void)impl_->stream.shutdown(TcpStream::Shutdown::kBoth);
  impl_->writer_wake.set();
}

std::shared_ptr<Http2Session> Http2Session::start(Stream stream) {
  std::shared_ptr<Http2Session> self(new Http2Session(std::move(stream)));
  Impl& s = *self->impl_;
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_header_callback(cb, &Guarded<&on_header>::call);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, &Guarded<&on_frame_recv>::call);
  nghttp2_session_callbacks_set_on_frame_send_callback(cb, &Guarded<&on_frame_send>::call);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, &Guarded<&on_data>::call);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, &Guarded<&on_close>::call);
  nghttp2_option* option = nullptr;
  nghttp2_option_new(&option);
  nghttp2_option_set_no_auto_window_update(option, 1);
  nghttp2_session_client_new3(&s.session, cb, &s, option, block_memory());
  nghttp2_option_del(option);
  nghttp2_session_callbacks_del(cb);
  nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                       {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kStreamWindow}};
  nghttp2_submit_settings(s.session, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_session_set_local_window_size(s.session, NGHTTP2_FLAG_NONE, 0, kConnectionWindow);
  spawn([self] { self->impl_->read_loop(); }).detach();
  spawn([self] { self->impl_->write_loop(); }).detach();
  return self;
}

void Http2Session::Impl::read_loop() {
  std::vector<char> buffer(16 * 1024);  // on the heap: fiber stacks are small
  while (!broken) {
    auto n = stream.read(buffer);
    if (!n || *n == 0) break;
    if (nghttp2_session_mem_recv(session, reinterpret_cast<const std::uint8_t*>(buffer.data()),
                                 *n) < 0) {
      break;
    }
    writer_wake.set();
    if (!nghttp2_session_want_read(session) && !nghttp2_session_want_write(session)) break;
  }
  broken = true;
  fail_all();
  writer_wake.set();
  (void)stream.shutdown(TcpStream::Shutdown::kWrite);  // the server may be waiting for our FIN
}

void Http2Session::Impl::write_loop() {
  std::string out;
  while (!broken || nghttp2_session_want_write(session)) {
    auto sent = send_frames(session, stream, out, Deadline::after(std::chrono::seconds(30)));
    if (sent == FramesSent::kSent) continue;
    if (sent == FramesSent::kFailed) {
      broken = true;
      (void)stream.shutdown(TcpStream::Shutdown::kBoth);
      break;
    }
    if (broken || this_fiber::stop_requested()) break;
    wait_for_frames(writer_wake);
  }
}

Result<std::unique_ptr<ClientExchange>> Http2Session::open(const ClientRequestHead& head,
                                                           std::string_view authority,
                                                           const ExchangeTimeouts& timeouts) {
  Impl& s = *impl_;
  if (!usable()) return fail(error(ExchangeErrc::kClosedBeforeWrite));
  // Names and values made here; a deque, as nghttp2_nv points into them (no reallocation).
  std::deque<std::string> storage;
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
  add(":method", head.method);
  add(":scheme", s.stream.tls() != nullptr ? "https" : "http");
  add(":authority", authority);
  add(":path", head.target);
  NominatedFields nominated(head.headers);
  for (const Field& f : head.headers) {
    if (client_managed(nominated, f.name)) continue;
    // TE is hop-by-hop, but "TE: trailers" must reach an HTTP/2 peer (gRPC asks for it).
    add(ascii_lower(f.name), f.value);
  }
  if (head.headers.has_token("te", "trailers")) add("te", "trailers");
  if (head.content_length) add("content-length", std::to_string(*head.content_length));
  bool has_body = head.chunked || head.content_length.value_or(0) > 0;
  auto call = std::make_shared<Call>();
  nghttp2_data_provider provider{};
  provider.source.ptr = call.get();
  provider.read_callback = &read_body;
  std::int32_t id = nghttp2_submit_request(s.session, nullptr, nv.data(), nv.size(),
                                           has_body ? &provider : nullptr, nullptr);
  if (id < 0) {
    s.goaway = true;  // out of stream ids, or the session is going: no new streams on it
    return fail(error(ExchangeErrc::kClosedBeforeWrite));
  }
  call->id = id;
  s.calls[id] = call;  // the session keeps it (and its body) until the stream closes
  s.writer_wake.set();
  auto exchange =
      std::make_unique<Http2Exchange>(shared_from_this(), s, std::move(call), timeouts, has_body);
  if (head.method == "HEAD") exchange->set_head_request();
  return std::unique_ptr<ClientExchange>(std::move(exchange));
}

}  // namespace spindle::http::detail
