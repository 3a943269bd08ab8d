#pragma once
// The HTTP/2 driver of HttpServer (private to src/server): spindle's own protocol code
// (h2::ServerSession: bytes in, events and frames out, no I/O) does the protocol; the driver
// moves the bytes and runs each stream's handler as sequential code with the same
// Request/Response/router as HTTP/1.1.
//
// One connection is three kinds of fiber on one worker: the reader (the activation's fiber:
// socket -> session, which calls back to open streams and hand them body bytes), the writer
// (moves what the streams have to send into frames as the windows allow, then writes the
// session's output: one write per turn, whatever the number of streams) and handler fibers,
// which run the due handlers one after another (another stands by whenever more wait, so a
// handler that parks holds up no other). They never run at once (one worker), so the session
// needs no lock; none of them parks inside a session call. Idle, the connection has none.
//
// http2_connection.cc has the session's events, the streams' handlers and the reader;
// http2_output.cc what the streams send (heads, bodies as the windows allow) and the writer.

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server_internal.h"
#include "spindle/base/block_cache.h"
#include "spindle/base/byte_queue.h"
#include "spindle/base/intrusive_ptr.h"
#include "spindle/h2/session.h"
#include "spindle/sync/event.h"
#include "spindle/sync/wait_group.h"

namespace spindle::http::detail {

/// A budget of events: `burst` at once, refilled at `rate` per second.
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

class H2Stream;
/// A stream's owners (the connection's lists, its handler) share it by a count of its own:
/// all on one worker, so not the atomic count of a shared_ptr (three locked instructions a
/// request).
using StreamRef = IntrusivePtr<H2Stream>;

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
  /// Marks fields_ sensitive when `fields` came never indexed (RFC 7541 §6.2.3).
  void mark_sensitive_if_never_indexed(const HeaderMap& fields);

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
  void reset_stream(H2Stream& s, h2::ErrorCode code);
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
  void on_never_indexed(std::uint32_t id, const Field& field) override;
  void on_headers(std::uint32_t id, bool end_stream, bool trailers) override;
  void on_data(std::uint32_t id, std::span<const std::uint8_t> data, bool end_stream) override;
  void on_reset(std::uint32_t id, h2::ErrorCode code) override;
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
  /// Drops the body bytes of `s` nobody will read: their window goes back to the connection
  /// (else each stream that ends before its body is read takes that much of it for good).
  void give_back_unread(H2Stream& s);
  /// The request head pending in the session (session_.head_pending) must be whole by then
  /// (timeouts.header, as on HTTP/1.1): never while none is. Notes when one began.
  Deadline head_deadline();
  /// A head took longer: GOAWAY naming the last stream begun whole (the one being read was not
  /// processed); the connection ends, and the memory the block held with it.
  void head_too_slow();
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
  /// When the request head the session is reading began (see head_deadline); {} while none is.
  Clock::time_point head_started_{};
  /// The reader's fiber while an activation runs.
  Fiber* reader_ = nullptr;
};

/// One request/response exchange. Shared by the connection's list (until it is done there) and
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

}  // namespace spindle::http::detail
