// What an HTTP/2 connection's streams send (http2_connection.h): each response's head, its
// body framed as the windows allow (taking turns with the other streams), a streamed body's
// producer and a tunnel's bytes under flow control; and the writer, which writes the
// session's output once a turn, whatever the number of streams that produced it.
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "http2_connection.h"
#include "response_head.h"
#include "spindle/base/ascii.h"
#include "spindle/base/log.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/h2/turns.h"
#include "spindle/http/release.h"
#include "spindle/http/status.h"

namespace spindle::http::detail {

using h2::ErrorCode;
using HpackField = h2::hpack::Field;

namespace {

// A streamed response body waits for the writer beyond this many buffered bytes.
constexpr std::size_t kStreamedHighWater = 64 * 1024;
// What a stream whose answer waits on its client's windows must move within each write
// timeout (136 bytes a second at the default 30 s): less, as a window opened a byte at a time
// (data dribble, CVE-2019-9511), and the stream is cut like one that moves nothing.
constexpr std::size_t kLeastProgress = 4096;

}  // namespace

bool H2Stream::send_interim(int status, const HeaderMap& fields) {
  if (closed) return false;
  HeaderMap sendable;
  NominatedFields nominated(fields);
  for (const Field& f : fields) {
    if (detail::interim_field_sendable(f, nominated)) sendable.add(f);
  }
  if (fields.never_indexed()) sendable.mark_never_indexed();  // RFC 7541 §6.2.3
  conn.submit_head(*this, status, sendable, false);
  return true;
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

namespace {

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
    if (trailers.never_indexed()) s_.out_trailers->mark_never_indexed();
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

void Http2Connection::mark_sensitive_if_never_indexed(const HeaderMap& fields) {
  // An upstream's field that came never indexed (through the gateway) makes the block it goes
  // on in (a head, an interim head, trailers) go never indexed whole (RFC 7541 §6.2.3).
  if (fields.never_indexed()) {
    for (HpackField& f : fields_) f.sensitive = true;
  }
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
  mark_sensitive_if_never_indexed(fields);
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
  mark_sensitive_if_never_indexed(response.headers);
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
    mark_sensitive_if_never_indexed(*s.out_trailers);
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

}  // namespace spindle::http::detail
