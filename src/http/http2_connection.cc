// The HTTP/2 driver of HttpServer: libnghttp2 does the protocol through
// nghttp2_session_mem_recv / mem_send (no I/O of its own); this file moves the bytes and runs
// each stream's handler on its own fiber with the same Request/Response/router as HTTP/1.1.
//
// One connection is three kinds of fiber on one worker: the reader (the connection's fiber:
// socket -> mem_recv, which calls back to create streams and hand them body bytes), the
// writer (mem_send -> socket, woken whenever there is something to send) and one handler per
// stream. They never run at once (one worker), so the session needs no lock; none of them
// parks inside an nghttp2 call.
#include <nghttp2/nghttp2.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "http2_frames.h"
#include "response_head.h"
#include "server_internal.h"
#include "spindle/base/ascii.h"
#include "spindle/base/log.h"
#include "spindle/fiber/block_cache.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/http/status.h"
#include "spindle/sync/event.h"

namespace spindle::http::detail {
namespace {

// Per-stream receive window: what a client may send ahead of the handler reading it.
constexpr std::int32_t kStreamWindow = 256 * 1024;
// Connection receive window.
constexpr std::int32_t kConnectionWindow = 4 << 20;
// Streams a client may have open at once.
constexpr std::uint32_t kMaxConcurrentStreams = 100;
// A streamed response body waits for the writer beyond this many buffered bytes.
constexpr std::size_t kStreamedHighWater = 64 * 1024;
// CONTINUATION frames accepted for one header block (a flood of tiny ones is an attack).
constexpr int kMaxContinuations = 32;
// Resets a connection may make at once, and per second after that: of any stream, and of
// streams whose handler had started (each may have cost an upstream request).
constexpr double kResetBurst = 1000;
constexpr double kResetsPerSecond = 33;
constexpr double kCostlyResetBurst = 100;
constexpr double kCostlyResetsPerSecond = 5;

// A budget of events: `burst` at once, refilled at `rate` per second.
class TokenBucket {
 public:
  TokenBucket(double burst, double rate) : burst_(burst), rate_(rate), tokens_(burst) {}
  /// Takes one token; false if none was left.
  bool take(Clock::time_point now) {
    if (refilled_ != Clock::time_point{}) {
      double seconds = std::chrono::duration<double>(now - refilled_).count();
      tokens_ = std::min(burst_, tokens_ + seconds * rate_);
    }
    refilled_ = now;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }

 private:
  double burst_, rate_, tokens_;
  Clock::time_point refilled_{};
};
// How long a draining connection waits for the answer to its shutdown PING before the final
// GOAWAY, and that PING's payload.
constexpr auto kShutdownNoticeTime = std::chrono::seconds(1);
constexpr std::uint8_t kShutdownPing[8] = {'s', 'h', 'u', 't', 'd', 'o', 'w', 'n'};

class H2Stream;

}  // namespace

class Http2Connection final : public ContextSource {
 public:
  Http2Connection(Stream& stream, HttpServer::Shared& shared, WorkerState& worker);
  ~Http2Connection();

  /// Serves the connection until it ends (never throws past the point where fibers point at
  /// it: they are all gone when it returns or throws).
  void run(std::string_view preread, const Http2Upgrade* upgrade);
  /// Draining: the client is told the connection ends (a GOAWAY that refuses nothing yet,
  /// and a PING); once the PING comes back, every stream it opened before it knew has
  /// arrived, and the final GOAWAY names the last one. The connection ends once its streams
  /// are done. `at_once`: the final GOAWAY now (an idle connection's timeout).
  void shut_down(bool at_once = false);

  // Used by the streams and the nghttp2 callbacks.
  nghttp2_session* session() { return session_; }
  const ServerOptions& options() const { return shared_.options; }
  /// Wakes the writer (there may be frames to send).
  void wake_writer() { writer_wake_.set(); }

 private:
  friend class H2Stream;
  friend struct Callbacks;

  /// Sends what nghttp2 has, until it has nothing more; ends on a write error.
  void write_loop();
  /// Creates the stream for a request whose headers begin (nullptr if nghttp2 has no such
  /// stream).
  H2Stream* open_stream(std::int32_t id);
  /// Our stream for nghttp2's `id` (nghttp2 keeps the pointer), or nullptr.
  H2Stream* find(std::int32_t id);
  /// nghttp2 closed `s`: it leaves open_.
  void forget(H2Stream& s);
  /// The request's headers are complete: its handler is due to start once the bytes read so
  /// far are all processed (start_due_handlers).
  void start_handler(H2Stream& s);
  /// After a read is processed: starts the handlers of the streams that are still open,
  /// unless the session is ending or a GOAWAY sent excludes them. A stream reset in the same
  /// read as its HEADERS costs no fiber and never reaches a handler (or an upstream).
  void start_due_handlers();
  /// Starts the handler of one stream on a fiber of its own (refused if none can be had).
  void start_one(std::shared_ptr<H2Stream> stream);
  /// The client reset a stream: counted against the reset budgets (Rapid Reset,
  /// CVE-2023-44487), one for all resets and a smaller one for resets of streams whose handler
  /// runs (`costly`: each may have cost an upstream request); past either, GOAWAY
  /// ENHANCE_YOUR_CALM, and no stream above the last started one runs.
  void note_reset(bool costly);
  /// Sends GOAWAY with `code`, promising no stream above the last whose handler started.
  void refuse_further_streams(std::uint32_t code);
  /// Runs the handler of `s` and submits its response.
  void handle(std::shared_ptr<H2Stream> s);
  /// Submits the head of `response` for `s` (and its body, streaming it if it has a producer).
  void submit_response(H2Stream& s, Response& response, bool head_only);
  /// Runs a tunnel on stream `s` once its 2xx head went (an extended CONNECT, RFC 8441).
  void run_tunnel(H2Stream& s, const ConnectionTakeover& takeover);
  /// Runs a streamed body's producer into the stream's buffer; a producer that throws resets
  /// the stream (its head is gone: nothing else can tell the client).
  void stream_response(H2Stream& s, const BodyProducer& producer,
                       std::optional<std::uint64_t> length);
  /// Records the request in the access log.
  void log_access(H2Stream& s, const Response& response, Clock::time_point started,
                  std::span<const std::pair<std::string, std::string>> attributes);
  /// Ends the reader (a stop request wakes it from its read).
  void stop_reader();
  /// The reader's loop: socket -> nghttp2 (the h2c upgrade's stream 1 and `preread` first).
  void read_loop(std::string_view preread, const Http2Upgrade* upgrade);
  /// After the reader: closes the streams for their handlers, waits for them and the writer.
  void finish(JoinHandle<void>& writer) noexcept;
  /// A handler is done (its fiber ends): drops what it left unread, uncounts it.
  void end_handler(H2Stream& s) noexcept;
  /// Closes gently: half-close, then drop what the client still sends, briefly.
  void linger();

  Stream& stream_;
  HttpServer::Shared& shared_;
  WorkerState& worker_;
  nghttp2_session* session_ = nullptr;
  /// The open streams (nghttp2 has not closed them), in no order; each knows its index here.
  std::vector<std::shared_ptr<H2Stream>> open_;
  /// Response fields being submitted: reused, as one handler at a time builds them (it does not
  /// park until nghttp2 has copied them).
  std::vector<nghttp2_nv> nv_;
  std::string nv_names_;
  /// Handler fibers still running.
  WaitGroup handlers_;
  Event writer_wake_;
  bool writer_failed_ = false;
  /// Set when the reader is done: the writer sends what is left and ends.
  bool stopping_ = false;
  /// Set once GOAWAY went out (draining or idle): the reader ends when no stream is open.
  bool goaway_sent_ = false;
  /// Set once the shutdown notice went out (draining); the final GOAWAY follows at the PING's
  /// answer or at the deadline.
  bool notice_sent_ = false;
  Deadline notice_deadline_;
  int continuations_ = 0;
  /// Streams whose HEADERS are complete, waiting for the read to be processed.
  std::vector<std::shared_ptr<H2Stream>> due_;
  /// The highest stream whose handler started, and the highest a GOAWAY sent allows.
  std::int32_t last_started_id_ = 0;
  std::int32_t goaway_last_id_ = std::numeric_limits<std::int32_t>::max();
  /// The reset budgets (note_reset).
  TokenBucket resets_{kResetBurst, kResetsPerSecond};
  TokenBucket costly_resets_{kCostlyResetBurst, kCostlyResetsPerSecond};
  /// The highest stream id the client has opened, and the streams closed while the client was
  /// still sending on them (it may yet send their trailers: those HEADERS are not an error).
  std::int32_t last_stream_id_ = 0;
  std::deque<std::int32_t> closed_early_;
  Fiber* reader_ = nullptr;
  std::string remote_;
  /// See context(); `local_` is what context_.local points to.
  RequestContext context_;
  std::optional<Address> peer_, local_;

 public:
  /// The request context: the connection's facts (once) and the time now.
  const RequestContext& request_context() override;
};

namespace {

// One request/response exchange. Shared by the connection's map (until nghttp2 closes the
// stream) and its handler fiber (until the handler is done).
class H2Stream final : public BodySource, public InterimSink {
 public:
  H2Stream(Http2Connection& c, std::int32_t stream_id) : conn(c), id(stream_id) {}

  Http2Connection& conn;
  const std::int32_t id;

  // The request.
  RequestHead head;
  std::string method, path, authority, scheme, protocol;
  /// An extended CONNECT (RFC 8441): the stream's DATA are a tunnel's bytes, not a body.
  bool tunnel = false;
  std::size_t header_bytes = 0;
  /// Set while the headers arrive if the request must be refused (431, 400).
  int early_status = 0;

  // Its body, as it arrives: bytes not yet read by the handler, and how it stands.
  std::string body_in;
  std::size_t body_in_pos = 0;
  std::uint64_t body_received = 0;
  bool body_done = false;
  bool body_too_large = false;
  Event body_event;

  // The response body nghttp2 pulls from (read_data).
  std::string out_body;
  std::size_t out_pos = 0;
  std::optional<FileBody> out_file;
  std::uint64_t file_sent = 0;
  bool streaming = false;
  bool out_eof = false;
  Event out_event;

  /// nghttp2 closed the stream (done, or reset by either side).
  bool closed = false;
  /// Trailer fields a streamed body's producer set (sent after its last DATA).
  HeaderMap out_trailers;
  /// What the handler asked to run if the client resets the stream (Request::on_client_gone).
  std::function<void()> on_gone;
  /// The handler has started, and has returned (its response is submitted).
  bool handler_started = false;
  bool handler_done = false;
  /// Where it is in the connection's open_ list.
  std::size_t open_index = 0;

  std::size_t read(std::span<char> buffer) override;
  /// A HEADERS frame without END_STREAM ahead of the response.
  bool send_interim(int status, const HeaderMap& fields) override;
};

bool H2Stream::send_interim(int status, const HeaderMap& fields) {
  if (closed) return false;
  // nghttp2 copies the fields: these buffers need only last the call. Names go lower case.
  std::size_t total = 0;
  for (const Field& f : fields) total += f.name.size();
  std::string names;
  names.reserve(total);
  std::vector<nghttp2_nv> nv;
  nv.reserve(fields.size() + 1);
  auto add = [&](std::string_view name, std::string_view value) {
    nv.push_back({reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
                  reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(),
                  value.size(), NGHTTP2_NV_FLAG_NONE});
  };
  std::string code = std::to_string(status);
  add(":status", code);
  for (const Field& f : fields) {
    if (!detail::interim_field_sendable(f)) continue;
    std::size_t at = names.size();
    for (char ch : f.name) names += ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch + 32) : ch;
    add(std::string_view(names.data() + at, f.name.size()), f.value);
  }
  int rv = nghttp2_submit_headers(conn.session(), NGHTTP2_FLAG_NONE, id, nullptr, nv.data(),
                                  nv.size(), nullptr);
  conn.wake_writer();
  return rv == 0;
}

std::size_t H2Stream::read(std::span<char> buffer) {
  const ServerOptions& options = conn.options();
  for (;;) {
    if (body_too_large) throw HttpError(413, "body too large");
    if (body_in_pos < body_in.size()) {
      std::size_t n = std::min(buffer.size(), body_in.size() - body_in_pos);
      std::memcpy(buffer.data(), body_in.data() + body_in_pos, n);
      body_in_pos += n;
      if (body_in_pos == body_in.size()) {
        body_in.clear();
        body_in_pos = 0;
      }
      // Read: the client may send that much more (WINDOW_UPDATE).
      nghttp2_session_consume(conn.session(), id, n);
      conn.wake_writer();
      return n;
    }
    if (body_done || buffer.empty()) return 0;
    if (closed) throw HttpError(400, "stream reset");
    body_event.reset();
    if (auto ec = body_event.wait(Deadline::after(options.body_timeout))) {
      if (ec == std::errc::timed_out) throw HttpError(408, "request body too slow");
      throw HttpError(400, "connection closed");
    }
  }
}

// Writes a streamed response body into the stream's buffer for nghttp2 to send.
class H2BodyWriter final : public BodyWriter {
 public:
  /// `length`: of the whole body, whose first `already` bytes the response carried itself.
  H2BodyWriter(H2Stream& s, std::optional<std::uint64_t> length, std::uint64_t already)
      : s_(s), length_(length), written_(already) {}
  /// True if a sized body got all its bytes.
  bool complete() const { return !length_ || written_ == *length_; }
  bool write(std::string_view data) override {
    if (s_.closed) return false;
    if (length_ && data.size() > *length_ - written_) return false;  // more than announced
    written_ += data.size();
    if (s_.out_pos > 0 && s_.out_pos == s_.out_body.size()) {
      s_.out_body.clear();
      s_.out_pos = 0;
    }
    s_.out_body.append(data);
    nghttp2_session_resume_data(s_.conn.session(), s_.id);
    s_.conn.wake_writer();
    // Flow control reaches the producer here: it waits while the client does not take more.
    while (!s_.closed && s_.out_body.size() - s_.out_pos > kStreamedHighWater) {
      s_.out_event.reset();
      if (s_.out_event.wait(Deadline::after(s_.conn.options().write_timeout))) return false;
    }
    return !s_.closed;
  }
  void set_trailers(const HeaderMap& trailers) override {
    s_.out_trailers.clear();
    for (const Field& f : trailers) {
      if (is_hop_by_hop(f.name) || !is_field_name(f.name) || !is_field_value(f.value)) continue;
      s_.out_trailers.add(ascii_lower(f.name), f.value);
    }
  }

 private:
  H2Stream& s_;
  std::optional<std::uint64_t> length_;
  std::uint64_t written_;
};

// nghttp2 pulls a response body from here (on the writer fiber, inside mem_send).
ssize_t read_data(nghttp2_session* session, std::int32_t /*id*/, std::uint8_t* buf,
                  std::size_t length, std::uint32_t* flags, nghttp2_data_source* source,
                  void* /*user*/) {
  auto* s = static_cast<H2Stream*>(source->ptr);
  if (s->out_file) {
    std::uint64_t left = s->out_file->length - s->file_sent;
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(length, left));
    ssize_t n = want == 0 ? 0
                          : ::pread(s->out_file->fd->get(), buf, want,
                                    static_cast<off_t>(s->out_file->offset + s->file_sent));
    if (n < 0 || (n == 0 && want > 0)) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // shrank
    s->file_sent += static_cast<std::uint64_t>(n);
    if (s->file_sent == s->out_file->length) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return n;
  }
  std::size_t n = std::min(length, s->out_body.size() - s->out_pos);
  std::memcpy(buf, s->out_body.data() + s->out_pos, n);
  s->out_pos += n;
  if (s->out_pos == s->out_body.size()) {
    if (!s->streaming || s->out_eof) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      // The body ends here; the trailers' HEADERS frame, if any, ends the stream.
      submit_trailers(session, s->id, s->out_trailers, flags);
    } else if (n == 0) {
      return NGHTTP2_ERR_DEFERRED;  // the producer resumes it
    }
  }
  if (s->streaming) s->out_event.set();  // room for the producer
  return static_cast<ssize_t>(n);
}

}  // namespace

// ---- nghttp2 callbacks -----------------------------------------------------------------------

struct Callbacks {
  static Http2Connection& conn(void* user) { return *static_cast<Http2Connection*>(user); }

  static int on_begin_frame(nghttp2_session* session, const nghttp2_frame_hd* hd, void* user) {
    Http2Connection& c = conn(user);
    if (hd->type == NGHTTP2_HEADERS) {
      c.continuations_ = 0;
      // RFC 9113 5.1.1: a new stream's id must exceed every earlier one. nghttp2 ignores such
      // HEADERS when it cannot tell them from late trailers; we can.
      std::int32_t id = hd->stream_id;
      if ((id & 1) == 1 && id <= c.last_stream_id_ &&
          nghttp2_session_find_stream(session, id) == nullptr &&
          std::find(c.closed_early_.begin(), c.closed_early_.end(), id) == c.closed_early_.end()) {
        nghttp2_session_terminate_session(session, NGHTTP2_PROTOCOL_ERROR);
      }
      c.last_stream_id_ = std::max(c.last_stream_id_, id);
    } else if (hd->type == NGHTTP2_CONTINUATION && ++c.continuations_ > kMaxContinuations) {
      nghttp2_session_terminate_session(session, NGHTTP2_ENHANCE_YOUR_CALM);
    }
    return 0;
  }

  static int on_begin_headers(nghttp2_session* /*session*/, const nghttp2_frame* frame,
                              void* user) {
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
      // (No stream to hold it: nghttp2 resets this one with INTERNAL_ERROR.)
      if (conn(user).open_stream(frame->hd.stream_id) == nullptr) {
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
      }
    }
    return 0;
  }

  static int on_header(nghttp2_session* /*session*/, const nghttp2_frame* frame,
                       const std::uint8_t* name_bytes, std::size_t name_length,
                       const std::uint8_t* value_bytes, std::size_t value_length,
                       std::uint8_t /*flags*/, void* user) {
    Http2Connection& c = conn(user);
    H2Stream* s = c.find(frame->hd.stream_id);
    if (s == nullptr || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;  // trailers
    std::string_view name(reinterpret_cast<const char*>(name_bytes), name_length);
    std::string_view value(reinterpret_cast<const char*>(value_bytes), value_length);
    // The decoded size counts (an HPACK bomb is small on the wire, large here).
    s->header_bytes += name.size() + value.size() + 32;
    const ParserLimits& limits = c.options().parser;
    if (s->header_bytes > limits.max_head || s->head.headers.size() >= limits.max_headers) {
      s->early_status = 431;
      return 0;
    }
    if (s->early_status != 0) return 0;
    if (name == ":method") {
      s->method = value;
    } else if (name == ":path") {
      s->path = value;
    } else if (name == ":authority") {
      s->authority = value;
    } else if (name == ":scheme") {
      s->scheme = value;
    } else if (name == ":protocol") {
      s->protocol = value;  // nghttp2 lets it through with CONNECT only (RFC 8441 4)
    } else {
      s->head.headers.add(name, value);
    }
    return 0;
  }

  static int on_frame_recv(nghttp2_session* /*session*/, const nghttp2_frame* frame, void* user) {
    Http2Connection& c = conn(user);
    bool end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (frame->hd.type == NGHTTP2_PING && (frame->hd.flags & NGHTTP2_FLAG_ACK) != 0 &&
        c.notice_sent_ && std::memcmp(frame->ping.opaque_data, kShutdownPing, 8) == 0) {
      c.shut_down(true);  // the client has heard the notice: the final GOAWAY
      return 0;
    }
    if (frame->hd.type == NGHTTP2_RST_STREAM) {
      // Called before nghttp2 closes the stream: it is still ours to look at.
      H2Stream* reset = c.find(frame->hd.stream_id);
      c.note_reset(reset != nullptr && reset->handler_started && !reset->handler_done);
      return 0;
    }
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    H2Stream* s = c.find(frame->hd.stream_id);
    if (s == nullptr) return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
      if (end_stream) s->body_done = true;
      c.start_handler(*s);
      return 0;
    }
    if (end_stream) {
      s->body_done = true;
      s->body_event.set();
    }
    return 0;
  }

  static int on_data_chunk_recv(nghttp2_session* session, std::uint8_t /*flags*/,
                                std::int32_t stream_id, const std::uint8_t* data,
                                std::size_t length, void* user) {
    Http2Connection& c = conn(user);
    H2Stream* s = c.find(stream_id);
    if (s == nullptr || s->handler_done || s->body_too_large) {
      nghttp2_session_consume(session, stream_id, length);  // nobody reads it: let more come
      return 0;
    }
    s->body_received += length;
    if (s->body_received > c.options().max_body && !s->tunnel) {
      s->body_too_large = true;
      nghttp2_session_consume(session, stream_id, length);
    } else {
      s->body_in.append(reinterpret_cast<const char*>(data), length);
    }
    s->body_event.set();
    return 0;
  }

  static int on_stream_close(nghttp2_session* /*session*/, std::int32_t stream_id,
                             std::uint32_t /*error_code*/, void* user) {
    Http2Connection& c = conn(user);
    H2Stream* found = c.find(stream_id);
    if (found == nullptr) return 0;
    H2Stream& s = *found;
    if (!s.body_done) {
      c.closed_early_.push_back(stream_id);
      if (c.closed_early_.size() > 64) c.closed_early_.pop_front();
    }
    s.closed = true;
    s.body_event.set();
    s.out_event.set();
    if (!s.handler_done && s.on_gone) {
      // The client reset the stream while its handler runs: tell it, from a fiber of its own
      // (nothing may wait inside nghttp2's callback).
      spawn([gone = std::move(s.on_gone)] { gone(); }).detach();
    }
    c.forget(s);  // the handler, if it still runs, keeps its own reference
    if (c.goaway_sent_ && c.open_.empty()) c.stop_reader();
    return 0;
  }
};

// ---- the connection --------------------------------------------------------------------------

Http2Connection::Http2Connection(Stream& stream, HttpServer::Shared& shared, WorkerState& worker)
    : stream_(stream), shared_(shared), worker_(worker) {
  nghttp2_session_callbacks* callbacks = nullptr;
  nghttp2_session_callbacks_new(&callbacks);
  nghttp2_session_callbacks_set_on_begin_frame_callback(callbacks,
                                                        &Guarded<&Callbacks::on_begin_frame>::call);
  nghttp2_session_callbacks_set_on_begin_headers_callback(
      callbacks, &Guarded<&Callbacks::on_begin_headers>::call);
  nghttp2_session_callbacks_set_on_header_callback(callbacks,
                                                   &Guarded<&Callbacks::on_header>::call);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks,
                                                       &Guarded<&Callbacks::on_frame_recv>::call);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
      callbacks, &Guarded<&Callbacks::on_data_chunk_recv>::call);
  nghttp2_session_callbacks_set_on_stream_close_callback(
      callbacks, &Guarded<&Callbacks::on_stream_close>::call);
  nghttp2_option* option = nullptr;
  nghttp2_option_new(&option);
  // Windows open as handlers read, not as bytes arrive: a handler that does not read holds
  // the client back instead of filling memory.
  nghttp2_option_set_no_auto_window_update(option, 1);
  // Rapid reset (CVE-2023-44487) is counted here (on_frame_recv: note_reset), where the
  // GOAWAY it earns takes effect at once; nghttp2's own count would queue its GOAWAY behind
  // the streams of the reads still to come, and let them run.
  nghttp2_option_set_stream_reset_rate_limit(option, std::uint64_t{1} << 40, 1 << 30);
  nghttp2_option_set_max_settings(option, 32);
  nghttp2_session_server_new3(&session_, callbacks, this, option, block_memory());
  nghttp2_option_del(option);
  nghttp2_session_callbacks_del(callbacks);
  worker_.http2.push_back(this);
}

Http2Connection::~Http2Connection() {
  std::erase(worker_.http2, this);
  nghttp2_session_del(session_);
}

H2Stream* Http2Connection::open_stream(std::int32_t id) {
  auto s = std::allocate_shared<H2Stream>(BlockAllocator<H2Stream>(), *this, id);
  if (nghttp2_session_set_stream_user_data(session_, id, s.get()) != 0) return nullptr;
  s->open_index = open_.size();
  open_.push_back(std::move(s));
  return open_.back().get();
}

H2Stream* Http2Connection::find(std::int32_t id) {
  return static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(session_, id));
}

void Http2Connection::forget(H2Stream& s) {
  nghttp2_session_set_stream_user_data(session_, s.id, nullptr);
  std::size_t i = s.open_index;
  if (i + 1 != open_.size()) {
    open_[i] = std::move(open_.back());
    open_[i]->open_index = i;
  }
  open_.pop_back();  // the last reference unless the handler still runs
}

const RequestContext& Http2Connection::request_context() {
  if (context_.remote == "-") {
    if (remote_.empty()) remote_ = client_address_text(stream_.peer_address());
    context_.remote = remote_;
    context_.major_version = 2;
    if (auto peer = stream_.peer_address()) {
      peer_ = *peer;
      context_.peer = &*peer_;
    }
    if (auto local = stream_.local_address()) {
      local_ = *local;
      context_.local = &*local_;
    }
    if (TlsStream* tls = stream_.tls()) {
      context_.tls = true;
      context_.server_name = tls->server_name();
      context_.alpn = tls->alpn();
    }
  }
  context_.started = coarse_now();
  return context_;
}

void Http2Connection::start_handler(H2Stream& s) {
  s.head.method = s.method;
  s.head.target = s.path;
  s.head.minor_version = 1;
  if (auto host = s.head.headers.get("host"); host && !s.authority.empty()) {
    // RFC 9113 8.3.1: a Host naming another entity than :authority makes the request
    // malformed (which one would a handler, or an upstream, believe?).
    if (!iequals(*host, s.authority) || s.head.headers.count("host") != 1) s.early_status = 400;
  } else if (!s.authority.empty()) {
    s.head.headers.add(std::string_view("host"), s.authority);
  }
  if (s.head.headers.count("cookie") > 1) {
    // RFC 9113 8.2.3: cookie pairs may come as separate fields; they are one field with "; "
    // between them for everything past HTTP/2 (HTTP/1.1 allows one Cookie line).
    std::string joined;
    for (const Field& f : s.head.headers) {
      if (!iequals(f.name, "cookie")) continue;
      if (!joined.empty()) joined += "; ";
      joined += f.value;
    }
    s.head.headers.erase("cookie");
    s.head.headers.add("cookie", joined);
  }
  if (!s.protocol.empty()) {
    // Extended CONNECT: the handler sees a CONNECT to a path, with the protocol it asks for.
    s.head.protocol = s.protocol;
    s.tunnel = true;
  }
  FramingFields framing = collect_framing_fields(s.head.headers);
  if (framing.content_length_invalid) s.early_status = 400;
  s.head.content_length = framing.content_length;
  // A body without a Content-Length: its length is known only at END_STREAM, as a chunked
  // one's is on HTTP/1.1 (what `chunked` tells a handler, and a proxy that forwards it).
  s.head.chunked = !s.body_done && !framing.content_length;
  // Refused from its HEADERS alone, as HTTP/1.1 does: no handler asks for a body that size.
  if (framing.content_length && *framing.content_length > shared_.options.max_body) {
    s.early_status = 413;
  }
  if (s.method == "CONNECT" && s.protocol.empty()) {
    s.head.target = s.authority;  // a plain CONNECT names where to, not a path
  } else if (s.path.empty() || (s.path.front() != '/' && s.path != "*")) {
    s.early_status = 400;
  } else if (auto size = normalize_target(s.path.data(), s.path.size(), shared_.options.paths)) {
    s.path.resize(*size);
    s.head.target = s.path;
  } else {
    s.early_status = 400;
  }
  due_.push_back(open_[s.open_index]);
}

void Http2Connection::start_due_handlers() {
  if (due_.empty()) return;
  // A session that stopped reading is ending (a protocol error, a flood): nothing more runs.
  const bool ending = !nghttp2_session_want_read(session_);
  for (std::shared_ptr<H2Stream>& due : due_) {
    H2Stream& s = *due;
    if (s.closed || ending) continue;  // reset (or ended) before it could start: nothing ran
    if (s.id > goaway_last_id_) {
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_REFUSED_STREAM);
      continue;
    }
    start_one(std::move(due));
  }
  due_.clear();
  wake_writer();
}

void Http2Connection::start_one(std::shared_ptr<H2Stream> stream) {
  H2Stream& s = *stream;
  s.handler_started = true;
  last_started_id_ = std::max(last_started_id_, s.id);
  handlers_.add();
  auto handler = spawn([this, self = std::move(stream)] { handle(self); },
                       SpawnOptions{.stack_size = shared_.options.tcp.stack_size});
  if (handler.finished()) {
    // No fiber for its handler (no stack; the worker logged why): refused, so the client may
    // send it again, here later or elsewhere.
    handlers_.done();
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_REFUSED_STREAM);
    wake_writer();
    try {
      handler.join();
    } catch (...) {
      // The worker logged why.
    }
  }
}

void Http2Connection::handle(std::shared_ptr<H2Stream> s) {
  // Whatever happens here, the connection learns that this handler is done.
  struct Done {
    Http2Connection& connection;
    H2Stream& stream;
    ~Done() { connection.end_handler(stream); }
  } done{*this, *s};
  try {
    // The clock is read only for the access log's duration.
    auto started = shared_.options.access_log ? Clock::now() : Clock::time_point();
    Response response;
    bool head_only = s->method == "HEAD";
    if (s->early_status != 0) {
      response = Response::error(s->early_status);
      if (shared_.options.access_log) log_access(*s, response, started, {});
    } else {
      Request request(s->head, *s);
      request.set_context_source(this);
      request.set_client_gone_slot(&s->on_gone);
      request.set_interim_sink(s.get());
      response = call_router(shared_.router, request);
      if (shared_.options.access_log) log_access(*s, response, started, request.attributes());
    }
    if (!s->closed) submit_response(*s, response, head_only);
  } catch (...) {
    // Only the server's own code can get here (call_router catches the handler's exceptions):
    // the stream ends, the connection goes on.
    log_error("HTTP/2 stream {} of {} {} failed", s->id, s->method, s->path);
    if (!s->closed) {
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
    }
  }
}

void Http2Connection::end_handler(H2Stream& s) noexcept {
  s.handler_done = true;
  // What the handler left unread is dropped; the client may send the rest (RFC 9113 8.1 lets
  // the server also reset the request side with NO_ERROR once the response is complete).
  if (std::size_t unread = s.body_in.size() - s.body_in_pos; unread > 0) {
    nghttp2_session_consume(session_, s.id, unread);
    s.body_in.clear();
    s.body_in_pos = 0;
  }
  wake_writer();
  handlers_.done();
}

void Http2Connection::submit_response(H2Stream& s, Response& response, bool head_only) {
  ResponseBodyPlan plan = plan_response_body(response, head_only);
  // The head: :status, the handler's fields (names in lower case, as HTTP/2 requires), then
  // date, server and content-length. nghttp2 copies the list when it is submitted, so it may
  // point at anything alive until then: the response's own values, and its names lower-cased
  // into one buffer (reserved whole first, so views into it stay put).
  std::size_t name_bytes = 0;
  for (const Field& f : response.headers) name_bytes += f.name.size();
  std::string& names = nv_names_;
  names.clear();
  names.reserve(name_bytes);
  std::vector<nghttp2_nv>& nv = nv_;
  nv.clear();
  auto add = [&](std::string_view name, std::string_view value) {
    nv.push_back({reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
                  reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(),
                  value.size(), NGHTTP2_NV_FLAG_NONE});
  };
  char status[8];
  auto status_end = std::to_chars(status, status + sizeof status, response.status).ptr;
  add(":status", {status, static_cast<std::size_t>(status_end - status)});
  HandlerFields seen = each_response_field(response, [&](const Field& f) {
    if (is_hop_by_hop(f.name)) return;  // a 101's Upgrade and Connection mean nothing here
    std::size_t at = names.size();
    for (char ch : f.name) names += ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch + 32) : ch;
    add(std::string_view(names.data() + at, f.name.size()), f.value);
  });
  if (!seen.has_date) add("date", worker_.date.value());
  if (!seen.has_server && !shared_.options.server_name.empty()) {
    add("server", shared_.options.server_name);
  }
  char length[24];
  if (plan.content_length) {
    auto end = std::to_chars(length, length + sizeof length, *plan.content_length).ptr;
    add("content-length", {length, static_cast<std::size_t>(end - length)});
  }
  nghttp2_data_provider provider{};
  provider.source.ptr = &s;
  provider.read_callback = &read_data;
  // A 2xx that opens a tunnel: the stream stays open for its bytes (run_tunnel).
  const bool opens_tunnel = s.tunnel && response.takeover && response.status >= 200 &&
                            response.status < 300 && !head_only;
  bool has_body = opens_tunnel || (plan.send_body && (plan.streamed || response.body_size() > 0));
  if (opens_tunnel) {
    s.streaming = true;
  } else if (has_body) {
    if (response.file) {
      s.out_file = response.file;
    } else {
      s.out_body = std::move(response.body);
    }
    s.streaming = plan.streamed;
  }
  int rv =
      nghttp2_submit_response(session_, s.id, nv.data(), nv.size(), has_body ? &provider : nullptr);
  if (rv != 0) {
    log_warn("HTTP/2 stream {}: cannot submit the response: {}", s.id, nghttp2_strerror(rv));
  }
  wake_writer();
  if (opens_tunnel && rv == 0) {
    run_tunnel(s, response.takeover);
  } else if (plan.streamed && plan.send_body && rv == 0) {
    stream_response(s, response.stream, plan.content_length);
  }
}

namespace {

// A tunnel's client end on an HTTP/2 stream (RFC 8441): the client's DATA are read as they
// come (the stream window opens as they are read), ours are written under the stream's flow
// control (at most kStreamedHighWater buffered). END_STREAM is a half-close either way.
class H2TunnelEnd final : public TunnelEnd {
 public:
  H2TunnelEnd(H2Stream& s, Http2Connection& c) : s_(s), c_(c) {}

  Result<std::size_t> read(std::span<char> buffer, Deadline deadline) override {
    for (;;) {
      if (s_.body_in_pos < s_.body_in.size()) {
        std::size_t n = std::min(buffer.size(), s_.body_in.size() - s_.body_in_pos);
        std::memcpy(buffer.data(), s_.body_in.data() + s_.body_in_pos, n);
        s_.body_in_pos += n;
        if (s_.body_in_pos == s_.body_in.size()) {
          s_.body_in.clear();
          s_.body_in_pos = 0;
        }
        nghttp2_session_consume(c_.session(), s_.id, n);  // the client may send that much more
        c_.wake_writer();
        return n;
      }
      if (s_.body_done) return 0;
      if (s_.closed) return fail(std::errc::connection_reset);
      s_.body_event.reset();
      if (auto ec = s_.body_event.wait(deadline)) return fail(ec);
    }
  }
  Result<void> write(std::string_view data, Deadline deadline) override {
    if (s_.closed || s_.out_eof) return fail(std::errc::connection_reset);
    if (s_.out_pos > 0 && s_.out_pos == s_.out_body.size()) {
      s_.out_body.clear();
      s_.out_pos = 0;
    }
    s_.out_body.append(data);
    nghttp2_session_resume_data(c_.session(), s_.id);
    c_.wake_writer();
    while (!s_.closed && s_.out_body.size() - s_.out_pos > kStreamedHighWater) {
      s_.out_event.reset();
      if (auto ec = s_.out_event.wait(deadline)) return fail(ec);
    }
    if (s_.closed) return fail(std::errc::connection_reset);
    return {};
  }
  void close_write() override {
    if (s_.closed || s_.out_eof) return;
    s_.out_eof = true;  // read_data ends the stream once what is buffered has gone
    nghttp2_session_resume_data(c_.session(), s_.id);
    c_.wake_writer();
  }
  void abort() override {
    if (s_.closed) return;
    nghttp2_submit_rst_stream(c_.session(), NGHTTP2_FLAG_NONE, s_.id, NGHTTP2_CANCEL);
    c_.wake_writer();
  }

 private:
  H2Stream& s_;
  Http2Connection& c_;
};

}  // namespace

void Http2Connection::run_tunnel(H2Stream& s, const ConnectionTakeover& takeover) {
  H2TunnelEnd client(s, *this);
  try {
    takeover(client, {});
  } catch (const std::exception& e) {
    log_error("tunnel of {} {} threw: {}", s.method, s.path, e.what());
    client.abort();
  } catch (...) {
    log_error("tunnel of {} {} threw an exception of unknown type", s.method, s.path);
    client.abort();
  }
  client.close_write();
}

void Http2Connection::stream_response(H2Stream& s, const BodyProducer& producer,
                                      std::optional<std::uint64_t> length) {
  H2BodyWriter writer(s, length, s.out_body.size());
  try {
    producer(writer);
    if (!writer.complete()) {
      // Fewer bytes than announced: the stream is reset rather than ended short.
      log_error("streamed body of {} {} ended short of its length", s.method, s.path);
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_INTERNAL_ERROR);
    }
  } catch (const std::exception& e) {
    log_error("streamed body of {} {} threw: {}", s.method, s.path, e.what());
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_INTERNAL_ERROR);
  } catch (...) {
    log_error("streamed body of {} {} threw an exception of unknown type", s.method, s.path);
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_INTERNAL_ERROR);
  }
  s.out_eof = true;
  if (!s.closed) nghttp2_session_resume_data(session_, s.id);
  wake_writer();
}

void Http2Connection::log_access(H2Stream& s, const Response& response, Clock::time_point started,
                                 std::span<const std::pair<std::string, std::string>> attributes) {
  if (remote_.empty()) remote_ = client_address_text(stream_.peer_address());
  shared_.options.access_log->record(
      access_record(s.head, response, remote_, 2, started, attributes));
}

void Http2Connection::write_loop() {
  std::string out;
  while (!writer_failed_) {
    switch (send_frames(session_, stream_, out, Deadline::after(shared_.options.write_timeout))) {
      case FramesSent::kSent:
        continue;
      case FramesSent::kFailed:
        writer_failed_ = true;
        continue;
      case FramesSent::kNothing:
        break;
    }
    // After a connection error's GOAWAY, nghttp2 wants nothing more: the connection closes.
    if (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_)) {
      stop_reader();
      break;
    }
    // The reader is done: what could be sent is sent (no WINDOW_UPDATE can come any more).
    if (stopping_ || this_fiber::stop_requested()) break;
    if (notice_sent_ && !goaway_sent_) {
      // A client that does not answer the shutdown PING in time gets the final GOAWAY anyway.
      writer_wake_.reset();
      if (writer_wake_.wait(notice_deadline_) == std::errc::timed_out) shut_down(true);
      continue;
    }
    wait_for_frames(writer_wake_);
  }
  if (writer_failed_) stop_reader();
}

void Http2Connection::stop_reader() {
  if (reader_ != nullptr) reader_->request_stop();
}

void Http2Connection::note_reset(bool costly) {
  auto now = coarse_now();
  bool within = resets_.take(now);
  if (costly) within = costly_resets_.take(now) && within;
  if (!within && !goaway_sent_) refuse_further_streams(NGHTTP2_ENHANCE_YOUR_CALM);
}

void Http2Connection::refuse_further_streams(std::uint32_t code) {
  goaway_sent_ = true;
  goaway_last_id_ = last_started_id_;
  nghttp2_session_terminate_session2(session_, last_started_id_, code);
  wake_writer();
}

void Http2Connection::shut_down(bool at_once) {
  if (goaway_sent_) return;
  if (!at_once) {
    if (notice_sent_) return;  // the final GOAWAY comes with the PING's answer
    // RFC 9113 6.8: announce first, and learn by a PING when the client has heard it.
    notice_sent_ = true;
    notice_deadline_ = Deadline::after(kShutdownNoticeTime);
    nghttp2_submit_shutdown_notice(session_);
    nghttp2_submit_ping(session_, NGHTTP2_FLAG_NONE, kShutdownPing);
    wake_writer();
    return;
  }
  goaway_sent_ = true;
  goaway_last_id_ = nghttp2_session_get_last_proc_stream_id(session_);
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE, goaway_last_id_, NGHTTP2_NO_ERROR, nullptr, 0);
  wake_writer();
  if (open_.empty()) stop_reader();
}

void Http2Connection::run(std::string_view preread, const Http2Upgrade* upgrade) {
  reader_ = current_fiber();
  nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreams},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<std::uint32_t>(kStreamWindow)},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
       static_cast<std::uint32_t>(shared_.options.parser.max_head)},
      // RFC 8441: WebSockets (and other upgrades a route allows) by extended CONNECT.
      {NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL, 1},
  };
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, kConnectionWindow);
  auto writer = spawn([this] { write_loop(); });
  // Whatever happens below, the writer and the handlers point at this connection: they end
  // before it does.
  struct Finish {
    Http2Connection& connection;
    JoinHandle<void>& writer;
    ~Finish() { connection.finish(writer); }
  } finish{*this, writer};
  if (writer.finished()) return;  // no fiber for the writer (no stack): nothing can be sent
  read_loop(preread, upgrade);
}

void Http2Connection::read_loop(std::string_view preread, const Http2Upgrade* upgrade) {
  bool ok = true;
  if (upgrade != nullptr) {
    // Stream 1 is the HTTP/1.1 request that asked for h2c; it is answered over HTTP/2.
    int head_request = upgrade->head->method == "HEAD" ? 1 : 0;
    ok = nghttp2_session_upgrade2(session_,
                                  reinterpret_cast<const std::uint8_t*>(upgrade->settings.data()),
                                  upgrade->settings.size(), head_request, nullptr) == 0;
    H2Stream* s = ok ? open_stream(1) : nullptr;
    ok = s != nullptr;
    if (ok) {
      s->method = upgrade->head->method;
      s->path = upgrade->head->target;
      // Connection names HTTP2-Settings: it goes with the hop-by-hop fields.
      for_each_end_to_end(upgrade->head->headers,
                          [&](const Field& f) { s->head.headers.add(f.name, f.value); });
      s->body_in = upgrade->body;
      s->body_done = true;
      start_handler(*s);
    }
  }
  if (ok && !preread.empty()) {
    ok = nghttp2_session_mem_recv(session_, reinterpret_cast<const std::uint8_t*>(preread.data()),
                                  preread.size()) >= 0;
  }
  if (ok) start_due_handlers();
  std::vector<char> buffer(16 * 1024);  // on the heap: fiber stacks are small
  while (ok && !writer_failed_) {
    wake_writer();
    if (!nghttp2_session_want_read(session_)) break;
    if (shared_.draining.load(std::memory_order_acquire)) shut_down();
    if (goaway_sent_ && open_.empty()) break;
    // Idle (no stream open): the keep-alive timeout applies, then GOAWAY. (Not while a
    // shutdown notice waits for its PING: the writer ends that wait.)
    Deadline deadline = open_.empty() && !notice_sent_
                            ? Deadline::after(shared_.options.keepalive_timeout)
                            : Deadline::never();
    auto n = stream_.read(buffer, deadline);
    if (!n) {
      // Idle too long: GOAWAY (which, with no stream open, also stops the reader).
      if (n.error() == std::errc::timed_out && open_.empty()) shut_down(true);
      break;  // stopped (canceled), timed out idle, or the connection failed
    }
    if (*n == 0) break;
    ok = nghttp2_session_mem_recv(session_, reinterpret_cast<const std::uint8_t*>(buffer.data()),
                                  *n) >= 0;
    if (ok) start_due_handlers();
  }
  due_.clear();  // a read that failed: what it opened never starts
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
    writer.join();
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

void serve_http2(Stream& stream, HttpServer::Shared& shared, WorkerState& worker,
                 std::string_view preread, const Http2Upgrade* upgrade) {
  Http2Connection connection(stream, shared, worker);
  connection.run(preread, upgrade);
}

void shut_down_http2(WorkerState& worker) {
  for (Http2Connection* c : std::vector<Http2Connection*>(worker.http2)) c->shut_down();
}

}  // namespace spindle::http::detail
