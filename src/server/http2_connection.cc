// An HTTP/2 connection of HttpServer (http2_connection.h says how its fibers share it): the
// session's events, each stream's handler, the reader and the connection's lifecycle.
#include "http2_connection.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "response_head.h"
#include "spindle/base/log.h"
#include "spindle/fiber/buffer_pool.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/http/canonical.h"
#include "spindle/http/release.h"

namespace spindle::http::detail {

using h2::ErrorCode;

namespace {

// How long an idle connection waits for its next frame before it parks (ends its fibers).
constexpr auto kParkAfter = std::chrono::milliseconds(10);

// How long a draining connection waits for the answer to its shutdown PING before the final
// GOAWAY, and that PING's payload.
constexpr auto kShutdownNoticeTime = std::chrono::seconds(1);
constexpr std::uint8_t kShutdownPing[8] = {'s', 'h', 'u', 't', 'd', 'o', 'w', 'n'};

std::span<const std::uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

}  // namespace

std::size_t H2Stream::take_body(char* buffer, std::size_t n) {
  n = std::min(n, body_in.size());
  std::memcpy(buffer, body_in.view().data(), n);
  body_in.consume(n);
  conn.session().consumed(id, n);  // WINDOW_UPDATE, in batches
  conn.wake_writer();
  return n;
}

std::size_t H2Stream::read(std::span<char> buffer) {
  const ServerOptions& options = conn.options();
  for (;;) {
    if (body_too_large) throw HttpError(413, "body too large");
    if (!body_in.empty()) return take_body(buffer.data(), buffer.size());
    if (body_done || buffer.empty()) return 0;
    if (closed) throw HttpError(400, "stream reset");
    body_event.reset();
    if (auto ec = body_event.wait(Deadline::after(options.body_timeout))) {
      if (ec == std::errc::timed_out) throw HttpError(408, "request body too slow");
      throw HttpError(400, "connection closed");
    }
  }
}

// ---- the session's events ---------------------------------------------------------------

void Http2Connection::on_field(std::uint32_t id, const Field& field) {
  const auto& [name, value, token] = field;
  H2Stream* s = find(id);
  if (s == nullptr || s->head_complete) return;  // trailers of a request: not kept
  // The decoded size counts (an HPACK bomb is small on the wire, large here).
  s->header_bytes += name.size() + value.size() + 32;
  const ParserLimits& limits = options().parser;
  if (s->header_bytes > limits.max_head || s->head.headers.size() >= limits.max_headers) {
    s->refuse(431);
    return;
  }
  if (s->early_status != 0) return;
  if (name.front() != ':') {
    s->head.headers.add_lower_case(field);
  } else if (token == &token::kMethod) {
    s->method = value;
  } else if (token == &token::kPath) {
    s->path = value;
  } else if (token == &token::kAuthority) {
    s->authority = value;
  } else if (token == &token::kScheme) {
    s->scheme = value;
  } else if (token == &token::kProtocol) {
    s->protocol = value;  // the session lets it through with CONNECT only (RFC 8441 §4)
  }
}

void Http2Connection::on_never_indexed(std::uint32_t id, const Field& field) {
  // A credential goes on never indexed whatever the client said (the token table marks it);
  // any other field it sent so makes the whole request go on so (RFC 7541 §6.2.3).
  if (field.token != nullptr && (field.token->flags & field_flag::kSensitive) != 0) return;
  H2Stream* s = find(id);
  if (s != nullptr && !s->head_complete) s->head.headers.mark_never_indexed();
}

void Http2Connection::on_headers(std::uint32_t id, bool end_stream, bool trailers) {
  H2Stream* s = find(id);
  if (trailers) {
    if (s != nullptr) {
      s->body_done = true;  // trailers end the body (they are not passed on)
      s->body_event.set();
    }
    return;
  }
  if (s == nullptr) return;
  s->head_complete = true;
  if (end_stream) s->body_done = true;
  start_handler(*s);
}

bool Http2Connection::on_head_too_large(std::uint32_t id, bool /*end_stream*/) {
  H2Stream* s = find(id);
  if (s == nullptr) return false;
  s->refuse(431);
  return true;
}

void Http2Connection::on_data(std::uint32_t id, std::span<const std::uint8_t> data,
                              bool end_stream) {
  H2Stream* s = find(id);
  if (s == nullptr || s->handler_done || s->body_too_large) {
    session_.consumed(id, data.size());  // nobody reads it: let more come
  } else {
    s->body_received += data.size();
    if (s->body_received > options().max_body && !s->tunnel) {
      s->body_too_large = true;
      session_.consumed(id, data.size());
    } else {
      s->body_in.append({reinterpret_cast<const char*>(data.data()), data.size()});
    }
  }
  if (s != nullptr) {
    if (end_stream) s->body_done = true;
    s->body_event.set();
  }
}

void Http2Connection::on_reset(std::uint32_t id, ErrorCode /*code*/) {
  H2Stream* found = find(id);
  if (found == nullptr) return;
  H2Stream& s = *found;
  const bool running = s.handler_started && !s.handler_done;
  s.closed = true;
  s.body_event.set();
  s.out_event.set();
  if (running && s.on_gone) {
    // The client reset the stream while its handler runs: tell it, from a fiber of its own
    // (nothing may wait inside the session's callback).
    spawn([gone = std::move(s.on_gone)]() mutable { gone(); }).detach();
  }
  forget(s);  // the handler, if it still runs, keeps its own reference
  if (running) note_costly_reset();
}

void Http2Connection::on_window(std::uint32_t /*id*/) {
  if (!sending_.empty()) wake_writer();
}

void Http2Connection::on_ping_ack(std::span<const std::uint8_t, 8> payload) {
  if (notice_sent_ && std::memcmp(payload.data(), kShutdownPing, 8) == 0) {
    shut_down(true);  // the client has heard the notice: the final GOAWAY
  }
}

// ---- the connection ---------------------------------------------------------------------

namespace {

h2::SessionLimits session_limits(const ServerOptions& options) {
  const ServerOptions::Http2Limits& h = options.http2_limits;
  h2::SessionLimits limits;
  limits.max_concurrent_streams = h.max_concurrent_streams;
  limits.stream_window = h.stream_window;
  limits.connection_window = h.connection_window;
  limits.max_header_list_size = static_cast<std::uint32_t>(options.parser.max_head);
  limits.max_header_block = std::max<std::size_t>(options.parser.max_head, 65536) + 16384;
  limits.max_continuations = h.max_header_frames;
  limits.reset_budget = h.reset_budget;
  limits.empty_frame_budget = h.empty_frame_budget;
  limits.settings_budget = h.settings_budget;
  limits.max_output = h.max_unread_output;
  // RFC 8441: WebSockets (and other upgrades a route allows) by extended CONNECT.
  limits.enable_connect_protocol = true;
  return limits;
}

}  // namespace

Http2Connection::Http2Connection(ConnectionState& state)
    : state_(state),
      stream_(state.stream),
      shared_(*state.shared),
      worker_(*state.worker),
      session_(session_limits(shared_.options), *this),
      fields_(worker_.head_fields),
      names_(worker_.head_names),
      costly_resets_(static_cast<double>(shared_.options.http2_limits.running_reset_burst),
                     static_cast<double>(shared_.options.http2_limits.running_resets_per_second)) {
  worker_.http2.push_back(this);
}

Http2Connection::~Http2Connection() { std::erase(worker_.http2, this); }

H2Stream& Http2Connection::open_stream(std::uint32_t id) {
  auto s = StreamRef::adopt(new H2Stream(*this, id));
  s->open_index = open_.size();
  open_.push_back(std::move(s));
  last_found_ = open_.back().get();
  return *last_found_;
}

H2Stream* Http2Connection::find(std::uint32_t id) {
  if (last_found_ != nullptr && last_found_->id == id) return last_found_;
  for (auto& s : open_) {
    if (s->id == id) return last_found_ = s.get();
  }
  return nullptr;
}

void Http2Connection::forget(H2Stream& s) {
  std::size_t i = s.open_index;
  if (i >= open_.size() || open_[i].get() != &s) return;  // forgotten already
  if (last_found_ == &s) last_found_ = nullptr;
  if (s.sending) {
    s.sending = false;
    std::erase(sending_, &s);
  }
  // A handler that never ran never will: nobody reads what the stream received. (One that
  // ran gives back what it left when it ends: end_handler.) Before `s` leaves open_, which may
  // hold its last reference.
  if (!s.handler_started) give_back_unread(s);
  s.open_index = std::numeric_limits<std::size_t>::max();
  if (i + 1 != open_.size()) {
    open_[i] = std::move(open_.back());
    open_[i]->open_index = i;
  }
  open_.pop_back();  // the last reference unless the handler still runs
  if ((goaway_sent_ || session_.closing()) && open_.empty()) stop_reader();
  nudge_reader();
}

void Http2Connection::forget_if_done(H2Stream& s) {
  if (s.handler_done && (s.output_done || s.closed)) forget(s);
}

const RequestContext& Http2Connection::request_context() { return state_.request_context(2); }

void Http2Connection::start_handler(H2Stream& s) {
  s.head.method = s.method;
  s.head.minor_version = 1;
  if (!s.protocol.empty()) {
    // Extended CONNECT: the handler sees a CONNECT to a path, with the protocol it asks for.
    s.head.protocol = s.protocol;
    s.tunnel = true;
  }
  FramingFields framing = collect_framing_fields(s.head.headers);
  if (framing.content_length_invalid) s.refuse(400);
  s.head.content_length = framing.content_length;
  // A body without a Content-Length: its length is known only at END_STREAM, as a chunked
  // one's is on HTTP/1.1 (what `chunked` tells a handler, and a proxy that forwards it).
  s.head.chunked = !s.body_done && !framing.content_length;
  // Refused from its HEADERS alone, as HTTP/1.1 does: no handler asks for a body that size.
  if (framing.content_length && *framing.content_length > shared_.options.max_body) {
    s.refuse(413);
  }
  // A plain CONNECT names where to, not a path (RFC 9113 8.5); otherwise :path is origin-form
  // or '*' (8.3.1). Then the request is made canonical as an HTTP/1.1 one is: the method, the
  // path, :authority against Host (RFC 9113 8.3.1: a Host naming another entity is malformed),
  // the fields (cookie pairs sent as separate fields become one, 8.2.3).
  const bool tunnel = s.method == "CONNECT" && s.protocol.empty();
  std::string& target = tunnel ? s.authority : s.path;
  if (!tunnel && (s.path.empty() || (s.path.front() != '/' && s.path != "*"))) s.refuse(400);
  s.head.target = target;
  s.head.authority = s.authority;
  if (s.early_status == 0 && canonicalize_request(s.head, target.data(), shared_.options.paths)) {
    s.refuse(400);
  }
  due_.push_back(open_[s.open_index]);
}

void Http2Connection::start_due_handlers() {
  if (due_.empty()) return;
  // A session that failed is ending (a protocol error, a flood): nothing more runs.
  const bool ending = session_.failed();
  for (StreamRef& due : due_) {
    H2Stream& s = *due;
    if (s.closed || ending) {
      forget(s);  // reset (or ended) before it could start: nothing ran
      continue;
    }
    if (s.id > goaway_last_id_) {
      refuse_stream(s);
      continue;
    }
    start_one(std::move(due));
  }
  due_.clear();
  wake_writer();
}

void Http2Connection::refuse_stream(H2Stream& s) {
  session_.reset(s.id, ErrorCode::kRefusedStream);
  s.closed = true;
  forget(s);
}

void Http2Connection::start_one(StreamRef stream) {
  last_started_id_ = std::max(last_started_id_, stream->id);
  // max_requests_per_connection, as nginx's keepalive_requests does on HTTP/2: the last
  // request allowed runs, GOAWAY names it, and the streams after it are refused unprocessed
  // (start_due_handlers), for the client to send again on another connection.
  if (const std::size_t most = options().max_requests_per_connection;
      most != 0 && ++state_.requests >= most && !goaway_sent_) {
    goaway_sent_ = true;
    goaway_last_id_ = stream->id;
    session_.goaway(ErrorCode::kNoError, stream->id);
  }
  runnable_.push_back(std::move(stream));
  if (runners_starting_ == 0) start_runner();
}

void Http2Connection::start_runner() {
  ++runners_starting_;
  handlers_.add();
  auto runner = spawn([this] { run_handlers(); },
                      SpawnOptions{.stack_size = shared_.options.tcp.stack_size, .run_next = true});
  if (!runner.finished()) {
    runner.detach();
    return;
  }
  --runners_starting_;
  handlers_.done();
  try {
    runner.join();
  } catch (...) {
    // The worker logged why.
  }
  // No fiber for them: refused, so the client may send them again, here later or elsewhere.
  // (A fiber busy with an earlier handler may wait long: they do not wait for it.)
  for (; runnable_head_ < runnable_.size(); ++runnable_head_) {
    H2Stream& s = *runnable_[runnable_head_];
    if (!s.closed) refuse_stream(s);
  }
  runnable_.clear();
  runnable_head_ = 0;
  wake_writer();
}

void Http2Connection::run_handlers() {
  --runners_starting_;
  struct Done {
    Http2Connection& connection;
    ~Done() {
      connection.nudge_reader();  // (it runs once this fiber is gone)
      connection.handlers_.done();
    }
  } done{*this};
  // Should a handler park while others wait behind it, another fiber starts for them then,
  // next in the worker's queue, so that the streams of one read still start together (a
  // fiber that waited its turn behind every other connection's would spread them over rounds,
  // and the answers with them). Handlers that do not park share this one fiber.
  auto stand_by = [](void* self) {
    auto& connection = *static_cast<Http2Connection*>(self);
    if (connection.runnable_head_ < connection.runnable_.size() &&
        connection.runners_starting_ == 0) {
      connection.start_runner();
    }
  };
  while (runnable_head_ < runnable_.size()) {
    StreamRef s = std::move(runnable_[runnable_head_++]);
    if (runnable_head_ == runnable_.size()) {
      runnable_.clear();
      runnable_head_ = 0;
    }
    if (s->closed) continue;  // reset (or the connection ended) before its handler ran
    s->handler_started = true;
    spindle::detail::on_next_suspend(stand_by, this);
    handle(std::move(s));
  }
  spindle::detail::on_next_suspend(nullptr, nullptr);
}

void Http2Connection::handle(StreamRef s) {
  // Whatever happens here, the connection learns that this handler is done.
  struct Done {
    Http2Connection& connection;
    H2Stream& stream;
    ~Done() { connection.end_handler(stream); }
  } done{*this, *s};
  try {
    // The clock is read only for the access log's duration.
    auto started = shared_.options.access_log ? Clock::now() : Clock::time_point();
    const bool head_only = s->head.method == "HEAD";
    // The response is made in place (a Response is several KiB: no move of it).
    std::optional<Request> request;
    if (s->early_status == 0) {
      request.emplace(s->head, *s);
      request->set_context_source(this);
      request->set_client_gone_slot(&s->on_gone);
      request->set_interim_sink(s.get());
    }
    Response response =
        request ? call_router(shared_.router, *request) : Response::error(s->early_status);
    if (shared_.options.access_log) {
      log_access(
          *s, response, started,
          request ? request->attributes() : std::span<const std::pair<std::string, std::string>>());
    }
    if (!s->closed) submit_response(*s, response, head_only);
  } catch (...) {
    // Only the server's own code can get here (call_router catches the handler's exceptions):
    // the stream ends, the connection goes on.
    log_error("HTTP/2 stream {} of {} {} failed", s->id, s->method, s->path);
    if (!s->closed) reset_stream(*s, ErrorCode::kInternalError);
  }
}

void Http2Connection::end_handler(H2Stream& s) noexcept {
  s.handler_done = true;
  give_back_unread(s);  // what the handler left unread: the client may send the rest
  forget_if_done(s);
  wake_writer();
}

void Http2Connection::give_back_unread(H2Stream& s) {
  if (std::size_t unread = s.body_in.size(); unread > 0) {
    session_.consumed(s.id, unread);
    s.body_in.clear();
    wake_writer();
  }
}

Deadline Http2Connection::head_deadline() {
  if (!session_.head_pending()) {
    head_started_ = {};
    return Deadline::never();
  }
  if (head_started_ == Clock::time_point{}) head_started_ = Clock::now();
  return Deadline::at(head_started_ + shared_.options.header_timeout);
}

void Http2Connection::head_too_slow() {
  if (!goaway_sent_) {
    goaway_sent_ = true;
    goaway_last_id_ = last_started_id_;
    session_.goaway(ErrorCode::kNoError, last_started_id_, "request header too slow");
  }
  wake_writer();
}

void Http2Connection::reset_stream(H2Stream& s, ErrorCode code) {
  session_.reset(s.id, code);
  s.closed = true;
  s.body_event.set();
  s.out_event.set();
  wake_writer();
}

void Http2Connection::refuse() {
  session_.goaway(ErrorCode::kInternalError, "no fiber could start");
  (void)stream_.write_all(session_.take_output(), Deadline::after(shared_.options.write_timeout));
}

void refuse_http2(ConnectionState& state) { state.http2->refuse(); }

void Http2Connection::stop_reader() {
  if (reader_ != nullptr) reader_->request_stop();
}

void Http2Connection::note_costly_reset() {
  if (costly_resets_.take(coarse_now()) || goaway_sent_) return;
  goaway_sent_ = true;
  goaway_last_id_ = last_started_id_;
  session_.goaway(ErrorCode::kEnhanceYourCalm, last_started_id_);
  wake_writer();
}

void Http2Connection::shut_down(bool at_once) {
  if (reader_ == nullptr) {
    wake_idle(state_);  // idle: its next activation sees the server draining
    return;
  }
  if (goaway_sent_) return;
  if (!at_once) {
    if (notice_sent_) return;  // the final GOAWAY comes with the PING's answer
    // RFC 9113 6.8: announce first, and learn by a PING when the client has heard it.
    notice_sent_ = true;
    notice_deadline_ = Deadline::after(kShutdownNoticeTime);
    session_.shutdown_notice(kShutdownPing);
    wake_writer();
    return;
  }
  goaway_sent_ = true;
  goaway_last_id_ = session_.last_stream_id();
  session_.goaway(ErrorCode::kNoError);
  wake_writer();
  if (open_.empty()) stop_reader();
}

// ---- the reader -------------------------------------------------------------------------

Activation Http2Connection::run(std::string_view preread, const Http2Upgrade* upgrade) {
  reader_ = current_fiber();
  auto writer = spawn([this] { write_loop(); });
  // Whatever happens below, the writer and the handlers point at this connection: they end
  // before it closes (or parks).
  struct Finish {
    Http2Connection& connection;
    JoinHandle<void>& writer;
    bool parked = false;
    ~Finish() {
      if (!parked) connection.finish(writer);
    }
  } finish{*this, writer};
  if (writer.finished()) {  // no fiber for the writer (no stack): the worker logged why
    refuse();
    return Activation::kClose;
  }
  if (state_.idle_expired) shut_down(true);  // idle too long: GOAWAY, then close
  if (!read_loop(preread, upgrade)) return Activation::kClose;
  finish.parked = park(writer);
  return finish.parked ? Activation::kIdle : Activation::kClose;
}

bool Http2Connection::may_park() {
  // (Not with a head half-read: its timeout runs in the reader's wait.)
  return open_.empty() && due_.empty() && !notice_sent_ && !goaway_sent_ && !session_.closing() &&
         handlers_.count() == 0 && stream_.drained() && !session_.head_pending();
}

bool Http2Connection::park(JoinHandle<void>& writer) {
  parking_ = true;
  wake_writer();
  try {
    writer.join();
  } catch (...) {
    writer_failed_ = true;  // (it cannot throw: write_loop catches nothing and throws nothing)
  }
  parking_ = false;
  if (writer_failed_ || session_.failed()) return false;
  reader_ = nullptr;
  writer_wake_.reset();
  // What an activation grows, the next one grows again: an idle connection holds its
  // session's state alone.
  session_.trim();
  release(open_);
  release(sending_);
  release(due_);
  release(out_);
  release(file_chunk_);
  next_sender_ = 0;
  last_found_ = nullptr;
  return true;
}

bool Http2Connection::read_loop(std::string_view preread, const Http2Upgrade* upgrade) {
  bool ok = true;
  if (upgrade != nullptr) {
    // Stream 1 is the HTTP/1.1 request that asked for h2c; it is answered over HTTP/2.
    ok = session_.upgrade(bytes_of(upgrade->settings));
    if (ok) {
      H2Stream& s = open_stream(1);
      s.method = upgrade->head->method;
      s.path = upgrade->head->target;
      // Connection names HTTP2-Settings: it goes with the hop-by-hop fields.
      for_each_end_to_end(upgrade->head->headers, [&](const Field& f) { s.head.headers.add(f); });
      s.body_in.assign(upgrade->body);
      s.body_done = true;
      s.head_complete = true;
      start_handler(s);
    }
  }
  if (ok && !preread.empty()) ok = session_.receive(bytes_of(preread));
  if (ok) start_due_handlers();
  // The read buffer is the worker's (16 KiB), held only while the connection is busy: idle (no
  // stream open, nothing left to read), it goes back to the pool while the connection waits.
  BufferPool::Buffer buffer;
  while (ok && !writer_failed_) {
    reader_wake_.reset();  // what happens from here on is seen below, or wakes the wait
    wake_writer();
    if (shared_.draining.load(std::memory_order_acquire)) shut_down();
    if ((goaway_sent_ || session_.closing()) && open_.empty()) break;
    // A request head begun must be whole within the header timeout (a slowloris, or a client
    // that holds a block's memory).
    const Deadline head = head_deadline();
    if (head.expired(coarse_now())) {
      head_too_slow();
      break;
    }
    if (stream_.drained()) {
      // Nothing to read now: wait for bytes, or for the last stream to end (the connection
      // may be idle then). Idle with nothing running, it parks if nothing comes for a moment:
      // under load the next request is on its way, and parking (the writer ends, the buffers
      // go) then waking again costs more than the wait. Idle otherwise, the keep-alive timeout
      // applies, then GOAWAY (not while a shutdown notice waits for its PING: the writer ends
      // that wait).
      const bool idle = open_.empty();
      const bool parkable = may_park();
      if (idle) buffer = {};
      Deadline deadline = parkable ? Deadline::after_coarse(kParkAfter)
                          : idle && !notice_sent_
                              ? Deadline::after(shared_.options.keepalive_timeout)
                              : Deadline::never();
      stream_.on_readable(&Http2Connection::on_bytes, this);
      auto waited = reader_wake_.wait(earliest(deadline, head));
      stream_.cancel_on_readable();
      if (waited == std::errc::timed_out && parkable) {
        if (may_park()) return true;
        continue;
      }
      if (waited == std::errc::timed_out && head.expired()) {
        head_too_slow();
        break;
      }
      if (waited) {
        // Idle too long: GOAWAY (which, with no stream open, also stops the reader).
        if (waited == std::errc::timed_out && open_.empty()) shut_down(true);
        break;  // stopped (cancelled), or timed out idle
      }
      if (stream_.drained()) continue;  // woken by a stream's end, not by bytes
    }
    if (buffer.data() == nullptr) buffer = take_buffer();
    // Bytes are there (or the reactor said so): a read that finds none instead notes the
    // stream drained (a TLS record cut short included) and comes back here to wait as above.
    // (TLS may need to wait for the socket to take its own bytes first: then the read waits
    // as a write does, within the write timeout.)
    auto n = stream_.read(buffer.span(), Deadline::no_wait());
    if (!n && n.error() == std::errc::timed_out) {
      if (stream_.drained()) continue;
      n = stream_.read(buffer.span(), Deadline::after(shared_.options.write_timeout));
    }
    if (!n || *n == 0) break;  // the connection failed, was stopped, or the client closed it
    ok = session_.receive(bytes_of({buffer.data(), *n}));
    start_due_handlers();
  }
  due_.clear();  // a read that failed: what it opened never starts
  wake_writer();
  return false;
}

void Http2Connection::finish(JoinHandle<void>& writer) noexcept {
  // Every stream is closed for its handler, the handlers finish, the writer sends what is
  // left (a GOAWAY the session queued, say) and stops.
  stopping_ = true;
  for (auto& s : open_) {
    s->closed = true;
    s->body_event.set();
    s->out_event.set();
  }
  // Not cancellable: this fiber may have been asked to stop, and the handlers must be gone
  // before the connection is (they are cancelled too when the runtime stops).
  (void)handlers_.wait(Deadline::never(), kNotCancellable);
  wake_writer();
  try {
    if (writer.joinable()) writer.join();
  } catch (...) {
    writer_failed_ = true;  // it never started
  }
  reader_ = nullptr;
  if (!writer_failed_) linger();
}

void Http2Connection::linger() {
  // Closing a socket with unread bytes (a client's PING or TLS alert after its GOAWAY) makes
  // the kernel send a reset, which can destroy our last frames in flight: half-close, then
  // read and drop what still comes, for a moment. On a fresh fiber: this one may have been
  // asked to stop, which would end any wait at once. (Without a stack for it, no lingering.)
  try {
    spawn([this] { stream_.linger(Deadline::after(std::chrono::seconds(1))); }).join();
  } catch (...) {
  }
}

Activation serve_http2(ConnectionState& state, std::string_view preread,
                       const Http2Upgrade* upgrade) {
  if (!state.http2) state.http2.reset(new Http2Connection(state));
  return state.http2->run(preread, upgrade);
}

void Http2Deleter::operator()(Http2Connection* connection) const noexcept { delete connection; }

void shut_down_http2(WorkerState& worker) {
  for (Http2Connection* c : std::vector<Http2Connection*>(worker.http2)) c->shut_down();
}

}  // namespace spindle::http::detail
