// Both ends of an HTTP/2 connection (RFC 9113): see session.h.
#include "spindle/h2/session.h"

#include <algorithm>
#include <array>

#include "message_check.h"
#include "reset_streams.h"

namespace spindle::h2 {
using detail::HeadCheck;
using detail::ResetStreams;
using detail::ResponseCheck;

namespace {

constexpr std::string_view kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
// The bytes of one header block past which the connection ends (SessionLimits::max_header_block):
// a client's session is bounded by the frames a block may take (each of our max_frame_size).
std::size_t block_limit(bool client, const SessionLimits& limits) {
  if (!client) return limits.max_header_block;
  return std::max(limits.max_header_block,
                  (limits.max_continuations + 1) * std::size_t{limits.max_frame_size});
}
// Our SETTINGS_HEADER_TABLE_SIZE: RFC 7541's default, for the server side and the client side.
constexpr std::uint32_t kDecoderTableSize = 4096;

}  // namespace

Session::Session(Role role, SessionLimits limits, SessionHandler& handler)
    : role_(role),
      limits_(limits),
      handler_(handler),
      reader_(limits.max_frame_size),
      decoder_(kDecoderTableSize, limits.max_header_list_size),
      connection_receive_window_(std::max<std::int64_t>(65535, limits.connection_window)) {
  if (role == Role::kClient) {
    // An upstream answers every request on few connections, often with the same values
    // (nginx indexes none of its response fields).
    decoder_.enable_value_memo();
    out_.assign(kPreface);
    preface_seen_ = kPreface.size();  // none comes from a server
    // The table size is the default, said anyway: nginx, told any, answers with a size update
    // to 0 and its response fields (each sent "with incremental indexing", none ever referenced)
    // no longer go through our table.
    std::pair<SettingId, std::uint32_t> settings[] = {
        {SettingId::kHeaderTableSize, kDecoderTableSize},
        {SettingId::kEnablePush, 0},
        {SettingId::kInitialWindowSize, limits.stream_window},
        {SettingId::kMaxFrameSize, limits.max_frame_size},
        {SettingId::kMaxHeaderListSize, limits.max_header_list_size}};
    write::settings(out_, settings);
  } else {
    std::pair<SettingId, std::uint32_t> settings[] = {
        {SettingId::kMaxConcurrentStreams, limits.max_concurrent_streams},
        {SettingId::kInitialWindowSize, limits.stream_window},
        {SettingId::kMaxFrameSize, limits.max_frame_size},
        {SettingId::kMaxHeaderListSize, limits.max_header_list_size},
        {SettingId::kEnableConnectProtocol, 1}};
    write::settings(out_, std::span(settings, limits.enable_connect_protocol ? 5 : 4));
  }
  if (limits.connection_window > 65535) {
    write::window_update(out_, 0, limits.connection_window - 65535);
  }
}

Session::~Session() = default;

ClientSession::ClientSession(SessionLimits limits, SessionHandler& handler)
    : Session(Role::kClient, limits, handler) {
  // One connection carries many clients' requests to an upstream: no client's values become
  // another's references in its table.
  encoder_.share_between_clients();
}

bool Session::receive(std::span<const std::uint8_t> bytes) {
  if (failed_) return false;
  while (preface_seen_ < kPreface.size() && !bytes.empty()) {
    if (bytes[0] != static_cast<std::uint8_t>(kPreface[preface_seen_])) {
      return connection_error(ErrorCode::kProtocolError, "not the HTTP/2 preface");
    }
    ++preface_seen_;
    bytes = bytes.subspan(1);
  }
  if (bytes.empty()) return true;
  auto error = reader_.feed(bytes, [this](const Frame& f) { return on_frame(f); });
  if (error) return connection_error(error->code, error->reason);
  return !failed_;
}

std::string Session::take_output() {
  ping_for_resets();
  std::string taken;
  taken.swap(out_);
  return taken;
}

void Session::take_output(std::string& into) {
  ping_for_resets();
  into.clear();
  into.swap(out_);
}

void Session::trim() {
  if (out_.empty()) release(out_);
  if (block_stream_ == 0) release(block_);
  reader_.trim();
  decoder_.trim();
  encoder_.trim();
  streams_.trim();
  if (reset_streams_ != nullptr && reset_streams_->idle()) reset_streams_.reset();
}

bool Session::connection_error(ErrorCode code, std::string_view reason) {
  if (!failed_) {
    write::goaway(out_, role_ == Role::kServer ? last_stream_ : 0, code, reason);
    failed_ = true;
    start_closing();
  }
  return false;
}

bool Session::check_output() {
  if (out_.size() <= limits_.max_output) return true;
  return connection_error(ErrorCode::kEnhanceYourCalm, "the client does not read");
}

bool Session::spend(std::size_t& count, std::size_t budget, std::string_view what) {
  if (++count <= budget + completed_) return true;
  return connection_error(ErrorCode::kEnhanceYourCalm, what);
}

void Session::stream_error(std::uint32_t id, ErrorCode code) {
  if (!spend(resets_, limits_.reset_budget, "too many streams reset")) return;
  write::rst_stream(out_, id, code);
  if (streams_.contains(id)) {
    close_stream(id);
    handler_.on_reset(id, code);
  }
}

void Session::close_stream(std::uint32_t id) {
  const Stream* s = streams_.find(id);
  if (s == nullptr) return;
  // What the peer may still send: DATA within the stream's window; header blocks (a request's
  // trailers; a response's interim heads, its head and trailers) unless it ended its side.
  remember_reset(id, s->receive_window, s->headers_done ? 1 : 4,
                 s->state == Stream::kHalfClosedRemote);
  streams_.erase(id);
}

void Session::remember_reset(std::uint32_t id, std::int64_t window, std::uint8_t blocks,
                             bool ended) {
  if (reset_streams_ == nullptr) reset_streams_ = std::make_unique<ResetStreams>();
  // Never fewer than the streams either end allows open (the peer may have as many in flight):
  // past them only a peer that answers no PING loses the oldest.
  const std::size_t allowed =
      std::max<std::size_t>(limits_.max_concurrent_streams, peer_max_concurrent_);
  reset_streams_->add(id,
                      static_cast<std::uint32_t>(std::clamp<std::int64_t>(window, 0, kMaxWindow)),
                      blocks, ended, std::min<std::size_t>(2 * allowed + 64, 1 << 16));
}

void Session::ping_for_resets() {
  if (reset_streams_ == nullptr || failed_) return;
  if (auto n = reset_streams_->ping_due()) write::ping(out_, ResetStreams::ping_payload(*n), false);
}

std::size_t Session::unacknowledged_resets() const {
  return reset_streams_ == nullptr ? 0 : reset_streams_->size();
}

bool Session::head_pending() const {
  return (preface_seen_ > 0 && preface_seen_ < kPreface.size()) || block_stream_ != 0 ||
         reader_.pending_header_frame();
}

void Session::start_closing() {
  if (!closing_ && role_ == Role::kServer) closing_last_ = last_stream_;
  closing_ = true;
}

void Session::complete_stream(std::uint32_t id) {
  streams_.erase(id);
  ++completed_;
}

bool Session::on_frame(const Frame& f) {
  if (block_stream_ != 0 &&
      (f.kind() != FrameType::kContinuation || f.stream_id != block_stream_)) {
    return connection_error(ErrorCode::kProtocolError, "a header block interrupted");
  }
  if (!settings_seen_ && (f.kind() != FrameType::kSettings || f.has(flag::kAck))) {
    return connection_error(ErrorCode::kProtocolError, "the peer's first frame is not SETTINGS");
  }
  switch (f.kind()) {
    case FrameType::kData:
      return on_data(f);
    case FrameType::kHeaders:
      return on_headers(f);
    case FrameType::kPriority:
      if (f.stream_error) stream_error(f.stream_id, *f.stream_error);
      return true;
    case FrameType::kRstStream:
      return on_rst_stream(f);
    case FrameType::kSettings:
      return on_settings(f);
    case FrameType::kPushPromise:
      return connection_error(ErrorCode::kProtocolError, role_ == Role::kServer
                                                             ? "PUSH_PROMISE from a client"
                                                             : "PUSH_PROMISE, push is off");
    case FrameType::kPing:
      return on_ping(f);
    case FrameType::kGoaway:
      start_closing();  // no new stream; what is open finishes
      if (role_ == Role::kClient) on_goaway(f);
      return true;
    case FrameType::kWindowUpdate:
      return on_window_update(f);
    case FrameType::kContinuation: {
      if (block_stream_ == 0)
        return connection_error(ErrorCode::kProtocolError, "CONTINUATION alone");
      if (f.payload.empty() && !f.has(flag::kEndHeaders) &&
          !spend(empty_frames_, limits_.empty_frame_budget, "too many empty frames")) {
        return false;
      }
      block_.append(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
      if (block_skimming_) return skim_block(f.has(flag::kEndHeaders));
      if (block_.size() > block_limit(role_ == Role::kClient, limits_) ||
          ++block_frames_ > limits_.max_continuations) {
        if (role_ == Role::kClient) return skim_block(f.has(flag::kEndHeaders));
        return connection_error(ErrorCode::kEnhanceYourCalm, "header block too large");
      }
      return f.has(flag::kEndHeaders)
                 ? end_header_block(std::span(reinterpret_cast<const std::uint8_t*>(block_.data()),
                                              block_.size()))
                 : true;
    }
  }
  return true;  // an unknown frame type: ignored
}

bool Session::on_headers(const Frame& f) {
  const std::uint32_t id = f.stream_id;
  if (id % 2 == 0) {
    return connection_error(ErrorCode::kProtocolError, role_ == Role::kServer
                                                           ? "an even stream from a client"
                                                           : "a stream from the server");
  }
  if (role_ == Role::kClient && id > last_stream_) {
    return connection_error(ErrorCode::kProtocolError, "HEADERS on an idle stream");
  }
  if (id <= last_stream_) {
    const Stream* open = streams_.find(id);
    if (open == nullptr) {
      if (!on_headers_not_open(f)) return false;
    } else if (open->state == Stream::kHalfClosedRemote) {
      // Its block must still be read (the decoder's table), then the stream is reset.
      stream_error(id, ErrorCode::kStreamClosed);
    }
  } else {
    last_stream_ = id;
    if (!closing_) {
      if (streams_.size() >= limits_.max_concurrent_streams && !f.stream_error) {
        if (!spend(resets_, limits_.reset_budget, "too many streams refused")) return false;
        write::rst_stream(out_, id, ErrorCode::kRefusedStream);
        // Its body and trailers may be on their way: not its errors.
        remember_reset(id, limits_.stream_window, 1, f.has(flag::kEndStream));
      } else {
        add_stream(id);  // (one whose frame is a stream error is reset at once, below)
      }
    }
  }
  if (f.stream_error) stream_error(id, *f.stream_error);
  if (f.payload.empty() && !f.has(flag::kEndHeaders) &&
      !spend(empty_frames_, limits_.empty_frame_budget, "too many empty frames")) {
    return false;
  }
  block_stream_ = id;
  block_end_stream_ = f.has(flag::kEndStream);
  if (f.payload.size() > block_limit(role_ == Role::kClient, limits_)) {
    return connection_error(ErrorCode::kEnhanceYourCalm, "header block too large");
  }
  // A whole block in one frame (the usual case) is decoded where it lies; else the pieces are
  // gathered as they come.
  if (f.has(flag::kEndHeaders)) return end_header_block(f.payload);
  block_.assign(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
  block_frames_ = 1;
  return true;
}

// A response block past what a client's session gathers: its stream alone is reset at once
// (the connection carries other callers' streams), and the block is read as it comes, for the
// table only (later blocks name its entries): what is kept between frames is one
// representation cut by a frame's end, at most block_limit() bytes.
bool Session::skim_block(bool end_headers) {
  const std::uint32_t id = block_stream_;
  if (!block_skimming_) {
    block_skimming_ = true;
    block_field_seen_ = false;
    if (streams_.contains(id)) {
      (void)handler_.on_head_too_large(id, block_end_stream_);
      stream_error(id, ErrorCode::kProtocolError);
      if (failed_) return false;
    }
  }
  std::size_t read = 0;
  const auto* in = reinterpret_cast<const std::uint8_t*>(block_.data());
  const hpack::Status status = decoder_.skim({in, block_.size()}, block_field_seen_, read);
  if (status != hpack::Status::kOk) {
    return connection_error(ErrorCode::kCompressionError, hpack::to_string(status));
  }
  block_.erase(0, read);
  if (block_.size() > block_limit(true, limits_)) {
    return connection_error(ErrorCode::kEnhanceYourCalm, "a header field too large");
  }
  if (!end_headers) return true;
  block_stream_ = 0;
  block_skimming_ = false;
  if (!block_.empty()) {
    return connection_error(ErrorCode::kCompressionError, "a header block cut short");
  }
  return true;
}

bool Session::on_headers_not_open(const Frame& f) {
  const std::uint32_t id = f.stream_id;
  if (id > closing_last_) return true;  // begun after we began closing: not served
  ResetStreams::Stream* reset = reset_streams_ ? reset_streams_->find(id) : nullptr;
  if (reset == nullptr || reset->ended) {
    return connection_error(ErrorCode::kStreamClosed, "HEADERS on a closed stream");
  }
  // Sent before the peer knew of our reset: read for the table only. The blocks a message may
  // still have are expected; more count as resets, so that a flood of them ends.
  if (reset->blocks > 0) {
    --reset->blocks;
  } else if (!spend(resets_, limits_.reset_budget, "too many header blocks on reset streams")) {
    return false;
  }
  if (f.has(flag::kEndStream)) reset->ended = true;
  return true;
}

bool Session::end_header_block(std::span<const std::uint8_t> block) {
  const std::uint32_t id = block_stream_;
  block_stream_ = 0;
  Stream* s = streams_.find(id);  // (found again after each handler call below)
  const bool trailers = s != nullptr && s->headers_done;
  const bool server = role_ == Role::kServer;
  HeadCheck check;
  ResponseCheck response;
  if (s != nullptr && !trailers && server) handler_.on_request_begin(id);
  auto status = decoder_.decode(block, [&](const hpack::Decoded& d) {
    if (s == nullptr) return;  // refused or reset: read only for the table
    if (server) {
      check.field(d, trailers, limits_.enable_connect_protocol);
      if (check.malformed) return;
    } else {
      response.field(d, trailers);
      if (response.malformed) return;
    }
    if (d.never_indexed) handler_.on_never_indexed(id, d.field);
    handler_.on_field(id, d.field);
  });
  if (status != hpack::Status::kOk && status != hpack::Status::kHeaderListTooLarge) {
    return connection_error(ErrorCode::kCompressionError, hpack::to_string(status));
  }
  if (s != nullptr) s = streams_.find(id);  // (the handler's calls may have moved it)
  if (s == nullptr) return true;
  if (status == hpack::Status::kHeaderListTooLarge) {
    // Each costs a response or a reset: a stream of HPACK bombs ends the connection.
    if (!spend(resets_, limits_.reset_budget, "too many header lists too large")) return false;
    if (!server) {
      stream_error(id, ErrorCode::kProtocolError);  // the upstream did process it
      return true;
    }
    if (trailers || !handler_.on_head_too_large(id, block_end_stream_)) {
      stream_error(id, ErrorCode::kRefusedStream);
      return true;
    }
    s->headers_done = true;
    handler_.on_headers(id, block_end_stream_, false);
    if (Stream* again = streams_.find(id); again != nullptr && block_end_stream_) {
      again->state = Stream::kHalfClosedRemote;
    }
    return true;
  }
  const bool end_stream = block_end_stream_;
  const bool malformed = trailers ? !end_stream || (server ? check.malformed : response.malformed)
                         : server ? !check.complete()
                                  : !response.complete(end_stream);
  if (malformed) {
    stream_error(id, ErrorCode::kProtocolError);
    return true;
  }
  if (!trailers && server) {
    s->headers_done = true;
    s->content_length = check.content_length;
  } else if (!trailers && !response.informational()) {
    s->headers_done = true;  // a 1xx head is followed by another
    const bool no_body = s->head_request || response.status == 204 || response.status == 304;
    s->content_length = no_body ? -1 : response.content_length;
  }
  if (end_stream && s->content_length >= 0 && s->content_length != s->data_received) {
    stream_error(id, ErrorCode::kProtocolError);
    return true;
  }
  handler_.on_headers(id, end_stream, trailers);
  s = streams_.find(id);  // the handler may have reset it
  if (end_stream && s != nullptr) {
    if (s->state == Stream::kHalfClosedLocal) {
      complete_stream(id);
    } else {
      s->state = Stream::kHalfClosedRemote;
    }
  }
  return true;
}

bool Session::on_data(const Frame& f) {
  const std::uint32_t id = f.stream_id;
  if (id > last_stream_)
    return connection_error(ErrorCode::kProtocolError, "DATA on an idle stream");
  if (f.length > connection_receive_window_) {
    return connection_error(ErrorCode::kFlowControlError, "DATA past the connection window");
  }
  connection_receive_window_ -= f.length;
  if (limits_.connection_window_on_receipt) give_back_connection_window(f.length);
  // Frames that carry no data count wherever they go (an empty-frame flood, CVE-2019-9518,
  // of padding alone or aimed at a closed stream is one all the same).
  if (f.payload.empty() && !f.has(flag::kEndStream) &&
      !spend(empty_frames_, limits_.empty_frame_budget, "too many empty frames")) {
    return false;
  }
  Stream* open = streams_.find(id);
  if (open == nullptr) return on_data_not_open(f);
  if (open->state == Stream::kHalfClosedRemote) {
    consumed(0, f.length);  // the connection's window is given back all the same
    stream_error(id, ErrorCode::kStreamClosed);
    return check_output();
  }
  Stream& s = *open;
  if (!s.headers_done) {
    consumed(0, f.length);
    stream_error(id, ErrorCode::kProtocolError);
    return true;
  }
  if (f.length > s.receive_window) {
    consumed(0, f.length);
    stream_error(id, ErrorCode::kFlowControlError);
    return true;
  }
  s.receive_window -= f.length;
  s.data_received += static_cast<std::int64_t>(f.payload.size());
  const bool end_stream = f.has(flag::kEndStream);
  if (s.content_length >= 0 &&
      (s.data_received > s.content_length || (end_stream && s.data_received != s.content_length))) {
    consumed(0, f.length);
    stream_error(id, ErrorCode::kProtocolError);
    return true;
  }
  // Padding is flow-controlled but nobody consumes it: given back at once.
  if (f.length > f.payload.size()) consumed(id, f.length - f.payload.size());
  handler_.on_data(id, f.payload, end_stream);
  if (end_stream) {
    Stream* again = streams_.find(id);  // the handler may have reset it
    if (again != nullptr) {
      if (again->state == Stream::kHalfClosedLocal) {
        complete_stream(id);
      } else {
        again->state = Stream::kHalfClosedRemote;
      }
    }
  }
  return true;
}

bool Session::on_data_not_open(const Frame& f) {
  const std::uint32_t id = f.stream_id;
  consumed(0, f.length);                // the connection's window is given back all the same
  if (id > closing_last_) return true;  // begun after we began closing: not served
  ResetStreams::Stream* reset = reset_streams_ ? reset_streams_->find(id) : nullptr;
  if (reset != nullptr && !reset->ended) {
    if (f.length <= reset->window) {  // sent before the peer knew of our reset: ignored
      reset->window -= f.length;
      if (f.has(flag::kEndStream)) reset->ended = true;
      return true;
    }
    // Past the window the stream had: its error, whatever it knew.
    reset_streams_->forget(id);
    if (!spend(resets_, limits_.reset_budget, "too many streams reset")) return false;
    write::rst_stream(out_, id, ErrorCode::kFlowControlError);
    return check_output();
  }
  if (!spend(resets_, limits_.reset_budget, "too many streams reset")) return false;
  write::rst_stream(out_, id, ErrorCode::kStreamClosed);
  return check_output();
}

bool Session::on_rst_stream(const Frame& f) {
  const std::uint32_t id = f.stream_id;
  if (id > last_stream_ || id % 2 == 0) {
    return connection_error(ErrorCode::kProtocolError, "RST_STREAM on an idle stream");
  }
  // Its reset crossed ours: neither is the other's error, and nothing more comes on it.
  if (reset_streams_ != nullptr && reset_streams_->forget(id)) return true;
  const auto code = static_cast<ErrorCode>(f.error_code);
  const Stream* open = streams_.find(id);
  if (role_ == Role::kClient && open != nullptr && open->state == Stream::kHalfClosedRemote &&
      code == ErrorCode::kNoError) {
    // A server that has answered whole may stop the request's body so (RFC 9113 §8.1): the
    // stream is complete, not reset.
    complete_stream(id);
    handler_.on_reset(id, code);
    return true;
  }
  // A client's streams are its own: a server that resets them costs it nothing it did not ask
  // for (an upstream's handlers that give up are no flood). A server counts every reset
  // (Rapid Reset), and a client the resets of streams that are not open.
  if ((role_ == Role::kServer || open == nullptr) &&
      !spend(resets_, limits_.reset_budget, "too many streams reset")) {
    return false;
  }
  if (streams_.erase(id)) handler_.on_reset(id, code);
  return true;
}

bool Session::on_ping(const Frame& f) {
  const std::span<const std::uint8_t, 8> payload(f.payload.data(), 8);
  if (!f.has(flag::kAck)) {
    write::ping(out_, payload, true);
    return check_output();
  }
  if (auto n = ResetStreams::ping_number(payload)) {
    // The peer has read every reset sent before that PING: what it sends on them now is its own.
    if (reset_streams_ != nullptr) reset_streams_->on_ping_ack(*n);
    return true;
  }
  handler_.on_ping_ack(payload);
  return true;
}

bool Session::on_settings(const Frame& f) {
  if (f.has(flag::kAck)) return true;
  settings_seen_ = true;
  if (++settings_frames_ > limits_.settings_budget) {
    return connection_error(ErrorCode::kEnhanceYourCalm, "too many SETTINGS");
  }
  if (auto bad = apply_settings(f.payload)) return connection_error(bad->code, bad->reason);
  write::settings_ack(out_);
  for (const auto& [sid, s] : streams_) {
    if (s.send_window > 0) handler_.on_window(sid);
  }
  return check_output();
}

std::optional<FrameError> Session::apply_settings(std::span<const std::uint8_t> payload) {
  std::optional<FrameError> bad;
  for_each_setting(payload, [&](std::uint16_t id, std::uint32_t value) {
    if (bad) return;
    if ((bad = check_setting(id, value))) return;
    switch (static_cast<SettingId>(id)) {
      case SettingId::kHeaderTableSize:
        encoder_.set_peer_max_table_size(value);
        break;
      case SettingId::kInitialWindowSize: {
        const std::int64_t delta = static_cast<std::int64_t>(value) - peer_initial_window_;
        peer_initial_window_ = value;
        for (auto& [sid, s] : streams_) {
          s.send_window += delta;
          if (s.send_window > kMaxWindow) {
            bad = FrameError{ErrorCode::kFlowControlError, "a stream window past 2^31-1"};
            return;
          }
        }
        break;
      }
      case SettingId::kMaxFrameSize:
        peer_max_frame_size_ = value;
        break;
      case SettingId::kMaxConcurrentStreams:
        peer_max_concurrent_ = value;
        break;
      case SettingId::kMaxHeaderListSize:
        peer_max_header_list_ = value;
        break;
      case SettingId::kEnableConnectProtocol:
        peer_connect_protocol_ = value == 1;
        break;
      case SettingId::kEnablePush:
        if (role_ == Role::kClient && value == 1) {
          bad = FrameError{ErrorCode::kProtocolError, "a server may not enable push"};
        }
        break;
      default:
        break;
    }
  });
  return bad;
}

bool Session::on_window_update(const Frame& f) {
  const std::uint32_t id = f.stream_id;
  if (id == 0) {
    connection_send_window_ += f.increment;
    if (connection_send_window_ > kMaxWindow) {
      return connection_error(ErrorCode::kFlowControlError, "the connection window past 2^31-1");
    }
    connection_send_peak_ = std::max(connection_send_peak_, connection_send_window_);
    handler_.on_window(0);
    return true;
  }
  if (id > last_stream_) {
    return connection_error(ErrorCode::kProtocolError, "WINDOW_UPDATE on an idle stream");
  }
  Stream* open = streams_.find(id);
  if (open == nullptr) return true;  // closed: ignored
  if (f.stream_error) {
    stream_error(id, *f.stream_error);
    return true;
  }
  open->send_window += f.increment;
  if (open->send_window > kMaxWindow) {
    stream_error(id, ErrorCode::kFlowControlError);
    return true;
  }
  handler_.on_window(id);
  return true;
}

void Session::give_back_connection_window(std::size_t n) {
  connection_unacked_ += n;
  if (connection_unacked_ >= limits_.connection_window / 2) {
    write::window_update(out_, 0, static_cast<std::uint32_t>(connection_unacked_));
    connection_receive_window_ += static_cast<std::int64_t>(connection_unacked_);
    connection_unacked_ = 0;
  }
}

void Session::consumed(std::uint32_t stream, std::size_t n) {
  if (!limits_.connection_window_on_receipt) give_back_connection_window(n);
  Stream* open = streams_.find(stream);
  if (open == nullptr || open->state == Stream::kHalfClosedRemote) return;
  Stream& s = *open;
  s.unacked += n;
  if (s.unacked >= limits_.stream_window / 2) {
    write::window_update(out_, stream, static_cast<std::uint32_t>(s.unacked));
    s.receive_window += static_cast<std::int64_t>(s.unacked);
    s.unacked = 0;
  }
}

std::optional<Session::Windows> Session::windows(std::uint32_t stream) const {
  if (stream == 0) {
    return Windows{connection_send_window_, connection_receive_window_, connection_unacked_};
  }
  const Stream* open = streams_.find(stream);
  if (open == nullptr) return std::nullopt;
  return Windows{open->send_window, open->receive_window, open->unacked};
}

std::size_t Session::send_window(std::uint32_t stream) const {
  const Stream* open = streams_.find(stream);
  if (open == nullptr) return 0;
  return static_cast<std::size_t>(
      std::max<std::int64_t>(0, std::min(open->send_window, connection_send_window_)));
}

std::size_t Session::shared_send_window(std::uint32_t stream) const {
  const Stream* open = streams_.find(stream);
  if (open == nullptr) return 0;
  const std::int64_t held =
      std::max<std::int64_t>(0, std::min(peer_initial_window_ - open->send_window,
                                         connection_send_peak_ - connection_send_window_));
  // n such that held + n <= window - n (rounded up: a stream holding nothing may always send
  // one byte while the connection has any).
  const std::int64_t share = (connection_send_window_ - held + 1) / 2;
  return static_cast<std::size_t>(std::max<std::int64_t>(0, std::min(open->send_window, share)));
}

void Session::submit_headers(std::uint32_t stream, std::span<const hpack::Field> fields,
                             bool end_stream) {
  Stream* open = streams_.find(stream);
  if (open == nullptr || failed_) return;
  const std::size_t at = out_.size();
  out_.append(9, '\0');  // the frame header, once the block's size is known
  encoder_.encode(fields, out_);
  write::headers_in_place(out_, at, stream, end_stream, peer_max_frame_size_);
  if (end_stream) {
    if (open->state == Stream::kHalfClosedRemote) {
      complete_stream(stream);
    } else {
      open->state = Stream::kHalfClosedLocal;
    }
  }
}

std::size_t Session::submit_data(std::uint32_t stream, std::string_view data, bool end_stream) {
  Stream* open = streams_.find(stream);
  if (open == nullptr || failed_) return 0;
  const std::size_t n = std::min<std::size_t>(
      data.size(), std::max<std::int64_t>(0, std::min(open->send_window, connection_send_window_)));
  const bool ends = end_stream && n == data.size();
  if (n == 0 && !ends) return 0;
  std::size_t at = 0;
  do {
    std::size_t piece = std::min<std::size_t>(n - at, peer_max_frame_size_);
    write::data(out_, stream, data.substr(at, piece), ends && at + piece == n);
    at += piece;
  } while (at < n);
  open->send_window -= static_cast<std::int64_t>(n);
  connection_send_window_ -= static_cast<std::int64_t>(n);
  if (ends) {
    if (open->state == Stream::kHalfClosedRemote) {
      complete_stream(stream);
    } else {
      open->state = Stream::kHalfClosedLocal;
    }
  }
  return n;
}

void Session::reset(std::uint32_t stream, ErrorCode code) {
  if (failed_ || !streams_.contains(stream)) return;  // closed already: nothing to say
  write::rst_stream(out_, stream, code);
  close_stream(stream);
}

void Session::goaway(ErrorCode code, std::string_view debug) { goaway(code, last_stream_, debug); }

void Session::goaway(ErrorCode code, std::uint32_t last_stream, std::string_view debug) {
  if (failed_) return;
  // A client names the last stream the server opened: none (push is off).
  write::goaway(out_, role_ == Role::kServer ? std::min(last_stream, last_stream_) : 0, code,
                debug);
  start_closing();
}

void ServerSession::shutdown_notice(std::span<const std::uint8_t, 8> ping) {
  if (failed_ || closing_) return;
  write::goaway(out_, kMaxWindow, ErrorCode::kNoError);
  write::ping(out_, ping, false);
}

bool ServerSession::upgrade(std::span<const std::uint8_t> settings) {
  if (last_stream_ != 0) return false;
  // The 101 has gone: settings we cannot take end the connection with a GOAWAY saying why.
  if (settings.size() % 6 != 0) {
    return connection_error(ErrorCode::kFrameSizeError, "HTTP2-Settings is not whole entries");
  }
  if (auto bad = apply_settings(settings)) return connection_error(bad->code, bad->reason);
  Stream& s = add_stream(1);
  s.headers_done = true;
  s.state = Stream::kHalfClosedRemote;
  last_stream_ = 1;
  return true;
}

}  // namespace spindle::h2

namespace spindle::h2 {

Session::Stream& Session::add_stream(std::uint32_t id) {
  Stream& s = streams_.add(id);
  s.send_window = peer_initial_window_;
  s.receive_window = limits_.stream_window;
  return s;
}

void Session::on_goaway(const Frame& f) {
  goaway_last_ = std::min(goaway_last_, f.other_stream);
  handler_.on_goaway(goaway_last_, static_cast<ErrorCode>(f.error_code));
  // Nothing comes on the streams it never processed, ours reset among them.
  if (reset_streams_ != nullptr) reset_streams_->forget_above(goaway_last_);
  // The streams above it were never processed: they end here, refused (safe to try again).
  while (!streams_.empty() && streams_.highest() > goaway_last_) {
    const std::uint32_t id = streams_.highest();
    streams_.erase(id);
    handler_.on_reset(id, ErrorCode::kRefusedStream);
  }
}

bool ClientSession::can_open() const {
  return !failed_ && !closing_ &&
         streams_.size() + unacknowledged_resets() < peer_max_concurrent_ &&
         last_stream_ + 2 <= kMaxWindow;
}

std::uint32_t ClientSession::open(std::span<const hpack::Field> fields, bool end_stream,
                                  bool head_request) {
  if (!can_open()) return 0;
  const std::uint32_t id = last_stream_ == 0 ? 1 : last_stream_ + 2;
  last_stream_ = id;
  Stream& s = add_stream(id);
  s.head_request = head_request;
  if (end_stream) s.state = Stream::kHalfClosedLocal;
  const std::size_t at = out_.size();
  out_.append(9, '\0');  // the frame header, once the block's size is known
  encoder_.encode(fields, out_);
  write::headers_in_place(out_, at, id, end_stream, peer_max_frame_size_);
  return id;
}

}  // namespace spindle::h2
