// The HTTP/1 driver of HttpServer: one activation of a connection reads, parses and answers
// requests in a loop on a fiber, until the connection closes or goes idle (server.cc keeps the
// connection between activations).
#include <fmt/format.h>
#include <sys/uio.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "response_head.h"
#include "server_internal.h"
#include "spindle/base/base64.h"
#include "spindle/base/log.h"
#include "spindle/fiber/buffer_pool.h"
#include "spindle/h1/chunked.h"
#include "spindle/h1/head_writer.h"
#include "spindle/http/canonical.h"
#include "spindle/http/status.h"
#include "spindle/net/stream.h"

namespace spindle::http {
namespace {

using namespace std::string_view_literals;
using detail::ConnectionBuffers;
using detail::DateCache;
using detail::WorkerState;

// Responses bigger than this are written from their own buffer instead of being copied.
constexpr std::size_t kCopyBodyLimit = 16 * 1024;
// How long a connection closed on an error drains what the client still sends.
constexpr auto kLingerTime = std::chrono::seconds(2);
// Response bytes a connection may queue for pipelined requests before it waits for the client
// to read them (one more response, up to kCopyBodyLimit of body, may go beyond it).
constexpr std::size_t kOutputBudget = 64 * 1024;

}  // namespace

namespace {

using detail::ConnectionState;

// A connection's read buffer: a block of its worker's slab, or a heap block of its own once
// a spill made it grow past the block (by one read at most, Connection::unspill).
class ReadBuffer {
 public:
  /// A block of `slab`: `taken` (one the runner read ahead into), or a new one.
  ReadBuffer(BlockSlab& slab, char* taken)
      : slab_(slab), data_(taken != nullptr ? taken : slab.take()), size_(slab.block_size()) {}
  ~ReadBuffer() {
    if (!grown_) slab_.give(data_);
  }
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;

  char* data() { return data_; }
  const char* data() const { return data_; }
  std::size_t size() const { return size_; }
  /// Makes it `size` bytes (more than now), its first `keep` bytes kept.
  void grow(std::size_t size, std::size_t keep) {
    auto bigger = std::make_unique_for_overwrite<char[]>(size);
    std::memcpy(bigger.get(), data_, keep);
    if (!grown_) slab_.give(data_);
    grown_ = std::move(bigger);
    data_ = grown_.get();
    size_ = size;
  }

 private:
  BlockSlab& slab_;
  char* data_;
  std::size_t size_;
  /// The heap block once grown.
  std::unique_ptr<char[]> grown_;
};

// One activation of an HTTP/1 connection: read, parse, answer, in a loop, on a fiber, until
// the connection closes or goes idle.
class Connection final : public BodySource, public ContextSource, public InterimSink {
 public:
  /// How an activation ended.
  enum class Outcome { kClose, kIdle, kHttp2 };

  Connection(ConnectionState& state, bool batched)
      : state_(state),
        stream_(state.stream),
        options_(state.shared->options),
        router_(state.shared->router),
        date_(state.worker->date),
        shared_(*state.shared),
        parser_(options_.parser),
        buffer_(worker_buffers(state).reads(detail::read_buffer_size(options_)),
                std::exchange(state.read_ahead, nullptr)),
        end_(std::exchange(state.read_ahead_size, 0)),
        out_(state.unsent.empty() ? reused_output(*state.worker->buffers)
                                  : std::move(state.unsent)),
        // An activation that begins with the rest of an unsent response writes it itself,
        // waiting for the socket as needed; so does a TLS connection, whose records and their
        // buffers are OpenSSL's.
        batched_(batched && out_.empty() && state.stream.tcp() != nullptr) {
    state.unsent.clear();
  }
  ~Connection() { state_.worker->buffers->recycle_output(std::move(out_)); }

  Outcome serve();
  /// A response buffer that has grown before, if the worker has one: no reallocation while a
  /// head is appended. Otherwise the first response (queue) makes one: a connection that
  /// turns out to be HTTP/2 never needs it.
  static std::string reused_output(ConnectionBuffers& pools) {
    return pools.outputs.empty() ? std::string() : pools.outputs.take();
  }
  /// The worker's connection buffers, made by its first connection.
  static detail::ConnectionBuffers& worker_buffers(ConnectionState& state) {
    if (!state.worker->buffers) {
      state.worker->buffers = std::make_shared<detail::ConnectionBuffers>();
      Worker::current()->keep_trimmed(state.worker->buffers);
    }
    return *state.worker->buffers;
  }
  /// After serve() returned kHttp2: serves the connection as HTTP/2 (prior knowledge or h2c
  /// upgrade) until it ends or goes idle.
  detail::Activation switch_to_http2();
  /// True if the connection closes while the client may still be sending (an error answer, a
  /// body left unread): it should linger rather than reset.
  bool should_linger() const { return linger_; }

  /// The current request's body, as its handler reads it (throws HttpError on failure).
  std::size_t read(std::span<char> buffer) override;

 private:
  enum class Read { kData, kClosed, kTimedOut, kFailed };
  /// Where the current request's body stands.
  enum class BodyState { kDone, kSized, kChunked, kFailed };

  /// Reads more bytes into the buffer (flushing queued responses first).
  Read read_more(Deadline deadline);
  /// Sets up reading the body the head announces; false (after queuing a 413) if it is over
  /// the limit, which ends the connection.
  bool start_body();
  /// Reads body bytes into `buffer`: a count, 0 at the end, or -1 once it failed (body_status_
  /// and body_reason_ say why).
  std::ptrdiff_t pull_body(std::span<char> buffer);
  std::ptrdiff_t pull_chunked(std::span<char> buffer);
  /// Marks the body failed with `status`; returns -1.
  std::ptrdiff_t fail_body(int status, std::string_view reason);
  /// After the handler: reads and drops what it left of the body. False if the connection
  /// cannot carry another request (the body failed, or the client still waits for a 100).
  bool finish_body();
  /// Takes up to `n` buffered bytes (spill first, then the buffer).
  std::string_view take_buffered(std::size_t n);
  /// Answers every complete request already buffered (the responses queue up in out_): how
  /// the activation ends, or nullopt once what is left is not a whole request.
  std::optional<Outcome> answer_buffered();
  /// Answers the request whose head was just parsed: how the activation ends, or nullopt if
  /// the connection carries on.
  std::optional<Outcome> answer_request();
  /// Answers a head the parser rejected (`status`) and closes: its framing cannot be trusted.
  Outcome reject(int status, std::string_view reason);
  /// Runs the handler (or answers 400 for `bad_request`) while watching for the client to go.
  Response run_handler(Request& request, const std::optional<BadRequest>& bad_request);
  /// True if the connection may carry another request after the current one.
  bool may_continue() const;
  /// Sends the head that opens a tunnel, then hands the socket to the response's takeover.
  Outcome hand_over(Response& response);
  /// With nothing buffered: goes idle, or reads what arrived meanwhile (nullopt: read more).
  std::optional<Outcome> read_when_idle();
  /// With a partial head buffered: reads on within the header timeout (nullopt: read more).
  std::optional<Outcome> read_rest_of_head();
  /// Runs the router, turning exceptions into responses.
  Response respond(Request& request);
  /// Serializes `response` for the current head into the output queue.
  void queue(Response& response, bool head_only, bool close);
  /// Runs a streamed body's producer, writing chunks (HTTP/1.1, length unknown) or raw bytes
  /// (a known length, or HTTP/1.0).
  void stream_body(const BodyProducer& producer, std::optional<std::uint64_t> length,
                   std::string_view first);
  /// Records the request just answered in the access log.
  void log_access(const Request& request, const Response& response, Clock::time_point handled_at);
  /// Records a request the parser rejected (method and target "-", as nginx logs them).
  void log_rejected(int status);
  /// The client's address as text, looked up once per connection.
  const std::string& remote();
  /// The request context: the connection's facts (once per connection) and the time now.
  const RequestContext& request_context() override;
  /// While a handler runs, nothing reads the socket: the reactor calls this when it turns
  /// readable. A hang-up (FIN or reset) means the client has gone, as nginx takes it: the
  /// request's on_client_gone callback runs, after this batch of events, so that the
  /// handler's upstream wait ends. Bytes of a pipelined request only re-arm the watch.
  static void watch_client(IoSlot& slot);
  /// Writes an interim response now (queued responses before it), on HTTP/1.1 only; a 100
  /// only while one is owed (it is then not owed any more).
  bool send_interim(int status, const HeaderMap& fields) override;
  /// Queues a bare error response.
  void queue_error(int status, std::string_view reason);
  /// Writes everything queued; false if the connection failed.
  bool flush();
  /// In a runner's batch, at the end of an activation that goes idle: leaves what is queued
  /// for the runner to write after the batch (WorkerState::unsent).
  void leave_unsent();
  /// Moves unparsed bytes to the front of the buffer.
  void compact();
  /// After a request: the bytes read past its body go back into the buffer, in order.
  void unspill();
  /// At the start of a cleartext connection: 1 if the buffer holds the HTTP/2 client preface,
  /// 0 if it may still (a prefix of it), -1 if not.
  int http2_preface() const;
  /// Makes the request just parsed the canonical request (canonical.h), its target rewritten
  /// in the read buffer; why it cannot be, if so.
  std::optional<BadRequest> canonicalize();
  /// If the request just parsed asks for h2c (RFC 7540 3.2) and may have it, answers 101 and
  /// returns true (upgrade_ is set).
  bool accept_h2c_upgrade();

  ConnectionState& state_;
  Stream& stream_;
  const ServerOptions& options_;
  const Router& router_;
  DateCache& date_;
  HttpServer::Shared& shared_;
  RequestParser parser_;
  RequestHead head_;
  /// Read buffer: [begin_, end_) is received but not yet parsed.
  ReadBuffer buffer_;
  std::size_t begin_ = 0, end_ = 0;
  /// Bytes read past a body while the head still pointed into buffer_; they go back in after.
  std::string spill_;
  std::size_t spill_begin_ = 0;
  /// Response bytes waiting for the next write, and a large body to write after them.
  std::string out_;
  std::string big_body_;
  /// The running request's on_client_gone callback (see watch_client).
  ClientGone client_gone_;
  /// Set when a response could not be sent whole: nothing more can follow it.
  bool broken_ = false;
  /// The current request's body: its state, bytes left (sized), decoder (chunked), payload
  /// decoded but not yet handed out, whether a 100 Continue is still owed, and why it failed.
  BodyState body_state_ = BodyState::kDone;
  std::uint64_t body_left_ = 0;
  ChunkedDecoder decoder_;
  std::string_view body_pending_;
  bool continue_due_ = false;
  int body_status_ = 0;
  std::string_view body_reason_;
  /// The h2c upgrade request, once accepted.
  std::optional<detail::Http2Upgrade> upgrade_;
  /// When the current head began, taken only once a head turns out partial (then the header
  /// timeout runs from it): a complete head never pays for the clock.
  Clock::time_point head_started_{};
  /// See should_linger().
  bool linger_ = false;
  /// Served in a runner's batch: see leave_unsent().
  bool batched_;
};

constexpr std::string_view kHttp2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

int Connection::http2_preface() const {
  if (!options_.http2 || state_.requests != 0 || stream_.tls() != nullptr) return -1;
  std::string_view have(buffer_.data() + begin_, end_ - begin_);
  if (have.size() >= kHttp2Preface.size()) return have.starts_with(kHttp2Preface) ? 1 : -1;
  return kHttp2Preface.starts_with(have) ? 0 : -1;
}

std::optional<BadRequest> Connection::canonicalize() {
  // The target is a view into buffer_, which this connection owns: rewritten where it lies.
  char* target = buffer_.data() + (head_.target.data() - buffer_.data());
  return canonicalize_request(head_, target, options_.paths);
}

bool Connection::accept_h2c_upgrade() {
  if (!options_.http2 || stream_.tls() != nullptr || head_.minor_version != 1) return false;
  if (!head_.headers.has_token(token::kUpgrade, "h2c") ||
      !head_.headers.has_token(token::kConnection, "upgrade") ||
      !head_.headers.has_token(token::kConnection, "http2-settings")) {
    return false;
  }
  auto settings = head_.headers.get(token::kHttp2Settings);
  if (!settings || head_.headers.count(token::kHttp2Settings) != 1) return false;
  auto decoded = base64url_decode(*settings);
  // Only requests without a body switch (the body would have to be read first); others are
  // answered over HTTP/1.1, which the Upgrade rules allow.
  if (!decoded || head_.chunked || head_.content_length.value_or(0) != 0) return false;
  upgrade_ = detail::Http2Upgrade{.head = &head_, .settings = std::move(*decoded), .body = {}};
  out_ += "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"sv;
  return flush();
}

detail::Activation Connection::switch_to_http2() {
  std::string preread(spill_.data() + spill_begin_, spill_.size() - spill_begin_);
  preread.append(buffer_.data() + begin_, end_ - begin_);
  return detail::serve_http2(state_, preread, upgrade_ ? &*upgrade_ : nullptr);
}

Connection::Read Connection::read_more(Deadline deadline) {
  if (!flush()) return Read::kFailed;
  if (end_ == buffer_.size()) compact();
  std::size_t space = buffer_.size() - end_;
  auto n = stream_.read({buffer_.data() + end_, space}, deadline);
  if (!n) return n.error() == std::errc::timed_out ? Read::kTimedOut : Read::kFailed;
  if (*n == 0) return Read::kClosed;
  end_ += *n;
  return Read::kData;
}

void Connection::unspill() {
  // While spill_ holds bytes, the buffer holds none unparsed (pull_chunked moved them there):
  // all of spill_ goes back, ahead of anything read later. Leaving part of it behind would put
  // later bytes before earlier ones: the next request's body taken from what follows it, and
  // a request hidden in a body executed. The buffer grows if it must (by one read at most).
  if (spill_begin_ < spill_.size()) {
    compact();
    std::size_t n = spill_.size() - spill_begin_;
    if (buffer_.size() - end_ < n) buffer_.grow(end_ + n, end_);
    std::memcpy(buffer_.data() + end_, spill_.data() + spill_begin_, n);
    end_ += n;
  }
  spill_.clear();
  spill_begin_ = 0;
}

void Connection::compact() {
  if (begin_ == 0) return;
  std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
  end_ -= begin_;
  begin_ = 0;
}

std::string_view Connection::take_buffered(std::size_t n) {
  if (spill_begin_ < spill_.size()) {
    std::string_view s = std::string_view(spill_).substr(spill_begin_, n);
    spill_begin_ += s.size();
    return s;
  }
  std::string_view s(buffer_.data() + begin_, std::min(n, end_ - begin_));
  begin_ += s.size();
  return s;
}

bool Connection::start_body() {
  continue_due_ = false;
  body_pending_ = {};
  if (head_.chunked) {
    body_state_ = BodyState::kChunked;
    decoder_ = ChunkedDecoder(options_.max_body);
  } else {
    body_left_ = head_.content_length.value_or(0);
    if (body_left_ > options_.max_body) {
      queue_error(413, "body too large");
      return false;
    }
    body_state_ = body_left_ == 0 ? BodyState::kDone : BodyState::kSized;
  }
  // The client waits for a 100 before it sends the body: owed until the handler reads.
  if (body_state_ != BodyState::kDone && head_.expect_continue) {
    continue_due_ = spill_begin_ == spill_.size() && begin_ == end_;
  }
  return true;
}

std::ptrdiff_t Connection::fail_body(int status, std::string_view reason) {
  body_state_ = BodyState::kFailed;
  body_status_ = status;
  body_reason_ = reason;
  return -1;
}

std::ptrdiff_t Connection::pull_body(std::span<char> buffer) {
  if (body_state_ == BodyState::kFailed) return -1;
  if (body_state_ == BodyState::kDone || buffer.empty()) return 0;
  if (continue_due_) {
    continue_due_ = false;
    out_ += "HTTP/1.1 100 Continue\r\n\r\n"sv;
  }
  if (body_state_ == BodyState::kChunked) return pull_chunked(buffer);
  std::size_t want = std::min<std::uint64_t>(buffer.size(), body_left_);
  std::string_view buffered = take_buffered(want);
  std::size_t n = buffered.size();
  if (n > 0) {
    std::memcpy(buffer.data(), buffered.data(), n);
  } else {
    // Straight into the handler's buffer: the read buffer still holds the head it sees.
    if (!flush()) return fail_body(400, "connection failed");
    auto got = stream_.read(buffer.first(want), Deadline::after(options_.body_timeout));
    if (!got && got.error() == std::errc::timed_out) {
      return fail_body(408, "request body too slow");
    }
    if (!got || *got == 0) return fail_body(400, "request body cut short");
    n = *got;
  }
  body_left_ -= n;
  if (body_left_ == 0) body_state_ = BodyState::kDone;
  return static_cast<std::ptrdiff_t>(n);
}

std::ptrdiff_t Connection::pull_chunked(std::span<char> buffer) {
  // Decode what is buffered; when more is needed, move the rest to spill_ and read there.
  // Decoded payload is a view into spill_ or buffer_, which stay put until it is handed out.
  for (;;) {
    if (!body_pending_.empty()) {
      std::size_t n = std::min(buffer.size(), body_pending_.size());
      std::memcpy(buffer.data(), body_pending_.data(), n);
      body_pending_.remove_prefix(n);
      return static_cast<std::ptrdiff_t>(n);
    }
    bool from_spill = spill_begin_ < spill_.size() || begin_ == end_;
    std::string_view input = from_spill ? std::string_view(spill_).substr(spill_begin_)
                                        : std::string_view(buffer_.data() + begin_, end_ - begin_);
    auto step = decoder_.next(input);
    if (step.kind == ChunkedDecoder::Step::Kind::kError) {
      return fail_body(step.status, step.reason);
    }
    (from_spill ? spill_begin_ : begin_) += step.consumed;
    if (step.kind == ChunkedDecoder::Step::Kind::kData) {
      body_pending_ = step.data;
      continue;
    }
    if (step.kind == ChunkedDecoder::Step::Kind::kDone) {
      body_state_ = BodyState::kDone;
      return 0;
    }
    // Need more: gather the undecoded tail in spill_ and read after it.
    if (!from_spill) {
      spill_.assign(buffer_.data() + begin_, end_ - begin_);
      spill_begin_ = 0;
      begin_ = end_;
    } else if (spill_begin_ > 0) {
      spill_.erase(0, spill_begin_);
      spill_begin_ = 0;
    }
    if (!flush()) return fail_body(400, "connection failed");
    // Straight into spill_ (not a buffer on the fiber's stack, which is small).
    constexpr std::size_t kChunk = 16 * 1024;
    std::size_t at = spill_.size();
    spill_.resize(at + kChunk);
    auto n = stream_.read({spill_.data() + at, kChunk}, Deadline::after(options_.body_timeout));
    spill_.resize(at + (n ? *n : 0));
    if (!n && n.error() == std::errc::timed_out) return fail_body(408, "request body too slow");
    if (!n || *n == 0) return fail_body(400, "request body cut short");
  }
}

std::size_t Connection::read(std::span<char> buffer) {
  std::ptrdiff_t n = pull_body(buffer);
  if (n < 0) throw HttpError(body_status_, std::string(body_reason_));
  return static_cast<std::size_t>(n);
}

bool Connection::finish_body() {
  if (body_state_ == BodyState::kDone) return true;
  // A client still waiting for its 100 Continue would send the body only after a pause:
  // closing is quicker for both than asking for a body nobody reads.
  if (body_state_ == BodyState::kFailed || continue_due_) return false;
  // Dropped bytes go to a buffer lent to this connection alone (the read may park).
  BufferPool::Buffer sink = take_buffer();
  std::ptrdiff_t n;
  while ((n = pull_body(sink.span())) > 0) {
  }
  return n == 0;
}

void Connection::watch_client(IoSlot& slot) {
  auto* self = static_cast<Connection*>(slot.owner);
  if (!slot.hung_up) {
    slot.on_readable = &Connection::watch_client;  // the next request: watch on
    return;
  }
  if (self->client_gone_) {
    // Posted: this runs in the reactor's loop, where other sockets may not be closed.
    Worker::current()->post([gone = std::move(self->client_gone_)]() mutable { gone(); });
  }
}

bool Connection::send_interim(int status, const HeaderMap& fields) {
  if (head_.minor_version == 0 || broken_) return false;  // HTTP/1.0 knows no 1xx
  if (status == 100) {
    if (!continue_due_) return false;  // sent, or the client sends its body unasked
    continue_due_ = false;
  }
  out_.append("HTTP/1.1 ").append(std::to_string(status)).append(" ");
  out_.append(reason_phrase(status)).append("\r\n");
  NominatedFields nominated(fields);
  for (const Field& f : fields) {
    if (detail::interim_field_sendable(f, nominated))
      out_.append(f.name).append(": ").append(f.value) += "\r\n";
  }
  out_ += "\r\n";
  return flush();
}

Response Connection::respond(Request& request) { return detail::call_router(router_, request); }

void Connection::queue(Response& response, bool head_only, bool close) {
  detail::ResponseBodyPlan plan = detail::plan_response_body(response, head_only);
  // Chunks carry a streamed body of unknown length. An HTTP/1.0 client cannot take them: its
  // body ends when the connection does.
  bool chunked = plan.streamed && !plan.content_length;
  if (chunked && head_.minor_version == 0) close = true;
  std::string_view status = status_line(response.status);
  // The head is written in one go: its size is bounded first (fixed lines, fields, 20 digits
  // of Content-Length), then each piece is copied in, with no capacity check per piece.
  std::string_view date = date_.line();
  std::size_t bound = status.size() + date.size() + shared_.server_line.size() + 80;
  for (const Field& f : response.headers) bound += f.name.size() + f.value.size() + 4;
  std::size_t at = out_.size();
  if (out_.capacity() < ConnectionBuffers::kOutputReserve) {
    out_.reserve(ConnectionBuffers::kOutputReserve);
  }
  out_.resize_and_overwrite(at + bound, [&](char* data, std::size_t) {
    detail::HeadWriter w{data + at};
    w.put(status);
    detail::HandlerFields seen =
        detail::each_response_field(response, [&](const Field& f) { w.field(f.name, f.value); });
    if (!seen.has_date) w.put(date);
    if (!seen.has_server) w.put(shared_.server_line);
    if (chunked && head_.minor_version == 1) {
      w.put("Transfer-Encoding: chunked\r\n"sv);
    } else if (plan.content_length) {
      w.put("Content-Length: "sv);
      w.number(*plan.content_length);
      w.put("\r\n"sv);
    }
    if (close) {
      w.put("Connection: close\r\n"sv);
    } else if (head_.minor_version == 0) {
      w.put("Connection: keep-alive\r\n"sv);
    }
    w.put("\r\n"sv);
    return static_cast<std::size_t>(w.at - data);
  });
  bool streamed = plan.streamed;
  if (!plan.send_body) return;  // a HEAD response has no body, not even a chunked end
  if (streamed) {
    stream_body(response.stream, plan.content_length, response.body);
    if (chunked && head_.minor_version == 0) broken_ = true;  // the close ends the body
    return;
  }
  if (response.file && response.file->length <= kCopyBodyLimit) {
    // A small file joins the head (and any pipelined neighbours) in one write: cheaper than a
    // second syscall and a second TCP segment for sendfile.
    std::size_t at = out_.size();
    out_.resize(at + response.file->length);
    ssize_t n = ::pread(response.file->fd->get(), out_.data() + at, response.file->length,
                        static_cast<off_t>(response.file->offset));
    if (n != static_cast<ssize_t>(response.file->length)) {
      out_.resize(at);
      broken_ = true;  // the file shrank or failed: the promised length cannot be kept
    }
    return;
  }
  if (response.file) {
    // The head goes first, then the kernel copies the file straight to the socket.
    if (!flush()) return;
    auto sent =
        stream_.sendfile(response.file->fd->get(), static_cast<off_t>(response.file->offset),
                         response.file->length, Deadline::after(options_.write_timeout));
    // A failed or short send (the file shrank) breaks the framing: the connection must close.
    if (!sent || *sent != response.file->length) broken_ = true;
    return;
  }
  if (response.body.size() <= kCopyBodyLimit) {
    out_ += response.body;
  } else {
    big_body_ = std::move(response.body);
    (void)flush();  // keeps responses in order; a failure shows on the next read
  }
}

// Sends each piece straight to the socket: framed as a chunk when the body is chunked, else
// raw, and then held to the announced length.
class ChunkWriter final : public BodyWriter {
 public:
  /// `pending` (the response head, and any queued before it) goes out with the first piece.
  ChunkWriter(Stream& stream, std::string& pending, bool chunked,
              std::optional<std::uint64_t> length, std::chrono::milliseconds timeout)
      : stream_(stream), pending_(pending), chunked_(chunked), length_(length), timeout_(timeout) {}

  bool write(std::string_view data) override {
    if (failed_) return false;
    if (data.empty()) return true;
    if (length_ && data.size() > *length_ - written_) {
      failed_ = true;  // more than announced: it cannot go out, and the body is now short
      return false;
    }
    char size[24];
    auto head = fmt::format_to_n(size, sizeof size, "{:x}\r\n", data.size());
    iovec parts[4];
    std::size_t n = 0;
    if (!pending_.empty()) parts[n++] = {pending_.data(), pending_.size()};
    if (chunked_) parts[n++] = {size, head.size};
    parts[n++] = {const_cast<char*>(data.data()), data.size()};
    if (chunked_) parts[n++] = {const_cast<char*>("\r\n"), 2};
    failed_ = !stream_.writev({parts, n}, Deadline::after(timeout_));
    pending_.clear();
    written_ += data.size();
    return !failed_;
  }
  void set_trailers(const HeaderMap& trailers) override {
    trailers_.clear();
    for (const Field& f : trailers) {
      if (!is_trailer_sendable(f.name, f.value)) continue;
      trailers_.append(f.name).append(": ").append(f.value).append("\r\n");
    }
  }
  /// Ends the body; false if any write failed or a sized body fell short.
  bool finish() {
    if (!failed_ && chunked_) {
      std::string last = "0\r\n" + trailers_ + "\r\n";
      failed_ = !stream_.write_all(std::string_view(last), Deadline::after(timeout_));
    }
    pending_.clear();
    if (length_ && written_ != *length_) failed_ = true;
    return !failed_;
  }

 private:
  Stream& stream_;
  std::string& pending_;
  bool chunked_;
  std::optional<std::uint64_t> length_;
  std::uint64_t written_ = 0;
  std::chrono::milliseconds timeout_;
  std::string trailers_;
  bool failed_ = false;
};

void Connection::stream_body(const BodyProducer& producer, std::optional<std::uint64_t> length,
                             std::string_view first) {
  ChunkWriter writer(stream_, out_, head_.minor_version == 1 && !length, length,
                     options_.write_timeout);
  try {
    if (!first.empty()) {
      (void)writer.write(first);  // with the head, in one write
    } else if (!flush()) {
      broken_ = true;  // the head goes first, so that a producer that waits has sent it
      return;
    }
    producer(writer);
  } catch (const std::exception& e) {
    // The head is gone: the only way to tell the client is to end the connection mid-body.
    log_error("streamed body of {} {} threw: {}", head_.method, head_.target, e.what());
    broken_ = true;
    return;
  } catch (...) {
    log_error("streamed body of {} {} threw an exception of unknown type", head_.method,
              head_.target);
    broken_ = true;
    return;
  }
  if (!writer.finish()) broken_ = true;
}

const std::string& Connection::remote() { return state_.remote_text(); }

const RequestContext& Connection::request_context() { return state_.request_context(1); }

void Connection::log_rejected(int status) {
  options_.access_log->record(AccessRecord{
      .remote = remote(), .method = "-", .target = "-", .minor_version = 1, .status = status});
}

void Connection::log_access(const Request& request, const Response& response,
                            Clock::time_point handled_at) {
  options_.access_log->record(
      detail::access_record(head_, response, remote(), 1, handled_at, request.attributes()));
}

void Connection::queue_error(int status, std::string_view reason) {
  linger_ = true;  // the client may be sending still: its bytes must not turn our FIN into a reset
  Response response = Response::error(status, reason);
  queue(response, false, true);
}

void Connection::leave_unsent() {
  if (out_.empty()) return;
  state_.unsent = std::move(out_);
  out_.clear();
  state_.worker->unsent.push_back(&state_);
}

bool Connection::flush() {
  if (out_.empty() && big_body_.empty()) return true;
  iovec parts[2] = {{out_.data(), out_.size()}, {big_body_.data(), big_body_.size()}};
  auto written = stream_.writev({parts, big_body_.empty() ? 1u : 2u},
                                Deadline::after_coarse(options_.write_timeout));
  out_.clear();
  big_body_.clear();
  return written.has_value();
}

Connection::Outcome Connection::serve() {
  for (;;) {
    if (std::optional<Outcome> ended = answer_buffered()) return *ended;
    // Nothing complete left: write the batch, then look for more.
    std::optional<Outcome> ended = begin_ == end_ ? read_when_idle() : read_rest_of_head();
    if (ended) return *ended;
  }
}

std::optional<Connection::Outcome> Connection::answer_buffered() {
  for (;;) {
    // Past the budget of queued output, the client must read before another pipelined
    // request is parsed: what a connection holds is bounded, whatever it sends.
    if (out_.size() >= kOutputBudget && !flush()) return Outcome::kClose;
    if (begin_ == end_ && spill_begin_ == spill_.size()) {
      begin_ = end_ = 0;
      return std::nullopt;
    }
    if (int preface = http2_preface(); preface >= 0) {
      if (preface == 0) return std::nullopt;  // a prefix of the preface so far: read on
      return Outcome::kHttp2;
    } else if (options_.http2_only && state_.requests == 0 && stream_.tls() == nullptr) {
      return Outcome::kClose;  // not HTTP/2 on an HTTP/2-only port
    }
    auto parsed = parser_.parse({buffer_.data() + begin_, end_ - begin_}, head_);
    if (parsed.state == ParseResult::State::kIncomplete) return std::nullopt;
    parser_.reset();
    if (parsed.state == ParseResult::State::kError) return reject(parsed.status, parsed.reason);
    begin_ += parsed.consumed;
    if (std::optional<Outcome> ended = answer_request()) return *ended;
  }
}

Connection::Outcome Connection::reject(int status, std::string_view reason) {
  queue_error(status, reason);
  if (options_.access_log) log_rejected(status);
  (void)flush();
  return Outcome::kClose;
}

std::optional<Connection::Outcome> Connection::answer_request() {
  // A request that cannot be made canonical is answered 400 without routing; its framing
  // is sound, so the connection goes on.
  std::optional<BadRequest> bad_request = canonicalize();
  if (!bad_request && accept_h2c_upgrade()) return Outcome::kHttp2;
  if (!start_body()) {
    (void)flush();
    return Outcome::kClose;
  }
  auto handled_at = options_.access_log ? Clock::now() : Clock::time_point{};
  Request request(head_, *this);
  Response response = run_handler(request, bad_request);
  ++state_.requests;
  if (options_.access_log) log_access(request, response, handled_at);
  bool body_left = !finish_body();
  linger_ = linger_ || body_left;
  if (opens_tunnel(response.status, head_.method == "CONNECT") && response.takeover) {
    return hand_over(response);  // the connection becomes the handler's
  }
  bool close = body_left || !may_continue();
  queue(response, head_.method == "HEAD", close);
  if (broken_) return Outcome::kClose;
  if (close) {
    (void)flush();  // the request was read whole, so closing sends a FIN, not a reset
    return Outcome::kClose;
  }
  unspill();
  head_started_ = {};
  return std::nullopt;
}

Response Connection::run_handler(Request& request, const std::optional<BadRequest>& bad_request) {
  request.set_context_source(this);
  request.set_interim_sink(this);
  request.set_client_gone_slot(&client_gone_);
  stream_.on_readable(&Connection::watch_client, this);
  Response response = bad_request ? Response::error(400, bad_request->reason) : respond(request);
  stream_.cancel_on_readable();
  client_gone_ = nullptr;
  return response;
}

bool Connection::may_continue() const {
  return head_.keep_alive && !shared_.draining.load(std::memory_order_acquire) &&
         (options_.max_requests_per_connection == 0 ||
          state_.requests < options_.max_requests_per_connection);
}

Connection::Outcome Connection::hand_over(Response& response) {
  // The 101 (or CONNECT's 2xx) head goes out, then the takeover gets the socket and whatever
  // the client sent past its request.
  queue(response, false, false);
  if (!flush()) return Outcome::kClose;
  std::string early(spill_.data() + spill_begin_, spill_.size() - spill_begin_);
  early.append(buffer_.data() + begin_, end_ - begin_);
  try {
    StreamTunnelEnd client(stream_);
    response.takeover(client, early);
  } catch (const std::exception& e) {
    log_error("connection takeover after {} {} threw: {}", head_.method, head_.target, e.what());
  } catch (...) {
    log_error("connection takeover after {} {} threw", head_.method, head_.target);
  }
  return Outcome::kClose;
}

std::optional<Connection::Outcome> Connection::read_when_idle() {
  // Idle: the fiber ends and the connection waits in the reactor, holding no stack and no
  // buffer. Edge-triggered readiness needs the socket drained first: the stream knows when
  // its last read proved it (as nginx's `ready` flag); otherwise one read attempt, without
  // waiting. A server shutting down closes instead of waiting, but still answers (with
  // Connection: close) a request that has arrived: its client may have sent it before
  // it could know. (A reconfigured one does not close: the last response may not have
  // said Connection: close, and the client may be sending its next request right now.)
  const Outcome idle =
      shared_.closing_idle.load(std::memory_order_acquire) ? Outcome::kClose : Outcome::kIdle;
  if (batched_ && idle == Outcome::kIdle && stream_.drained() && big_body_.empty()) {
    // The response goes with the batch's others, after them (run_ready_connections).
    leave_unsent();
    return idle;
  }
  if (!flush()) return Outcome::kClose;
  if (stream_.drained()) return idle;
  switch (read_more(Deadline::no_wait())) {
    case Read::kData:
      head_started_ = {};
      return std::nullopt;
    case Read::kTimedOut:
      return idle;
    case Read::kClosed:
    case Read::kFailed:
      break;
  }
  return Outcome::kClose;
}

std::optional<Connection::Outcome> Connection::read_rest_of_head() {
  // A partial head: it must be complete within the header timeout (slowloris).
  if (head_started_ == Clock::time_point{}) head_started_ = Clock::now();
  switch (read_more(Deadline::at(head_started_ + options_.header_timeout))) {
    case Read::kData:
      return std::nullopt;
    case Read::kTimedOut:
      queue_error(408, "request header too slow");
      (void)flush();
      break;
    case Read::kClosed:
    case Read::kFailed:
      break;
  }
  return Outcome::kClose;
}

}  // namespace

void detail::read_ahead(ConnectionState& state) {
  state.read_ahead_tried = true;
  TcpStream* tcp = state.stream.tcp();
  if (tcp == nullptr || state.http2 || !state.unsent.empty()) return;
  BlockSlab& slab =
      Connection::worker_buffers(state).reads(read_buffer_size(state.shared->options));
  char* block = slab.take();
  auto n = tcp->read({block, slab.block_size()}, Deadline::no_wait());
  if (!n || *n == 0) {
    // Nothing yet, the peer's close or an error: the activation reads again and sees it.
    slab.give(block);
    return;
  }
  state.read_ahead = block;
  state.read_ahead_size = *n;
}

detail::Activation detail::serve_http1(ConnectionState& state, bool batched) {
  Connection connection(state, batched);
  Connection::Outcome outcome = connection.serve();
  if (outcome == Connection::Outcome::kHttp2) return connection.switch_to_http2();
  if (outcome == Connection::Outcome::kClose && connection.should_linger()) {
    state.stream.linger(Deadline::after(kLingerTime));
  }
  return outcome == Connection::Outcome::kIdle ? Activation::kIdle : Activation::kClose;
}

}  // namespace spindle::http
