// The HTTP/2 driver of HttpServer: spindle's own protocol code (h2::ServerSession: bytes in,
// events and frames out, no I/O) does the protocol; this file moves the bytes and runs each
// stream's handler as sequential code with the same Request/Response/router as HTTP/1.1.
//
// One connection is three kinds of fiber on one worker: the reader (the activation's fiber:
// socket -> session, which calls back to open streams and hand them body bytes), the writer
// (moves what the streams have to send into frames as the windows allow, then writes the
// session's output: one write per turn, whatever the number of streams) and handler fibers,
// which run the due handlers one after another (another stands by whenever more wait, so a
// handler that parks holds up no other). They never run at once (one worker), so the session
// needs no lock; none of them parks inside a session call. Idle, the connection has none.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "response_head.h"
#include "server_internal.h"
#include "spindle/base/ascii.h"
#include "spindle/base/byte_queue.h"
#include "spindle/base/intrusive_ptr.h"
#include "spindle/base/log.h"
#include "spindle/fiber/block_cache.h"
#include "spindle/fiber/buffer_pool.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/h2/session.h"
#include "spindle/h2/turns.h"
#include "spindle/http/release.h"
#include "spindle/http/status.h"
#include "spindle/sync/event.h"

namespace spindle::http::detail {
namespace {

using h2::ErrorCode;
using HpackField = h2::hpack::Field;

// How long an idle connection waits for its next frame before it parks (ends its fibers).
constexpr auto kParkAfter = std::chrono::milliseconds(10);
// A streamed response body waits for the writer beyond this many buffered bytes.
constexpr std::size_t kStreamedHighWater = 64 * 1024;
// What a stream whose answer waits on its client's windows must move within each write
// timeout (136 bytes a second at the default 30 s): less, as a window opened a byte at a time
// (data dribble, CVE-2019-9511), and the stream is cut like one that moves nothing.
constexpr std::size_t kLeastProgress = 4096;
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

std::span<const std::uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

class H2Stream;
/// A stream's owners (the connection's lists, its handler) share it by a count of its own:
/// all on one worker, so not the atomic count of a shared_ptr (three locked instructions a
/// request).
using StreamRef = IntrusivePtr<H2Stream>;

}  // namespace

class Http2Connection final : public ContextSource, private h2::SessionHandler {
 public:
  explicit Http2Connection(ConnectionState& state);
  ~Http2Connection() override;

  /// One activation: serves the connection until it ends, or until it is idle (no stream,
  /// nothing to read or write): then the writer ends, the buffers go, and the connection
  /// waits in the reactor with its session alone (kIdle). Never throws past the point where
  /// fibers point at it: they are all gone when it returns or throws. `preread` and `upgrade`
  /// on the first activation only.
  Activation run(std::string_view preread, const Http2Upgrade* upgrade);
  /// Draining: the client is told the connection ends (a GOAWAY that refuses nothing yet,
  /// and a PING); once the PING comes back, every stream it opened before it knew has
  /// arrived, and the final GOAWAY names the last one. The connection ends once its streams
  /// are done. `at_once`: the final GOAWAY now (an idle connection's timeout). An idle
  /// connection runs again to do it.
  void shut_down(bool at_once = false);
  /// No fiber for what the connection needs: GOAWAY (nothing the client sent since the last
  /// stream begun was processed), written by the caller itself, within the write timeout
  /// (outside a fiber: without waiting).
  void refuse();

  // Used by the streams.
  h2::ServerSession& session() { return session_; }
  const ServerOptions& options() const { return shared_.options; }
  /// Wakes the writer (there may be frames to send). Several times a request: a flag already
  /// set is left alone (one worker: the flag seen is the flag; set() would take its lock).
  void wake_writer() {
    if (!writer_wake_.is_set()) writer_wake_.set();
  }
  /// `s` has body bytes (or its end) for the writer to frame.
  void want_to_send(H2Stream& s);
  /// Resets `s` (the handler gave up, or its body failed).
  void reset_stream(H2Stream& s, ErrorCode code);
  /// Submits a header block on `s`: `status` and `fields` (names lower-cased here), then
  /// date, server and content-length when given.
  void submit_head(H2Stream& s, int status, const HeaderMap& fields, bool end_stream);
  /// Encodes fields_ as a header block on `s`; then lets go of the worker's lists if a long
  /// one grew them (they are kept for the next block, not for the largest one ever sent).
  void submit_fields(H2Stream& s, bool end_stream);

  /// The request context: the connection's facts (once) and the time now.
  const RequestContext& request_context() override;

 private:
  friend class H2Stream;

  // The session's events (h2::SessionHandler), on the reader's fiber.
  void on_request_begin(std::uint32_t id) override { open_stream(id); }
  void on_field(std::uint32_t id, const Field& field) override;
  void on_headers(std::uint32_t id, bool end_stream, bool trailers) override;
  void on_data(std::uint32_t id, std::span<const std::uint8_t> data, bool end_stream) override;
  void on_reset(std::uint32_t id, ErrorCode code) override;
  void on_window(std::uint32_t id) override;
  void on_ping_ack(std::span<const std::uint8_t, 8> payload) override;
  bool on_head_too_large(std::uint32_t id, bool end_stream) override;

  /// Creates the stream for a request whose headers begin.
  H2Stream& open_stream(std::uint32_t id);
  /// Our stream `id`, or nullptr.
  H2Stream* find(std::uint32_t id);
  /// `s` is done here: it leaves open_ (its handler, if it still runs, keeps a reference).
  void forget(H2Stream& s);
  /// Forgets `s` once its handler is done and its response is out (or it was reset). A request
  /// whose body the client still sends stays open in the session, which checks what comes and
  /// gives the windows back (a reset would make the client's errors on it go unseen).
  void forget_if_done(H2Stream& s);
  /// The request's headers are complete: its handler is due to start once the bytes read so
  /// far are all processed (start_due_handlers).
  void start_handler(H2Stream& s);
  /// After a read is processed: starts the handlers of the streams that are still open,
  /// unless the session is ending or a GOAWAY sent excludes them. A stream reset in the same
  /// read as its HEADERS costs no fiber and never reaches a handler (or an upstream).
  void start_due_handlers();
  /// Resets `s` with REFUSED_STREAM (nothing of it ran: the client may send it again) and
  /// forgets it.
  void refuse_stream(H2Stream& s);
  /// Queues the handler of one stream for the connection's handler fibers.
  void start_one(StreamRef stream);
  /// Starts a fiber for the queued handlers (run_handlers), next in the worker's queue
  /// (SpawnOptions::run_next): the handlers of one read run as soon as the reader waits, before
  /// other connections' readers open their streams, so the worker holds one connection's
  /// streams at a time, not every connection's (a thousand streams of 2.6 KiB in flight miss
  /// the cache; ten stay in it). Without a fiber (no stack), the streams still queued are
  /// refused, so the client may send them again.
  void start_runner();
  /// A handler fiber: runs the queued handlers one after another. Should one's handler park
  /// while more wait behind it, another fiber starts for them (spindle::detail::on_next_suspend): a
  /// batch of handlers that do not wait costs one fiber, not one each (as HTTP/1's woken
  /// connections share theirs).
  void run_handlers();
  /// The client reset a stream whose handler runs: counted (each may have cost an upstream
  /// request); past the budget, GOAWAY ENHANCE_YOUR_CALM, and no stream above the last started
  /// one runs.
  void note_costly_reset();
  /// Runs the handler of `s` and submits its response.
  void handle(StreamRef s);
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
  /// Frames what the streams have to send, as far as the windows allow, up to a turn's worth.
  void frame_bodies();
  /// True if `s` has answer bytes ready that the client's windows let none of through.
  bool held_by_client(const H2Stream& s) const;
  /// When the first stream held by its client has been held the write timeout (never if none).
  Deadline first_held_too_long() const;
  /// Resets (CANCEL) the streams held by their client for the write timeout: a client that opens
  /// no window keeps a stream, its memory and its file no longer than one that stops reading
  /// its socket keeps the connection.
  void cut_held_streams();
  /// Frames up to `budget` bytes of one stream's body; true when the stream has sent all.
  bool frame_body(H2Stream& s, std::size_t budget);
  /// Writes the session's output, turn after turn, until the connection ends (or parks).
  void write_loop();
  /// Ends the reader (a stop request wakes it from its read).
  void stop_reader();
  /// The reactor's callback while the reader waits for bytes.
  static void on_bytes(IoSlot& slot) {
    static_cast<Http2Connection*>(slot.owner)->reader_wake_.set();
  }
  /// No stream is open any more, or no handler runs: the reader looks again whether the
  /// connection is idle.
  void nudge_reader() {
    if (open_.empty() && reader_ != nullptr) reader_wake_.set();
  }
  /// The reader's loop: socket -> session (the h2c upgrade's stream 1 and `preread` first).
  /// True if it stopped because the connection is idle (may_park).
  bool read_loop(std::string_view preread, const Http2Upgrade* upgrade);
  /// Nothing runs for the connection and nothing is left to read: no stream open, no handler
  /// running, no shutdown under way.
  bool may_park();
  /// Ends the writer once it has written everything, and gives back the buffers: the
  /// connection keeps its session (SETTINGS, HPACK tables) alone. False if the writer failed.
  bool park(JoinHandle<void>& writer);
  /// After the reader: closes the streams for their handlers, waits for them and the writer
  /// (unless it has been joined).
  void finish(JoinHandle<void>& writer) noexcept;
  /// A handler is done (its fiber ends): drops what it left unread, uncounts it.
  void end_handler(H2Stream& s) noexcept;
  /// Closes gently: half-close, then drop what the client still sends, briefly.
  void linger();

  ConnectionState& state_;
  Stream& stream_;
  HttpServer::Shared& shared_;
  WorkerState& worker_;
  h2::ServerSession session_;
  /// The open streams, in no order; each knows its index here. `last_found_`: the one the
  /// last lookup found (a header block's fields all go to one stream).
  std::vector<StreamRef> open_;
  H2Stream* last_found_ = nullptr;
  /// Streams with body bytes (or the end of their body) not yet framed.
  std::vector<H2Stream*> sending_;
  /// Where the next turn of frame_bodies starts among sending_ (they take turns).
  std::size_t next_sender_ = 0;
  /// Fields being submitted and their lower-cased names: the worker's (WorkerState says
  /// why), as the session encodes them before the call returns.
  std::vector<h2::hpack::Field>& fields_;
  std::string& names_;
  /// What the writer is writing (the session's output, taken: the two buffers take turns).
  std::string out_;
  /// A file body's bytes on their way into a DATA frame.
  std::string file_chunk_;
  /// Streams whose handler is due, oldest first from `runnable_head_`.
  std::vector<StreamRef> runnable_;
  std::size_t runnable_head_ = 0;
  /// Handler fibers alive (run_handlers), and those spawned that have not begun.
  WaitGroup handlers_;
  std::size_t runners_starting_ = 0;
  Event writer_wake_;
  /// Wakes the reader waiting for bytes: they came (on_bytes), or a stream ended and the
  /// connection may be idle (nudge_reader).
  Event reader_wake_;
  bool writer_failed_ = false;
  /// Set when the reader is done: the writer sends what is left and ends.
  bool stopping_ = false;
  /// Set when the connection parks: the writer sends what is left and ends.
  bool parking_ = false;
  /// Set once our final GOAWAY went out (draining, idle, or a reset budget spent): the reader
  /// ends when no stream is open.
  bool goaway_sent_ = false;
  /// Set once the shutdown notice went out (draining); the final GOAWAY follows at the PING's
  /// answer or at the deadline.
  bool notice_sent_ = false;
  Deadline notice_deadline_;
  /// Streams whose HEADERS are complete, waiting for the read to be processed.
  std::vector<StreamRef> due_;
  /// The highest stream whose handler started, and the highest a GOAWAY sent allows.
  std::uint32_t last_started_id_ = 0;
  std::uint32_t goaway_last_id_ = std::numeric_limits<std::uint32_t>::max();
  /// Resets of streams whose handler runs (Http2Limits::running_reset_burst and _per_second).
  TokenBucket costly_resets_;
  /// The reader's fiber while an activation runs.
  Fiber* reader_ = nullptr;
};

namespace {

// One request/response exchange. Shared by the connection's list (until it is done there) and
// its handler fiber (until the handler is done).
class H2Stream final : public BodySource, public InterimSink, public BlockCached {
 public:
  H2Stream(Http2Connection& c, std::uint32_t stream_id) : conn(c), id(stream_id) {}
  void add_ref() { ++refs_; }
  void release() {
    if (--refs_ == 0) delete this;
  }

  Http2Connection& conn;
  const std::uint32_t id;

  // The request.
  RequestHead head;
  std::string method, path, authority, scheme, protocol;
  /// An extended CONNECT (RFC 8441): the stream's DATA are a tunnel's bytes, not a body.
  bool tunnel = false;
  /// Its head is complete (fields that follow are trailers).
  bool head_complete = false;
  std::size_t header_bytes = 0;
  /// Set while the headers arrive if the request must be refused (431, 400): the first reason
  /// found is the one given.
  int early_status = 0;
  void refuse(int status) {
    if (early_status == 0) early_status = status;
  }

  // Its body, as it arrives: bytes not yet read by the handler, and how it stands.
  ByteQueue body_in;
  std::uint64_t body_received = 0;
  bool body_done = false;
  bool body_too_large = false;
  Event body_event;

  // The response body, framed by the writer as the windows allow (frame_body).
  ByteQueue out_body;
  std::optional<FileBody> out_file;
  std::uint64_t file_sent = 0;
  /// A producer (or a tunnel) still adds to out_body; out_eof once it is done.
  bool streaming = false;
  bool out_eof = false;
  /// The stream is in the writer's list; the response ended (END_STREAM went).
  bool sending = false;
  bool output_done = false;
  /// When its answer last moved kLeastProgress bytes, or was found waiting on anything but the
  /// client's windows (the worker's poll time; see held_by_client); what it framed since.
  Clock::time_point moved_at{};
  std::size_t moved_bytes = 0;
  /// Its answer counts as moving from `now` on.
  void moved(Clock::time_point now = Worker::last_poll_time()) {
    moved_at = now;
    moved_bytes = 0;
  }
  Event out_event;

  /// Reset (by either side) or the connection ended: nothing more goes either way.
  bool closed = false;
  /// Trailer fields a streamed body's producer set (sent after its last DATA); made when a
  /// producer sets some (few do: a HeaderMap is large).
  std::unique_ptr<HeaderMap> out_trailers;
  /// What the handler asked to run if the client resets the stream (Request::on_client_gone).
  ClientGone on_gone;
  /// The handler has started, and has returned (its response is submitted).
  bool handler_started = false;
  bool handler_done = false;
  /// Where it is in the connection's open_ list (npos once forgotten).
  std::size_t open_index = 0;

  std::size_t read(std::span<char> buffer) override;
  /// A HEADERS frame without END_STREAM ahead of the response.
  bool send_interim(int status, const HeaderMap& fields) override;
  /// Takes up to `n` unread body bytes into `buffer`; the client may send that many more.
  std::size_t take_body(char* buffer, std::size_t n);
  /// Appends to out_body for the writer, then waits while more than kStreamedHighWater is
  /// buffered; false if the stream closed (or the wait failed: `error`).
  bool send(std::string_view data, Deadline deadline, std::error_code* error = nullptr);

 private:
  /// StreamRefs to it.
  std::uint32_t refs_ = 1;
};

bool H2Stream::send_interim(int status, const HeaderMap& fields) {
  if (closed) return false;
  HeaderMap sendable;
  for (const Field& f : fields) {
    if (detail::interim_field_sendable(f)) sendable.add(f);
  }
  conn.submit_head(*this, status, sendable, false);
  return true;
}

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

bool H2Stream::send(std::string_view data, Deadline deadline, std::error_code* error) {
  if (closed) return false;
  if (out_body.empty()) moved();  // held by the client from now on
  out_body.append(data);
  conn.want_to_send(*this);
  // Flow control reaches the producer here: it waits while the client does not take more.
  while (!closed && out_body.size() > kStreamedHighWater) {
    out_event.reset();
    if (auto ec = out_event.wait(deadline)) {
      if (error != nullptr) *error = ec;
      return false;
    }
  }
  return !closed;
}

// Writes a streamed response body into the stream's buffer for the writer to frame.
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
    return s_.send(data, Deadline::after(s_.conn.options().write_timeout));
  }
  void set_trailers(const HeaderMap& trailers) override {
    if (s_.out_trailers == nullptr) s_.out_trailers = std::make_unique<HeaderMap>();
    s_.out_trailers->clear();
    for (const Field& f : trailers) {
      if (is_trailer_sendable(f.name, f.value)) {
        s_.out_trailers->add(ascii_lower(f.name), f.value);
      }
    }
  }

 private:
  H2Stream& s_;
  std::optional<std::uint64_t> length_;
  std::uint64_t written_;
};

// A tunnel's client end on an HTTP/2 stream (RFC 8441): the client's DATA are read as they
// come (the stream window opens as they are read), ours are written under the stream's flow
// control (at most kStreamedHighWater buffered). END_STREAM is a half-close either way.
class H2TunnelEnd final : public TunnelEnd {
 public:
  explicit H2TunnelEnd(H2Stream& s) : s_(s) {}

  Result<std::size_t> read(std::span<char> buffer, Deadline deadline) override {
    for (;;) {
      if (!s_.body_in.empty()) return s_.take_body(buffer.data(), buffer.size());
      if (s_.body_done) return 0;
      if (s_.closed) return fail(std::errc::connection_reset);
      s_.body_event.reset();
      if (auto ec = s_.body_event.wait(deadline)) return fail(ec);
    }
  }
  Result<void> write(std::string_view data, Deadline deadline) override {
    if (s_.closed || s_.out_eof) return fail(std::errc::connection_reset);
    std::error_code error = std::make_error_code(std::errc::connection_reset);
    if (!s_.send(data, deadline, &error)) return fail(error);
    return {};
  }
  void close_write() override {
    if (s_.closed || s_.out_eof) return;
    s_.out_eof = true;  // the writer ends the stream once what is buffered has gone
    s_.conn.want_to_send(s_);
  }
  void abort() override {
    if (!s_.closed) s_.conn.reset_stream(s_, ErrorCode::kCancel);
  }

 private:
  H2Stream& s_;
};

}  // namespace

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
  s.head.target = s.path;
  s.head.minor_version = 1;
  if (auto host = s.head.headers.get(token::kHost); host && !s.authority.empty()) {
    // RFC 9113 8.3.1: a Host naming another entity than :authority makes the request
    // malformed (which one would a handler, or an upstream, believe?).
    if (!iequals(*host, s.authority) || s.head.headers.count(token::kHost) != 1) s.refuse(400);
  } else if (!s.authority.empty()) {
    s.head.headers.add_with_static_name("host", token::kHost, s.authority);
  }
  if (s.head.headers.count(token::kCookie) > 1) {
    // RFC 9113 8.2.3: cookie pairs may come as separate fields; they are one field with "; "
    // between them for everything past HTTP/2 (HTTP/1.1 allows one Cookie line).
    std::string joined;
    for (const Field& f : s.head.headers) {
      if (f.token != &token::kCookie) continue;
      if (!joined.empty()) joined += "; ";
      joined += f.value;
    }
    s.head.headers.erase(token::kCookie);
    s.head.headers.add("cookie", joined);
  }
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
  if (s.method == "CONNECT" && s.protocol.empty()) {
    s.head.target = s.authority;  // a plain CONNECT names where to, not a path
  } else if (s.path.empty() || (s.path.front() != '/' && s.path != "*")) {
    s.refuse(400);
  } else if (auto size = normalize_target(s.path.data(), s.path.size(), shared_.options.paths)) {
    s.path.resize(*size);
    s.head.target = s.path;
  } else {
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
    const bool head_only = s->method == "HEAD";
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
  // What the handler left unread is dropped; the client may send the rest.
  if (std::size_t unread = s.body_in.size(); unread > 0) {
    session_.consumed(s.id, unread);
    s.body_in.clear();
  }
  forget_if_done(s);
  wake_writer();
}

void Http2Connection::reset_stream(H2Stream& s, ErrorCode code) {
  session_.reset(s.id, code);
  s.closed = true;
  s.body_event.set();
  s.out_event.set();
  wake_writer();
}

void Http2Connection::want_to_send(H2Stream& s) {
  if (!s.sending && !s.closed) {
    s.sending = true;
    s.moved();
    sending_.push_back(&s);
  }
  wake_writer();
}

void Http2Connection::submit_fields(H2Stream& s, bool end_stream) {
  session_.submit_headers(s.id, fields_, end_stream);
  constexpr std::size_t kKeptFields = 128, kKeptNames = 4096;
  if (fields_.capacity() > kKeptFields) release(fields_);
  if (names_.capacity() > kKeptNames) release(names_);
}

void Http2Connection::submit_head(H2Stream& s, int status, const HeaderMap& fields,
                                  bool end_stream) {
  // Names go lower case (HTTP/2 requires it) into one buffer; the session encodes the list
  // before this returns.
  HpackField::make_room_for_names(names_, fields);
  fields_.clear();
  char code[8];
  auto code_end = std::to_chars(code, code + sizeof code, status).ptr;
  fields_.push_back(
      HpackField::known(token::kStatus, {code, static_cast<std::size_t>(code_end - code)}));
  for (const Field& f : fields) fields_.push_back(HpackField::to_send(f, names_));
  submit_fields(s, end_stream);
  if (end_stream) s.output_done = true;
  wake_writer();
}

void Http2Connection::submit_response(H2Stream& s, Response& response, bool head_only) {
  ResponseBodyPlan plan = plan_response_body(response, head_only);
  // The head: :status, the handler's fields, then date, server and content-length.
  HpackField::make_room_for_names(names_, response.headers);
  fields_.clear();
  char status[8];
  auto status_end = std::to_chars(status, status + sizeof status, response.status).ptr;
  fields_.push_back(
      HpackField::known(token::kStatus, {status, static_cast<std::size_t>(status_end - status)}));
  HandlerFields seen = each_response_field(response, [&](const Field& f) {
    if (field_flags(f, field_flag::kHopByHop) != 0)
      return;  // a 101's Upgrade and Connection mean nothing here
    fields_.push_back(HpackField::to_send(f, names_));
  });
  if (!seen.has_date) fields_.push_back(HpackField::known(token::kDate, worker_.date.value()));
  if (!seen.has_server && !shared_.options.server_name.empty()) {
    fields_.push_back(HpackField::known(token::kServer, shared_.options.server_name));
  }
  char length[24];
  if (plan.content_length) {
    auto end = std::to_chars(length, length + sizeof length, *plan.content_length).ptr;
    fields_.push_back(
        HpackField::known(token::kContentLength, {length, static_cast<std::size_t>(end - length)}));
  }
  // A 2xx that opens a tunnel: the stream stays open for its bytes (run_tunnel).
  const bool opens_tunnel = s.tunnel && response.takeover && response.status >= 200 &&
                            response.status < 300 && !head_only;
  bool has_body = opens_tunnel || (plan.send_body && (plan.streamed || response.body_size() > 0));
  submit_fields(s, !has_body);
  if (!has_body) {
    s.output_done = true;
    wake_writer();
    return;
  }
  if (opens_tunnel) {
    s.streaming = true;
  } else {
    if (response.file) {
      s.out_file = response.file;
    } else {
      s.out_body.assign(std::move(response.body));
    }
    s.streaming = plan.streamed;
    // A body at hand that the windows take, with no other stream waiting its turn, goes now,
    // behind its head: the stream is done when its handler is (its memory is free for the
    // next one while still in cache), not when the writer has come round. (The handler's end
    // wakes the writer.)
    if (!s.streaming && sending_.empty() && session_.output_size() < h2::kTurnBytes &&
        frame_body(s, h2::kStreamSlice)) {
      return;
    }
  }
  want_to_send(s);
  if (opens_tunnel) {
    run_tunnel(s, response.takeover);
  } else if (plan.streamed && plan.send_body) {
    stream_response(s, response.stream, plan.content_length);
  }
}

void Http2Connection::run_tunnel(H2Stream& s, const ConnectionTakeover& takeover) {
  H2TunnelEnd client(s);
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
      reset_stream(s, ErrorCode::kInternalError);
    }
  } catch (const std::exception& e) {
    log_error("streamed body of {} {} threw: {}", s.method, s.path, e.what());
    reset_stream(s, ErrorCode::kInternalError);
  } catch (...) {
    log_error("streamed body of {} {} threw an exception of unknown type", s.method, s.path);
    reset_stream(s, ErrorCode::kInternalError);
  }
  s.out_eof = true;
  want_to_send(s);
}

void Http2Connection::log_access(H2Stream& s, const Response& response, Clock::time_point started,
                                 std::span<const std::pair<std::string, std::string>> attributes) {
  shared_.options.access_log->record(
      access_record(s.head, response, state_.remote_text(), 2, started, attributes));
}

// ---- the writer -------------------------------------------------------------------------

bool Http2Connection::frame_body(H2Stream& s, std::size_t budget) {
  if (s.closed) return true;
  const bool producing = s.streaming && !s.out_eof;
  const bool has_trailers = s.out_trailers != nullptr && !s.out_trailers->empty();
  std::size_t window = session_.send_window(s.id);
  if (s.out_file) {
    // A file: read a slice into the chunk buffer, and frame it.
    FileBody& file = *s.out_file;
    std::uint64_t left = file.length - s.file_sent;
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>({left, budget, window}));
    if (want > 0) {
      file_chunk_.resize(want);
      ssize_t n = ::pread(file.fd->get(), file_chunk_.data(), want,
                          static_cast<off_t>(file.offset + s.file_sent));
      if (n <= 0) {  // the file shrank or failed: the stream cannot end as announced
        reset_stream(s, ErrorCode::kInternalError);
        return true;
      }
      const bool last = s.file_sent + static_cast<std::uint64_t>(n) == file.length;
      s.file_sent += session_.submit_data(
          s.id, std::string_view(file_chunk_.data(), static_cast<std::size_t>(n)), last);
    } else if (left == 0) {
      session_.submit_data(s.id, {}, true);  // an empty file
    }
    if (s.file_sent < file.length) return false;
    s.output_done = true;
    return true;
  }
  std::size_t buffered = s.out_body.size();
  std::size_t n = std::min({buffered, budget, window});
  const bool body_ends = !producing && n == buffered;
  if (n > 0 || (body_ends && !has_trailers)) {
    s.out_body.consume(
        session_.submit_data(s.id, s.out_body.view().substr(0, n), body_ends && !has_trailers));
  }
  if (s.streaming && n > 0) s.out_event.set();  // room for the producer
  if (!body_ends || !s.out_body.empty()) return false;
  if (has_trailers) {
    // The body ends here; the trailers' HEADERS frame ends the stream.
    HpackField::make_room_for_names(names_, *s.out_trailers);
    fields_.clear();
    for (const Field& f : *s.out_trailers) fields_.push_back(HpackField::to_send(f, names_));
    submit_fields(s, true);
  }
  s.output_done = true;
  return true;
}

void Http2Connection::frame_bodies() {
  const Clock::time_point now = Worker::last_poll_time();
  h2::take_turns(
      session_, sending_, next_sender_,
      [this, now](H2Stream& s, std::size_t slice) {
        const std::size_t before = session_.output_size();
        const bool done = frame_body(s, slice);
        if (done) return true;
        s.moved_bytes += session_.output_size() - before;
        if (s.moved_bytes >= kLeastProgress || !held_by_client(s)) s.moved(now);
        return false;
      },
      [this](H2Stream& s) {
        s.sending = false;
        forget_if_done(s);
      });
}

bool Http2Connection::held_by_client(const H2Stream& s) const {
  const bool ready = !s.out_body.empty() || (s.out_file && s.file_sent < s.out_file->length);
  return ready && !s.closed && session_.send_window(s.id) == 0;
}

Deadline Http2Connection::first_held_too_long() const {
  Deadline first = Deadline::never();
  for (const H2Stream* s : sending_) {
    if (held_by_client(*s))
      first = earliest(first, Deadline::at(s->moved_at + options().write_timeout));
  }
  return first;
}

void Http2Connection::cut_held_streams() {
  const Clock::time_point now = Clock::now();
  for (H2Stream* s : sending_) {
    if (held_by_client(*s) && s->moved_at + options().write_timeout <= now) {
      reset_stream(*s, ErrorCode::kCancel);  // framed no more: it leaves the list below
    }
  }
}

void Http2Connection::write_loop() {
  while (!writer_failed_) {
    frame_bodies();
    session_.take_output(out_);
    if (!out_.empty()) {
      if (!stream_.write_all(out_, Deadline::after(shared_.options.write_timeout))) {
        writer_failed_ = true;
      }
      continue;
    }
    // After a connection error's GOAWAY (written above), nothing more: the connection closes.
    if (session_.failed()) {
      stop_reader();
      break;
    }
    // The reader is done, or the connection parks: what could be sent is sent (no
    // WINDOW_UPDATE can come any more).
    if (stopping_ || parking_ || this_fiber::stop_requested()) break;
    if (notice_sent_ && !goaway_sent_) {
      // A client that does not answer the shutdown PING in time gets the final GOAWAY anyway.
      writer_wake_.reset();
      if (writer_wake_.wait(notice_deadline_) == std::errc::timed_out) shut_down(true);
      continue;
    }
    // Nobody ran since the output was taken: no wake-up can be missed. Streams whose answer
    // the client's windows hold may wait the write timeout, no longer.
    writer_wake_.reset();
    if (writer_wake_.wait(first_held_too_long()) == std::errc::timed_out) cut_held_streams();
  }
  if (writer_failed_) stop_reader();
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
  return open_.empty() && due_.empty() && !notice_sent_ && !goaway_sent_ && !session_.closing() &&
         handlers_.count() == 0 && stream_.drained();
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
      auto waited = reader_wake_.wait(deadline);
      stream_.cancel_on_readable();
      if (waited == std::errc::timed_out && parkable) {
        if (may_park()) return true;
        continue;
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
    // stream drained and comes back here to wait as above. (TLS may need to wait for the
    // socket to take its own bytes first: then the read waits, as long as it must.)
    auto n = stream_.read(buffer.span(), Deadline::no_wait());
    if (!n && n.error() == std::errc::timed_out) {
      if (stream_.drained()) continue;
      n = stream_.read(buffer.span(), Deadline::never());
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
