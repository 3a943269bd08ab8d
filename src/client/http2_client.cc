// The HTTP/2 client session and its streaming exchanges, on spindle's own protocol code
// (h2::ClientSession: bytes in, events and frames out, no I/O). Everything runs on one worker:
// the reader fiber feeds the session, the writer fiber frames the request bodies as the
// windows allow and writes the session's output (one write per turn), and each exchange waits
// on its own stream's state. write() waits while 64 KiB of its body are still unsent; response
// bodies are acknowledged on their stream (WINDOW_UPDATE) only as the exchange reads them, so a
// slow reader holds at most one stream window of the upstream's bytes; the connection's window
// reopens as the bytes arrive, so that reader holds up no other stream.
#include "http2_client.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <mutex>

#include "connections.h"
#include "spindle/base/ascii.h"
#include "spindle/base/block_cache.h"
#include "spindle/base/byte_queue.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/h2/session.h"
#include "spindle/h2/turns.h"
#include "spindle/http/rules.h"
#include "spindle/sync/event.h"
#include "spindle/sync/wait_list.h"

namespace spindle::http::detail {
namespace {

using h2::ErrorCode;
using HpackField = h2::hpack::Field;

// What a stream may receive ahead of its reader, and the connection as a whole in flight (its
// window reopens as the bytes arrive: what waits for readers is bounded by the streams').
constexpr std::uint32_t kStreamWindow = 256 * 1024;
constexpr std::uint32_t kConnectionWindow = 16 << 20;
// The most the decoded fields of one response head (or trailers) may add up to: what the
// HTTP/1.1 exchange allows a head, checked as the fields come (on_field). The session stops
// decoding at twice that (an HPACK bomb costs no more), past which the stream is reset.
constexpr auto kMaxHeaderList = static_cast<std::uint32_t>(kResponseHeadLimits.max_head);
// Request body bytes handed over but not yet sent, beyond which write() waits.
constexpr std::size_t kMaxUnsent = 64 * 1024;

// One stream's state, shared by the session (until the stream ends) and its exchange.
struct Call {
  // User-provided, so that allocate_shared does not zero the whole call (its head's inline
  // field storage is 2 KiB) before constructing it.
  Call() {}

  std::uint32_t id = 0;
  /// Its place in the order of opening: its HEADERS reached the socket once the writer has
  /// written past it (Impl::written_).
  std::uint64_t seq = 0;
  // The request body handed over and not yet framed; whether it ended, and was all sent.
  ByteQueue out;
  bool out_end = false;
  bool out_done = false;
  bool sending = false;
  std::unique_ptr<HeaderMap> out_trailers;  // made only for a request that has some
  // The response.
  ClientResponseHead head;
  bool have_head = false;
  // The fields of the head (or trailers) being received, counted against kResponseHeadLimits;
  // past them the response is malformed.
  std::size_t block_bytes = 0;
  std::size_t block_fields = 0;
  bool too_large = false;
  // A field of the head being received came never indexed (noted on the head once whole).
  bool never_indexed = false;
  // Interim (1xx) heads received and not yet passed to the exchange's callback.
  std::vector<ClientResponseHead> interim;
  ByteQueue in;
  bool in_end = false;
  std::unique_ptr<HeaderMap> trailers;  // made only for a response that has some
  // Set when the stream is over (error says how, if badly).
  bool closed = false;
  std::error_code error;
  // Set on any change a reader of the exchange may wait for.
  Event wake;
  // Set when the writer took bytes of `out`, or the stream ended: what write() waits for. Apart
  // from `wake`: a tunnel's two fibers wait at once, one to read and one to write, and one's
  // reset() must not swallow the other's wake-up.
  Event room;
};

h2::SessionLimits client_limits() {
  h2::SessionLimits limits;
  limits.stream_window = kStreamWindow;
  limits.connection_window = kConnectionWindow;
  limits.connection_window_on_receipt = true;  // one caller reading nothing stops nobody else
  limits.max_header_list_size = 2 * kMaxHeaderList;
  limits.max_header_block = 2 * kMaxHeaderList + 16384;
  return limits;
}

}  // namespace

struct Http2Session::Impl final : h2::SessionHandler {
  Stream stream;
  h2::ClientSession session{client_limits(), *this};
  h2::StreamTableOf<std::shared_ptr<Call>> calls;
  /// Calls with request body bytes (or its end) not yet framed, and whose turn is next.
  std::vector<Call*> sending;
  std::size_t next_sender = 0;
  Event writer_wake;
  /// Set once the server's first SETTINGS came (or the connection ended): an extended CONNECT
  /// waits for it, to know whether the server allows one (RFC 8441 §3).
  Event settings_came;
  /// open() calls waiting for room under the server's SETTINGS_MAX_CONCURRENT_STREAMS, first
  /// come first served: each stream that ends wakes one (waking them all would make every end
  /// cost as much as the queue is long).
  SpinLock room_lock;
  WaitList room;
  /// open() calls waiting in `room` now: a retiring connection waits for them too.
  std::size_t room_waiters = 0;
  /// Streams whose response was refused in the read being processed: reset after it.
  std::vector<std::uint32_t> refused;
  bool broken = false;
  /// Http2Session::retire: the connection ends with its last stream.
  bool retiring = false;
  /// When the last stream ended (while none is open).
  Clock::time_point last_end = coarse_now();
  /// Streams opened so far, and how many of them the writer has written.
  std::uint64_t opened = 0;
  std::uint64_t written = 0;
  /// The fields of a request being opened (reused; the session encodes them at once).
  std::vector<h2::hpack::Field> fields;
  std::string names;
  std::string out;

  Call* find(std::uint32_t id) {
    const std::shared_ptr<Call>* call = calls.find(id);
    return call == nullptr ? nullptr : call->get();
  }
  bool headers_sent(const Call& call) const { return call.seq <= written; }
  /// The stream of `call` is over (cleanly unless `why`): it leaves the session's list.
  void end_call(Call& call, std::error_code why = {}) {
    call.closed = true;
    if (!call.error) call.error = why;
    call.wake.set();
    call.room.set();
    if (call.sending) {
      call.sending = false;
      std::erase(sending, &call);
    }
    calls.erase(call.id);  // the exchange, if any, keeps its own reference
    if (calls.empty()) last_end = coarse_now();
    {
      std::lock_guard guard(room_lock);
      room.notify_one();
    }
    end_if_retired();
  }
  /// A retiring connection ends once no stream is open and no open() waits for room on it
  /// (the one woken opens its stream first).
  void end_if_retired() {
    if (retiring && !broken && calls.empty() && room_waiters == 0) close_now();
  }
  /// Ends the connection: nothing more goes on it, its fibers end.
  void close_now() {
    broken = true;
    release_waiters();
    (void)stream.shutdown(TcpStream::Shutdown::kBoth);
    writer_wake.set();
  }
  /// Wakes every open() waiting for room (the session can open no more).
  void release_waiters() {
    std::lock_guard guard(room_lock);
    room.notify_all();
  }
  void fail_all() {
    for (auto& [id, call] : calls) {
      if (call->closed) continue;
      call->closed = true;
      if (!headers_sent(*call)) {
        call->error = make_error_code(ExchangeErrc::kClosedBeforeWrite);
      } else if (!call->have_head) {
        call->error = make_error_code(ExchangeErrc::kClosedBeforeResponse);
      } else if (!call->in_end) {
        call->error = make_error_code(ExchangeErrc::kResponseCut);
      }
      call->wake.set();
      call->room.set();
    }
    calls.clear();
    sending.clear();
    release_waiters();
  }
  void want_to_send(Call& call) {
    if (!call.sending && !call.closed) {
      call.sending = true;
      sending.push_back(&call);
    }
    writer_wake.set();
  }
  /// Frames up to `budget` bytes of the request body of `call`; true once it is all sent.
  bool frame_body(Call& call, std::size_t budget);
  void frame_bodies();
  void read_loop();
  void write_loop();

  // The session's events, on the reader's fiber.
  void on_field(std::uint32_t id, const Field& field) override;
  void on_never_indexed(std::uint32_t id, const Field& field) override {
    // Passed on never indexed (RFC 7541 §6.2.3): the head (an interim head, the trailers)
    // goes on so whole (a credential always does).
    Call* call = find(id);
    if (call != nullptr &&
        (field.token == nullptr || (field.token->flags & field_flag::kSensitive) == 0)) {
      call->never_indexed = true;
    }
  }
  bool on_head_too_large(std::uint32_t id, bool /*end_stream*/) override {
    // A response head past what the session gathers: its reset (on_reset) is the upstream's
    // malformed answer, not a close to try again after.
    if (Call* call = find(id)) call->too_large = true;
    return false;
  }
  void on_headers(std::uint32_t id, bool end_stream, bool trailers) override;
  void on_data(std::uint32_t id, std::span<const std::uint8_t> data, bool end_stream) override;
  void on_reset(std::uint32_t id, ErrorCode code) override;
  void on_window(std::uint32_t /*id*/) override {
    if (!sending.empty()) writer_wake.set();
  }
  void on_goaway(std::uint32_t /*last_stream*/, ErrorCode /*code*/) override {
    release_waiters();  // no new stream on this connection: they go elsewhere
  }
};

void Http2Session::Impl::on_field(std::uint32_t id, const Field& field) {
  const auto& [name, value, token] = field;
  Call* call = find(id);
  if (call == nullptr || call->too_large) return;
  call->block_bytes += name.size() + value.size() + 32;
  call->block_fields += name.front() == ':' ? 0 : 1;
  if (call->block_bytes > kMaxHeaderList || call->block_fields > kResponseHeadLimits.max_headers) {
    call->too_large = true;
    return;
  }
  if (call->have_head) {
    if (call->trailers == nullptr) call->trailers = std::make_unique<HeaderMap>();
    call->trailers->add_lower_case(field);  // fields after the final head: trailers
  } else if (token == &token::kStatus) {
    // The session checked it: three digits, 100 to 599.
    std::from_chars(value.data(), value.data() + value.size(), call->head.status);
    call->head.headers.clear();
  } else {
    // An interim head's fields too (on_headers moves them).
    call->head.headers.add_lower_case(field);
  }
}

void Http2Session::Impl::on_headers(std::uint32_t id, bool end_stream, bool trailers) {
  Call* call = find(id);
  if (call == nullptr) return;
  call->block_bytes = call->block_fields = 0;
  if (call->too_large) {
    // Reset once the session has finished with this read (not from inside its callback).
    if (!end_stream) refused.push_back(id);
    return end_call(*call, make_error_code(ExchangeErrc::kProtocolError));
  }
  if (!trailers && call->head.status < 200) {
    // An interim head: the exchange passes it on from its own fiber (this is the reader's).
    if (call->head.status != 100) {
      ClientResponseHead& interim = call->interim.emplace_back();
      interim.status = call->head.status;
      interim.version = 20;
      interim.no_body = true;
      interim.headers = std::move(call->head.headers);
      if (call->never_indexed) interim.headers.mark_never_indexed();
    }
    call->head.status = 0;
    call->head.headers.clear();
    call->never_indexed = false;
    call->wake.set();
    return;
  }
  if (trailers) {
    if (call->never_indexed && call->trailers != nullptr) call->trailers->mark_never_indexed();
  } else {
    call->have_head = true;
    if (call->never_indexed) call->head.headers.mark_never_indexed();
    call->head.version = 20;
    if (auto length = call->head.headers.get(token::kContentLength)) {
      call->head.content_length = parse_content_length(*length);
    }
  }
  if (end_stream) {
    call->in_end = true;
    if (call->out_done) return end_call(*call);
    call->room.set();  // a body waiting for window may end now (write_by)
  }
  call->wake.set();
}

void Http2Session::Impl::on_data(std::uint32_t id, std::span<const std::uint8_t> data,
                                 bool end_stream) {
  Call* call = find(id);
  if (call == nullptr) {
    session.consumed(id, data.size());  // nobody reads it: the windows open all the same
    return;
  }
  call->in.append({reinterpret_cast<const char*>(data.data()), data.size()});
  if (end_stream) {
    call->in_end = true;
    if (call->out_done) return end_call(*call);
    call->room.set();  // a body waiting for window may end now (write_by)
  }
  call->wake.set();
}

void Http2Session::Impl::on_reset(std::uint32_t id, ErrorCode code) {
  Call* call = find(id);
  if (call == nullptr) return;
  std::error_code why;
  if (call->too_large) {
    why = make_error_code(ExchangeErrc::kProtocolError);  // past the session's limit too
  } else if (call->have_head) {
    // After a complete answer a reset (of any code; NO_ERROR per RFC 9113 8.1) only says the
    // rest of the request body is not wanted: the answer stands, and it is not sent again. An
    // answer it cuts short is a stream error.
    if (!call->in_end) why = make_error_code(ExchangeErrc::kResponseCut);
  } else if (code == ErrorCode::kRefusedStream) {
    // Nothing of it was processed: REFUSED_STREAM, or above the last stream of a GOAWAY.
    why = make_error_code(id > session.goaway_last_stream() ? ExchangeErrc::kAboveGoaway
                                                            : ExchangeErrc::kRefusedStream);
  } else {
    why = make_error_code(headers_sent(*call) ? ExchangeErrc::kClosedBeforeResponse
                                              : ExchangeErrc::kClosedBeforeWrite);
  }
  end_call(*call, why);
}

bool Http2Session::Impl::frame_body(Call& call, std::size_t budget) {
  if (call.closed) return true;
  const bool has_trailers = call.out_trailers != nullptr && !call.out_trailers->empty();
  std::size_t buffered = call.out.size();
  // Other callers' streams share the connection's window: this one takes only its share.
  std::size_t n = std::min({buffered, budget, session.shared_send_window(call.id)});
  const bool body_ends = call.out_end && n == buffered;
  if (n > 0 || (body_ends && !has_trailers)) {
    call.out.consume(
        session.submit_data(call.id, call.out.view().substr(0, n), body_ends && !has_trailers));
  }
  if (n > 0) call.room.set();  // room for the next piece
  if (!body_ends || !call.out.empty()) return false;
  if (has_trailers) {
    HpackField::make_room_for_names(names, *call.out_trailers);
    fields.clear();
    for (const Field& f : *call.out_trailers) fields.push_back(HpackField::to_send(f, names));
    session.submit_headers(call.id, fields, true);
  }
  call.out_done = true;
  return true;
}

void Http2Session::Impl::frame_bodies() {
  h2::take_turns(
      session, sending, next_sender,
      [this](Call& call, std::size_t slice) { return frame_body(call, slice); },
      [this](Call& call) {
        call.sending = false;
        if (call.in_end && !call.closed) end_call(call);
      });
}

namespace {

// One stream's exchange (one a request: its memory from the block cache).
class Http2Exchange final : public ClientExchange, public BlockCached {
 public:
  Http2Exchange(std::shared_ptr<Http2Session> owner, Http2Session::Impl& s,
                std::shared_ptr<Call> call, const ExchangeTimeouts& timeouts, bool has_body)
      : owner_(std::move(owner)), s_(s), call_(std::move(call)), timeouts_(timeouts) {
    if (!has_body) call_->out_end = call_->out_done = true;
    // A connection that carried earlier streams: a close under this one (no GOAWAY) is the
    // keep-alive race, as on a reused HTTP/1.1 connection.
    reused_ = call_->seq > 1;
  }
  ~Http2Exchange() override {
    if (!call_->closed) abandon();  // before its end: the upstream is told to stop
  }

  Result<void> write(std::string_view data) override {
    return write_by(data, Deadline::after_coarse(timeouts_.write),
                    make_error_code(ExchangeErrc::kWriteTimeout), /*answer_ends_it=*/true);
  }

  Result<void> tunnel_write(std::string_view data, Deadline deadline) override {
    // A tunnel's upstream that ended its side (END_STREAM) may still read ours: no early end.
    return write_by(data, deadline, make_error_code(std::errc::timed_out),
                    /*answer_ends_it=*/false);
  }

  Result<void> finish(const HeaderMap* trailers) override {
    if (auto failed = check()) return fail(failed);
    if (call_->out_end) return {};
    if (trailers != nullptr && !trailers->empty()) {
      for (const Field& f : *trailers) {
        if (is_trailer_sendable(f.name, f.value)) {
          if (call_->out_trailers == nullptr) call_->out_trailers = std::make_unique<HeaderMap>();
          call_->out_trailers->add(ascii_lower(f.name), f.value);
        }
      }
    }
    call_->out_end = true;
    s_.want_to_send(*call_);
    return {};
  }

  Result<const ClientResponseHead*> read_head() override {
    Deadline deadline = Deadline::after_coarse(timeouts_.first_byte);
    for (;;) {
      if (!call_->interim.empty()) pass_interims();
      if (call_->have_head) break;
      if (auto failed = check()) return fail(failed);
      call_->wake.reset();
      if (call_->wake.wait(deadline) == std::errc::timed_out) {
        return fail(make_error_code(ExchangeErrc::kFirstByteTimeout));
      }
    }
    if (call_->head.status == 204 || call_->head.status == 304 || head_request_) {
      call_->head.no_body = true;
    }
    return &call_->head;
  }

  // The interim (1xx) heads that came, to the informational callback. Apart from read_head
  // and never inlined into it: a head is 2 KiB, and every request would carry room for one on
  // its fiber's stack while it waits for the final head.
  [[gnu::noinline]] void pass_interims() {
    while (!call_->interim.empty()) {
      ClientResponseHead interim = std::move(call_->interim.front());
      call_->interim.erase(call_->interim.begin());
      informational(interim);
    }
  }

  Result<std::size_t> read(std::span<char> buffer) override {
    if (!call_->have_head) {
      if (auto head = read_head(); !head) return fail(head.error());
    }
    return read_by(buffer, Deadline::after_coarse(timeouts_.read),
                   make_error_code(ExchangeErrc::kReadTimeout));
  }

  Result<std::size_t> tunnel_read(std::span<char> buffer, Deadline deadline) override {
    if (!call_->have_head) return fail(std::errc::operation_not_supported);
    return read_by(buffer, deadline, make_error_code(std::errc::timed_out));
  }

  const HeaderMap& trailers() const override {
    static const HeaderMap kNone{};
    return call_->trailers != nullptr ? *call_->trailers : kNone;
  }

  void cancel() override {
    if (call_->closed) return;
    call_->error = make_error_code(ExchangeErrc::kCancelled);
    abandon();
  }

  Result<Stream> take_connection(std::string&) override {
    return fail(std::errc::operation_not_supported);
  }

  void set_head_request() { head_request_ = true; }

 private:
  // Hands `data` to the writer, then waits by `deadline` (failing with `timed_out` past it)
  // while more than kMaxUnsent of it is unsent. With `answer_ends_it`, a complete answer that
  // came while the body waits for window ends the body (kAnsweredEarly): an upstream that
  // answered whole without reading the rest (and without RST_STREAM NO_ERROR, RFC 9113 §8.1)
  // has its answer delivered now, not at the write timeout; the stream is then reset.
  Result<void> write_by(std::string_view data, Deadline deadline, std::error_code timed_out,
                        bool answer_ends_it) {
    if (auto failed = check_sending()) return fail(failed);
    if (data.empty()) return {};
    if (call_->out_end) return fail(std::errc::invalid_argument);
    call_->out.append(data);
    s_.want_to_send(*call_);
    while (call_->out.size() > kMaxUnsent) {
      call_->room.reset();
      if (auto failed = check_sending()) return fail(failed);
      if (answer_ends_it && call_->have_head && call_->in_end) {
        return fail(make_error_code(ExchangeErrc::kAnsweredEarly));
      }
      if (call_->room.wait(deadline) == std::errc::timed_out) return fail(timed_out);
    }
    return {};
  }

  // Body (or tunnel) bytes by `deadline` (failing with `timed_out` past it); 0 at the end.
  Result<std::size_t> read_by(std::span<char> buffer, Deadline deadline,
                              std::error_code timed_out) {
    for (;;) {
      if (!call_->in.empty()) {
        std::size_t n = std::min(buffer.size(), call_->in.size());
        std::memcpy(buffer.data(), call_->in.view().data(), n);
        call_->in.consume(n);
        s_.session.consumed(call_->id, n);  // the window opens as we read
        s_.writer_wake.set();
        return n;
      }
      if (call_->in_end) return 0;
      if (auto failed = check()) return fail(failed);
      call_->wake.reset();
      if (call_->wake.wait(deadline) == std::errc::timed_out) return fail(timed_out);
    }
  }

  // The error the stream ended with, or {} while it may go on. A stream closed cleanly after
  // its whole response is not an error for reads.
  std::error_code check() const {
    if (call_->error) return call_->error;
    if (call_->closed && !(call_->have_head && call_->in_end)) {
      return make_error_code(ExchangeErrc::kResponseCut);
    }
    return {};
  }
  // check() for the request body: a stream over after its complete answer takes no more.
  std::error_code check_sending() const {
    if (auto failed = check()) return failed;
    return call_->closed ? make_error_code(ExchangeErrc::kAnsweredEarly) : std::error_code();
  }
  void abandon() {
    s_.session.reset(call_->id, ErrorCode::kCancel);
    s_.end_call(*call_, call_->error);
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
  // Few and busy (every stream to the upstream goes on one): OpenSSL's buffers stay.
  if (TlsStream* tls = impl_->stream.tls()) tls->keep_buffers();
}

Http2Session::~Http2Session() = default;

bool Http2Session::usable() const { return !impl_->broken && !impl_->session.spent(); }

bool Http2Session::has_room() const { return usable() && impl_->session.can_open(); }

Clock::time_point Http2Session::idle_since() const {
  return impl_->calls.empty() ? impl_->last_end : Clock::time_point::max();
}

std::uint32_t Http2Session::max_concurrent() const { return impl_->session.max_concurrent(); }

void Http2Session::assume_max_concurrent(std::uint32_t n) {
  impl_->session.assume_max_concurrent(n);
}

void Http2Session::close() { impl_->close_now(); }

void Http2Session::retire() {
  impl_->retiring = true;
  impl_->end_if_retired();
}

std::shared_ptr<Http2Session> Http2Session::start(Stream stream) {
  std::shared_ptr<Http2Session> self(new Http2Session(std::move(stream)));
  spawn([self] { self->impl_->read_loop(); }).detach();
  spawn([self] { self->impl_->write_loop(); }).detach();
  return self;
}

void Http2Session::Impl::read_loop() {
  std::vector<char> buffer(16 * 1024);  // on the heap: fiber stacks are small
  while (!broken) {
    auto n = stream.read(buffer);
    if (!n || *n == 0) break;
    const std::size_t resets_unread = session.unacknowledged_resets();
    bool ok = session.receive(
        {reinterpret_cast<const std::uint8_t*>(buffer.data()), static_cast<std::size_t>(*n)});
    // A stream we reset counts as open until the server has read the reset (can_open): the
    // ones it has read now make room for those who wait.
    if (session.unacknowledged_resets() < resets_unread) release_waiters();
    if (!settings_came.is_set() && session.settings_received()) settings_came.set();
    for (std::uint32_t id : refused) session.reset(id, ErrorCode::kProtocolError);
    refused.clear();
    writer_wake.set();
    if (!ok) break;  // a connection error: its GOAWAY goes out, then the connection ends
    if (session.closing() && calls.empty()) break;
  }
  broken = true;
  fail_all();
  settings_came.set();
  writer_wake.set();
}

void Http2Session::Impl::write_loop() {
  for (;;) {
    frame_bodies();
    const std::uint64_t opened_now = opened;
    session.take_output(out);
    if (!out.empty()) {
      if (!stream.write_all(out, Deadline::after(std::chrono::seconds(30)))) {
        broken = true;
        (void)stream.shutdown(TcpStream::Shutdown::kBoth);
        break;
      }
      written = opened_now;
      continue;
    }
    if (broken || this_fiber::stop_requested()) break;
    // Nobody ran since the output was taken: no wake-up can be missed.
    writer_wake.reset();
    (void)writer_wake.wait();
  }
  (void)stream.shutdown(TcpStream::Shutdown::kWrite);  // the server may be waiting for our FIN
}

Result<std::unique_ptr<ClientExchange>> Http2Session::open(const ClientRequestHead& head,
                                                           std::string_view authority,
                                                           const ExchangeTimeouts& timeouts) {
  Impl& s = *impl_;
  const bool extended_connect = !head.protocol.empty();
  if (extended_connect) {
    // RFC 8441 §3: only to a server that said it takes one, in SETTINGS that came first.
    (void)s.settings_came.wait(Deadline::after_coarse(timeouts.connect));
    if (!s.session.settings_received()) {
      return fail(make_error_code(usable() ? ExchangeErrc::kConnectTimeout
                                           : ExchangeErrc::kClosedBeforeWrite));
    }
    if (!s.session.connect_protocol()) {
      return fail(make_error_code(ExchangeErrc::kNoExtendedConnect));
    }
  }
  // At the server's SETTINGS_MAX_CONCURRENT_STREAMS, a new stream waits for one to end.
  // (The exchange's deadlines are set from the coarse clock, as Http1Exchange's: timeouts of
  // seconds, set on every request, where a clock read each shows in its cost.)
  Deadline deadline = Deadline::after_coarse(timeouts.write);
  while (usable() && !s.session.can_open()) {
    std::unique_lock guard(s.room_lock);
    ++s.room_waiters;
    const bool timed_out = s.room.wait(s.room_lock, deadline) == std::errc::timed_out;
    --s.room_waiters;
    if (timed_out) {
      guard.unlock();
      s.end_if_retired();
      return fail(make_error_code(ExchangeErrc::kClosedBeforeWrite));
    }
  }
  if (!usable()) {
    // Turned away by the server's GOAWAY while it waited for room (as a stream above its last
    // would be): nothing was sent, and another connection may take it.
    const bool turned_away = s.session.goaway_last_stream() != h2::kMaxWindow;
    return fail(make_error_code(turned_away ? ExchangeErrc::kAboveGoaway
                                            : ExchangeErrc::kClosedBeforeWrite));
  }
  // Names lower-cased into one buffer.
  HpackField::make_room_for_names(s.names, head.headers);
  s.fields.clear();
  s.fields.push_back(HpackField::known(token::kMethod, head.method));
  if (extended_connect) s.fields.push_back(HpackField::known(token::kProtocol, head.protocol));
  s.fields.push_back(
      HpackField::known(token::kScheme, s.stream.tls() != nullptr ? "https" : "http"));
  s.fields.push_back(HpackField::known(token::kAuthority, authority));
  s.fields.push_back(HpackField::known(token::kPath, head.target));
  NominatedFields nominated(head.headers);
  for (const Field& f : head.headers) {
    if (!forwardable(f, nominated, FieldsFor::kRequest)) continue;
    s.fields.push_back(HpackField::to_send(f, s.names));
  }
  // A field the client sent never indexed goes on so (RFC 7541 §6.2.3): the whole head does.
  if (head.headers.never_indexed()) {
    for (HpackField& f : s.fields) f.sensitive = true;
  }
  // TE is hop-by-hop, but "TE: trailers" must reach an HTTP/2 peer (gRPC asks for it).
  if (head.headers.has_token(token::kTe, "trailers")) {
    s.fields.push_back(HpackField::known(token::kTe, "trailers"));
  }
  char length[24];
  if (head.content_length) {
    auto end = std::to_chars(length, length + sizeof length, *head.content_length).ptr;
    s.fields.push_back(
        HpackField::known(token::kContentLength, {length, static_cast<std::size_t>(end - length)}));
  }
  // A head larger than the server takes goes nowhere: it would cost the connection, which
  // other clients' streams share.
  std::size_t list_size = 0;
  for (const HpackField& f : s.fields) list_size += f.name.size() + f.value.size() + 32;
  if (list_size > s.session.max_header_list()) {
    return fail(make_error_code(ExchangeErrc::kHeadTooLarge));
  }
  // A tunnel's stream stays open our way until the caller ends it (finish()).
  bool has_body = head.chunked || head.content_length.value_or(0) > 0 || extended_connect;
  std::uint32_t id = s.session.open(s.fields, !has_body, head.method == "HEAD");
  if (id == 0) return fail(make_error_code(ExchangeErrc::kClosedBeforeWrite));  // ids spent
  auto call = std::allocate_shared<Call>(BlockAllocator<Call>());
  call->id = id;
  call->seq = ++s.opened;
  s.calls.add(id) = call;  // the session keeps it (and its body) until the stream ends
  s.writer_wake.set();
  auto exchange =
      std::make_unique<Http2Exchange>(shared_from_this(), s, std::move(call), timeouts, has_body);
  if (head.method == "HEAD") exchange->set_head_request();
  return std::unique_ptr<ClientExchange>(std::move(exchange));
}

}  // namespace spindle::http::detail
