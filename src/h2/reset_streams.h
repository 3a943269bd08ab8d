#pragma once
// The streams one end of a connection closed (reset, or refused) while the peer may still be
// sending on them (private to src/h2: the session's). RFC 9113 §5.1: what the peer sent before
// it read our RST_STREAM is ignored, its DATA still counted for the connection's window; it is
// not the peer's error. Each stream is remembered until the peer has surely read the reset: it
// answered a PING we sent after the reset (a peer reads frames in order), or it reset the
// stream itself. Never by a count alone: a peer may have as many streams in flight as it is
// allowed open, and more than that in one round trip (the upstream of a gateway whose clients
// cancel wave after wave). A peer that answers no PING keeps them until `capacity` newer ones
// push the oldest out.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace spindle::h2::detail {

class ResetStreams {
 public:
  /// One stream reset, and what its peer may still send on it before it knows.
  struct Stream {
    std::uint32_t id = 0;
    /// The number of the PING whose answer says the peer has read the reset.
    std::uint32_t ping = 0;
    /// DATA it may still send: what the stream's window allowed when we reset it.
    std::uint32_t window = 0;
    /// Header blocks it may still send (a response's interim and final heads, trailers);
    /// past them each counts against the reset budget.
    std::uint8_t blocks = 0;
    /// It ended the stream (END_STREAM): no more DATA or HEADERS may come on it.
    bool ended = false;
  };

  /// The PING payload that carries number `n`: a tag of its own, then the number, so that the
  /// answer is told from the answers to the driver's PINGs.
  static std::array<std::uint8_t, 8> ping_payload(std::uint32_t n);
  /// The number a PING answer carries, if it is one of ours.
  static std::optional<std::uint32_t> ping_number(std::span<const std::uint8_t, 8> payload);

  /// Remembers stream `id` (the next PING covers it); beyond `capacity` streams, the one reset
  /// longest ago is forgotten.
  void add(std::uint32_t id, std::uint32_t window, std::uint8_t blocks, bool ended,
           std::size_t capacity);
  /// The stream `id`, if remembered.
  Stream* find(std::uint32_t id);
  /// Forgets stream `id`; false if it was not remembered.
  bool forget(std::uint32_t id);
  /// Forgets the streams above `id` (a GOAWAY said they were never processed).
  void forget_above(std::uint32_t id);
  /// The number of the PING to send now, if one is due: a stream waits for one, and none is in
  /// flight (one at a time: each answer forgets every stream reset before its PING).
  std::optional<std::uint32_t> ping_due();
  /// The answer to PING `n` came: the streams it covers are forgotten. False if no such PING
  /// is in flight (an answer to none we sent: ignored).
  bool on_ping_ack(std::uint32_t n);
  /// Streams remembered.
  std::size_t size() const { return streams_.size(); }
  /// Nothing remembered and no PING in flight: the memory may go.
  bool idle() const { return streams_.empty() && in_flight_ == 0; }

 private:
  /// By id.
  std::vector<Stream> streams_;
  /// The number the next PING will carry (streams added now wait for it).
  std::uint32_t next_ping_ = 1;
  /// The PING in flight (0: none).
  std::uint32_t in_flight_ = 0;
  /// Some stream waits for next_ping_.
  bool waiting_ = false;
};

}  // namespace spindle::h2::detail
