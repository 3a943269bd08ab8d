// HTTP/2 frames: reading (RFC 9113 §4.1, §6) and writing.
#include "spindle/h2/frame.h"

#include <algorithm>
#include <cstring>

namespace spindle::h2 {
namespace {

std::uint32_t read24(const std::uint8_t* p) { return (p[0] << 16) | (p[1] << 8) | p[2]; }
std::uint32_t read32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
}
std::uint32_t read31(const std::uint8_t* p) { return read32(p) & 0x7fffffff; }

void put32(std::string& out, std::uint32_t v) {
  const char bytes[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                         static_cast<char>(v >> 8), static_cast<char>(v)};
  out.append(bytes, sizeof bytes);
}

std::optional<FrameError> error(ErrorCode code, std::string_view reason) {
  return FrameError{code, reason};
}

// Removes the padding of a PADDED frame from `payload` (`extra`: fixed fields before the
// data, counted with the pad length byte).
std::optional<FrameError> unpad(std::span<const std::uint8_t>& payload, std::size_t extra) {
  if (payload.empty()) return error(ErrorCode::kFrameSizeError, "padded frame without pad length");
  std::size_t pad = payload[0];
  if (pad + 1 + extra > payload.size()) {
    return error(ErrorCode::kProtocolError, "padding longer than the frame");
  }
  payload = payload.subspan(1, payload.size() - 1 - pad);
  return std::nullopt;
}

}  // namespace

std::optional<FrameError> FrameReader::feed_with(std::span<const std::uint8_t> bytes, void* sink,
                                                 bool (*deliver)(void*, const Frame&)) {
  for (;;) {
    std::span<const std::uint8_t> whole;
    if (!partial_.empty()) {
      // A frame begun in an earlier piece: its header first, then the rest of its payload.
      if (partial_.size() < kFrameHeaderSize) {
        std::size_t take = std::min(kFrameHeaderSize - partial_.size(), bytes.size());
        partial_.insert(partial_.end(), bytes.begin(), bytes.begin() + take);
        bytes = bytes.subspan(take);
        if (partial_.size() < kFrameHeaderSize) return std::nullopt;
      }
      std::uint32_t length = read24(partial_.data());
      if (length > max_frame_size_) {
        return error(ErrorCode::kFrameSizeError, "frame larger than SETTINGS_MAX_FRAME_SIZE");
      }
      std::size_t take = std::min(kFrameHeaderSize + length - partial_.size(), bytes.size());
      partial_.insert(partial_.end(), bytes.begin(), bytes.begin() + take);
      bytes = bytes.subspan(take);
      if (partial_.size() < kFrameHeaderSize + length) return std::nullopt;
      whole = partial_;
    } else {
      if (bytes.empty()) return std::nullopt;
      if (bytes.size() < kFrameHeaderSize ||
          bytes.size() < kFrameHeaderSize + read24(bytes.data())) {
        if (bytes.size() >= kFrameHeaderSize && read24(bytes.data()) > max_frame_size_) {
          return error(ErrorCode::kFrameSizeError, "frame larger than SETTINGS_MAX_FRAME_SIZE");
        }
        partial_.assign(bytes.begin(), bytes.end());
        return std::nullopt;
      }
      std::uint32_t length = read24(bytes.data());
      if (length > max_frame_size_) {
        return error(ErrorCode::kFrameSizeError, "frame larger than SETTINGS_MAX_FRAME_SIZE");
      }
      whole = bytes.first(kFrameHeaderSize + length);
      bytes = bytes.subspan(whole.size());
    }
    Frame frame;
    if (auto e = parse(whole, frame)) return e;
    bool more = deliver(sink, frame);
    if (whole.data() == partial_.data()) partial_.clear();
    if (!more) {
      partial_.clear();
      return std::nullopt;
    }
  }
}

std::optional<FrameError> FrameReader::parse(std::span<const std::uint8_t> bytes, Frame& f) const {
  f.length = read24(bytes.data());
  f.type = bytes[3];
  f.flags = bytes[4];
  f.stream_id = read31(bytes.data() + 5);
  f.payload = bytes.subspan(kFrameHeaderSize);
  auto& p = f.payload;
  const bool on_stream = f.stream_id != 0;
  switch (f.kind()) {
    case FrameType::kData:
      if (!on_stream) return error(ErrorCode::kProtocolError, "DATA on stream 0");
      if (f.has(flag::kPadded)) return unpad(p, 0);
      return std::nullopt;
    case FrameType::kHeaders: {
      if (!on_stream) return error(ErrorCode::kProtocolError, "HEADERS on stream 0");
      const std::size_t priority = f.has(flag::kPriority) ? 5 : 0;
      if (f.has(flag::kPadded)) {
        if (auto e = unpad(p, priority)) return e;
      } else if (p.size() < priority) {
        return error(ErrorCode::kFrameSizeError, "HEADERS too short for its priority");
      }
      if (priority != 0) {
        f.depends_on = read31(p.data());
        p = p.subspan(priority);
        if (f.depends_on == f.stream_id) f.stream_error = ErrorCode::kProtocolError;
      }
      return std::nullopt;
    }
    case FrameType::kPriority:
      if (!on_stream) return error(ErrorCode::kProtocolError, "PRIORITY on stream 0");
      if (p.size() != 5) {
        f.stream_error = ErrorCode::kFrameSizeError;
        return std::nullopt;
      }
      f.depends_on = read31(p.data());
      if (f.depends_on == f.stream_id) f.stream_error = ErrorCode::kProtocolError;
      return std::nullopt;
    case FrameType::kRstStream:
      if (!on_stream) return error(ErrorCode::kProtocolError, "RST_STREAM on stream 0");
      if (p.size() != 4) return error(ErrorCode::kFrameSizeError, "RST_STREAM not 4 bytes");
      f.error_code = read32(p.data());
      return std::nullopt;
    case FrameType::kSettings:
      if (on_stream) return error(ErrorCode::kProtocolError, "SETTINGS on a stream");
      if (f.has(flag::kAck) && !p.empty()) {
        return error(ErrorCode::kFrameSizeError, "SETTINGS ack with a payload");
      }
      if (p.size() % 6 != 0)
        return error(ErrorCode::kFrameSizeError, "SETTINGS not 6-byte entries");
      return std::nullopt;
    case FrameType::kPushPromise:
      if (!on_stream) return error(ErrorCode::kProtocolError, "PUSH_PROMISE on stream 0");
      if (f.has(flag::kPadded)) {
        if (auto e = unpad(p, 4)) return e;
      } else if (p.size() < 4) {
        return error(ErrorCode::kFrameSizeError, "PUSH_PROMISE too short");
      }
      f.other_stream = read31(p.data());
      p = p.subspan(4);
      return std::nullopt;
    case FrameType::kPing:
      if (on_stream) return error(ErrorCode::kProtocolError, "PING on a stream");
      if (p.size() != 8) return error(ErrorCode::kFrameSizeError, "PING not 8 bytes");
      return std::nullopt;
    case FrameType::kGoaway:
      if (on_stream) return error(ErrorCode::kProtocolError, "GOAWAY on a stream");
      if (p.size() < 8) return error(ErrorCode::kFrameSizeError, "GOAWAY shorter than 8 bytes");
      f.other_stream = read31(p.data());
      f.error_code = read32(p.data() + 4);
      p = p.subspan(8);
      return std::nullopt;
    case FrameType::kWindowUpdate:
      if (p.size() != 4) return error(ErrorCode::kFrameSizeError, "WINDOW_UPDATE not 4 bytes");
      f.increment = read31(p.data());
      if (f.increment == 0) {
        if (!on_stream) return error(ErrorCode::kProtocolError, "WINDOW_UPDATE of 0");
        f.stream_error = ErrorCode::kProtocolError;
      }
      return std::nullopt;
    case FrameType::kContinuation:
      if (!on_stream) return error(ErrorCode::kProtocolError, "CONTINUATION on stream 0");
      return std::nullopt;
  }
  return std::nullopt;  // an unknown type: the connection ignores it
}

std::optional<FrameError> check_setting(std::uint16_t id, std::uint32_t value) {
  switch (static_cast<SettingId>(id)) {
    case SettingId::kEnablePush:
    case SettingId::kEnableConnectProtocol:
      if (value > 1) return error(ErrorCode::kProtocolError, "a boolean setting above 1");
      break;
    case SettingId::kInitialWindowSize:
      if (value > kMaxWindow) {
        return error(ErrorCode::kFlowControlError, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1");
      }
      break;
    case SettingId::kMaxFrameSize:
      if (value < kDefaultMaxFrameSize || value > 0xffffff) {
        return error(ErrorCode::kProtocolError, "SETTINGS_MAX_FRAME_SIZE out of range");
      }
      break;
    default:
      break;  // the others take any value; unknown ones are ignored
  }
  return std::nullopt;
}

namespace write {

namespace {
void put_frame_header(char* at, std::uint32_t length, FrameType type, std::uint8_t flags,
                      std::uint32_t stream_id) {
  stream_id &= 0x7fffffff;
  const char bytes[9] = {static_cast<char>(length >> 16),    static_cast<char>(length >> 8),
                         static_cast<char>(length),          static_cast<char>(type),
                         static_cast<char>(flags),           static_cast<char>(stream_id >> 24),
                         static_cast<char>(stream_id >> 16), static_cast<char>(stream_id >> 8),
                         static_cast<char>(stream_id)};
  std::memcpy(at, bytes, sizeof bytes);
}
}  // namespace

void frame_header(std::string& out, std::uint32_t length, FrameType type, std::uint8_t flags,
                  std::uint32_t stream_id) {
  char bytes[9];
  put_frame_header(bytes, length, type, flags, stream_id);
  out.append(bytes, sizeof bytes);
}

void data(std::string& out, std::uint32_t stream_id, std::string_view data, bool end_stream) {
  frame_header(out, static_cast<std::uint32_t>(data.size()), FrameType::kData,
               end_stream ? flag::kEndStream : 0, stream_id);
  out.append(data);
}

void headers(std::string& out, std::uint32_t stream_id, std::string_view block, bool end_stream,
             std::uint32_t max_frame_size) {
  std::string_view first = block.substr(0, max_frame_size);
  block.remove_prefix(first.size());
  std::uint8_t flags =
      (end_stream ? flag::kEndStream : 0) | (block.empty() ? flag::kEndHeaders : 0);
  frame_header(out, static_cast<std::uint32_t>(first.size()), FrameType::kHeaders, flags,
               stream_id);
  out.append(first);
  while (!block.empty()) {
    std::string_view next = block.substr(0, max_frame_size);
    block.remove_prefix(next.size());
    frame_header(out, static_cast<std::uint32_t>(next.size()), FrameType::kContinuation,
                 block.empty() ? flag::kEndHeaders : 0, stream_id);
    out.append(next);
  }
}

void headers_in_place(std::string& out, std::size_t at, std::uint32_t stream_id, bool end_stream,
                      std::uint32_t max_frame_size) {
  const std::size_t size = out.size() - at - 9;
  if (size <= max_frame_size) {
    put_frame_header(out.data() + at, static_cast<std::uint32_t>(size), FrameType::kHeaders,
                     (end_stream ? flag::kEndStream : 0) | flag::kEndHeaders, stream_id);
    return;
  }
  std::string block = out.substr(at + 9);
  out.resize(at);
  headers(out, stream_id, block, end_stream, max_frame_size);
}

void rst_stream(std::string& out, std::uint32_t stream_id, ErrorCode code) {
  frame_header(out, 4, FrameType::kRstStream, 0, stream_id);
  put32(out, static_cast<std::uint32_t>(code));
}

void settings(std::string& out, std::span<const std::pair<SettingId, std::uint32_t>> entries) {
  frame_header(out, static_cast<std::uint32_t>(6 * entries.size()), FrameType::kSettings, 0, 0);
  for (const auto& [id, value] : entries) {
    out.push_back(static_cast<char>(static_cast<std::uint16_t>(id) >> 8));
    out.push_back(static_cast<char>(static_cast<std::uint16_t>(id)));
    put32(out, value);
  }
}

void settings_ack(std::string& out) { frame_header(out, 0, FrameType::kSettings, flag::kAck, 0); }

void ping(std::string& out, std::span<const std::uint8_t, 8> data, bool ack) {
  frame_header(out, 8, FrameType::kPing, ack ? flag::kAck : 0, 0);
  out.append(reinterpret_cast<const char*>(data.data()), data.size());
}

void goaway(std::string& out, std::uint32_t last_stream_id, ErrorCode code,
            std::string_view debug) {
  frame_header(out, static_cast<std::uint32_t>(8 + debug.size()), FrameType::kGoaway, 0, 0);
  put32(out, last_stream_id & 0x7fffffff);
  put32(out, static_cast<std::uint32_t>(code));
  out.append(debug);
}

void window_update(std::string& out, std::uint32_t stream_id, std::uint32_t increment) {
  frame_header(out, 4, FrameType::kWindowUpdate, 0, stream_id);
  put32(out, increment & 0x7fffffff);
}

}  // namespace write
}  // namespace spindle::h2
