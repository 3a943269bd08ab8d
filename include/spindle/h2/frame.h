#pragma once
/// HTTP/2 frames (RFC 9113 §4 and §6): reading them from bytes that arrive in any pieces, and
/// writing them in place at the end of an output buffer. Pure: no I/O, no connection state
/// (which frames are allowed when is the connection's business); what the reader checks is
/// what a frame's own bytes can tell (its size, its stream, its padding).

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spindle/http/release.h"

namespace spindle::h2 {

enum class FrameType : std::uint8_t {
  kData = 0x0,
  kHeaders = 0x1,
  kPriority = 0x2,
  kRstStream = 0x3,
  kSettings = 0x4,
  kPushPromise = 0x5,
  kPing = 0x6,
  kGoaway = 0x7,
  kWindowUpdate = 0x8,
  kContinuation = 0x9,
};

namespace flag {
inline constexpr std::uint8_t kEndStream = 0x1;
inline constexpr std::uint8_t kAck = 0x1;
inline constexpr std::uint8_t kEndHeaders = 0x4;
inline constexpr std::uint8_t kPadded = 0x8;
inline constexpr std::uint8_t kPriority = 0x20;
}  // namespace flag

/// RFC 9113 §7.
enum class ErrorCode : std::uint32_t {
  kNoError = 0x0,
  kProtocolError = 0x1,
  kInternalError = 0x2,
  kFlowControlError = 0x3,
  kSettingsTimeout = 0x4,
  kStreamClosed = 0x5,
  kFrameSizeError = 0x6,
  kRefusedStream = 0x7,
  kCancel = 0x8,
  kCompressionError = 0x9,
  kConnectError = 0xa,
  kEnhanceYourCalm = 0xb,
  kInadequateSecurity = 0xc,
  kHttp11Required = 0xd,
};

/// RFC 9113 §6.5.2 (and RFC 8441's ENABLE_CONNECT_PROTOCOL).
enum class SettingId : std::uint16_t {
  kHeaderTableSize = 0x1,
  kEnablePush = 0x2,
  kMaxConcurrentStreams = 0x3,
  kInitialWindowSize = 0x4,
  kMaxFrameSize = 0x5,
  kMaxHeaderListSize = 0x6,
  kEnableConnectProtocol = 0x8,
};

inline constexpr std::size_t kFrameHeaderSize = 9;
inline constexpr std::uint32_t kDefaultMaxFrameSize = 16384;
inline constexpr std::uint32_t kMaxWindow = 0x7fffffff;

/// One frame as read. Views point into the bytes given to the reader (or its buffer for a
/// frame that arrived in pieces): valid during the callback only.
struct Frame {
  std::uint8_t type = 0;  ///< a FrameType, or an unknown type (to be ignored)
  std::uint8_t flags = 0;
  std::uint32_t stream_id = 0;
  std::uint32_t length = 0;  ///< the whole payload, padding included (flow control counts it)
  /// DATA: the data; HEADERS, PUSH_PROMISE, CONTINUATION: the header block fragment; PING:
  /// the 8 bytes; SETTINGS: the 6-byte entries; GOAWAY: the debug data; others: all.
  std::span<const std::uint8_t> payload;
  /// RST_STREAM, GOAWAY.
  std::uint32_t error_code = 0;
  /// GOAWAY: the last stream id; PUSH_PROMISE: the promised one.
  std::uint32_t other_stream = 0;
  /// WINDOW_UPDATE.
  std::uint32_t increment = 0;
  /// HEADERS with PRIORITY, and PRIORITY: the stream it depends on (RFC 9113 keeps the field,
  /// not the scheme: a stream depending on itself is still an error).
  std::uint32_t depends_on = 0;
  /// Set for a frame whose own bytes make it a stream error (a PRIORITY frame of the wrong
  /// size, a WINDOW_UPDATE of 0 on a stream): the connection resets that stream.
  std::optional<ErrorCode> stream_error;

  FrameType kind() const { return static_cast<FrameType>(type); }
  bool has(std::uint8_t f) const { return (flags & f) != 0; }
};

/// A connection error found in the frame layer: GOAWAY with `code`, then close.
struct FrameError {
  ErrorCode code;
  std::string_view reason;
};

/// Reads frames from bytes in any pieces (one byte at a time as well as many frames at once).
class FrameReader {
 public:
  /// `max_frame_size`: our SETTINGS_MAX_FRAME_SIZE (acknowledged).
  explicit FrameReader(std::uint32_t max_frame_size = kDefaultMaxFrameSize)
      : max_frame_size_(max_frame_size) {}
  void set_max_frame_size(std::uint32_t size) { max_frame_size_ = size; }

  /// Reads what `bytes` completes, calling `on_frame(const Frame&)` for each frame; stops at a
  /// connection error (returned) or when `on_frame` returns false (then nullopt, and the
  /// reader keeps nothing of the rest).
  template <typename OnFrame>
  std::optional<FrameError> feed(std::span<const std::uint8_t> bytes, OnFrame&& on_frame) {
    return feed_with(bytes, &on_frame, [](void* sink, const Frame& f) {
      return (*static_cast<std::remove_reference_t<OnFrame>*>(sink))(f);
    });
  }
  /// Bytes of an incomplete frame held.
  std::size_t pending() const { return partial_.size(); }
  /// The incomplete frame held is known to be part of a header block (HEADERS, CONTINUATION
  /// or PUSH_PROMISE).
  bool pending_header_frame() const {
    if (partial_.size() < 4) return false;
    const auto type = static_cast<FrameType>(partial_[3]);
    return type == FrameType::kHeaders || type == FrameType::kContinuation ||
           type == FrameType::kPushPromise;
  }
  /// Gives its buffer's memory back if it holds nothing.
  void trim() {
    if (partial_.empty()) release(partial_);
  }

 private:
  std::optional<FrameError> feed_with(std::span<const std::uint8_t> bytes, void* sink,
                                      bool (*deliver)(void*, const Frame&));
  std::optional<FrameError> parse(std::span<const std::uint8_t> frame, Frame& out) const;
  std::uint32_t max_frame_size_;
  std::vector<std::uint8_t> partial_;
};

/// The value of one SETTINGS entry, checked (RFC 9113 §6.5.2): a connection error if it is
/// out of range.
std::optional<FrameError> check_setting(std::uint16_t id, std::uint32_t value);

/// Calls `each(id, value)` for the entries of a SETTINGS frame's payload.
template <typename Each>
void for_each_setting(std::span<const std::uint8_t> payload, Each&& each) {
  for (std::size_t i = 0; i + 6 <= payload.size(); i += 6) {
    auto id = static_cast<std::uint16_t>((payload[i] << 8) | payload[i + 1]);
    std::uint32_t value = (std::uint32_t{payload[i + 2]} << 24) | (payload[i + 3] << 16) |
                          (payload[i + 4] << 8) | payload[i + 5];
    each(id, value);
  }
}

/// Frames appended in place to the end of `out` (the connection's output buffer).
namespace write {
void frame_header(std::string& out, std::uint32_t length, FrameType type, std::uint8_t flags,
                  std::uint32_t stream_id);
void data(std::string& out, std::uint32_t stream_id, std::string_view data, bool end_stream);
/// HEADERS, then CONTINUATION frames for what passes `max_frame_size`.
void headers(std::string& out, std::uint32_t stream_id, std::string_view block, bool end_stream,
             std::uint32_t max_frame_size = kDefaultMaxFrameSize);
/// The same for a block already encoded at the end of `out`, after a frame header's room (9
/// bytes) left at `at`: the header is written there (the block is not copied unless it needs
/// CONTINUATION frames).
void headers_in_place(std::string& out, std::size_t at, std::uint32_t stream_id, bool end_stream,
                      std::uint32_t max_frame_size);
void rst_stream(std::string& out, std::uint32_t stream_id, ErrorCode code);
void settings(std::string& out, std::span<const std::pair<SettingId, std::uint32_t>> entries);
void settings_ack(std::string& out);
void ping(std::string& out, std::span<const std::uint8_t, 8> data, bool ack);
void goaway(std::string& out, std::uint32_t last_stream_id, ErrorCode code,
            std::string_view debug = {});
void window_update(std::string& out, std::uint32_t stream_id, std::uint32_t increment);
}  // namespace write

}  // namespace spindle::h2
