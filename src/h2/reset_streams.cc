// The streams a session reset while its peer may still send on them: see reset_streams.h.
#include "reset_streams.h"

namespace spindle::h2::detail {
namespace {

constexpr std::uint8_t kTag[4] = {'r', 's', 't', 0};

bool by_id(const ResetStreams::Stream& s, std::uint32_t id) { return s.id < id; }

}  // namespace

std::array<std::uint8_t, 8> ResetStreams::ping_payload(std::uint32_t n) {
  return {kTag[0],
          kTag[1],
          kTag[2],
          kTag[3],
          static_cast<std::uint8_t>(n >> 24),
          static_cast<std::uint8_t>(n >> 16),
          static_cast<std::uint8_t>(n >> 8),
          static_cast<std::uint8_t>(n)};
}

std::optional<std::uint32_t> ResetStreams::ping_number(std::span<const std::uint8_t, 8> payload) {
  if (!std::equal(payload.begin(), payload.begin() + 4, kTag)) return std::nullopt;
  return (std::uint32_t{payload[4]} << 24) | (std::uint32_t{payload[5]} << 16) |
         (std::uint32_t{payload[6]} << 8) | payload[7];
}

void ResetStreams::add(std::uint32_t id, std::uint32_t window, std::uint8_t blocks, bool ended,
                       std::size_t capacity) {
  if (Stream* known = find(id)) {
    *known = {id, next_ping_, window, blocks, ended};
  } else {
    if (streams_.size() >= std::max<std::size_t>(capacity, 1)) {
      // A peer that answers no PING: the stream reset longest ago goes (the oldest PING's, the
      // lowest id among them).
      auto oldest = std::ranges::min_element(
          streams_, [](const Stream& a, const Stream& b) { return a.ping < b.ping; });
      streams_.erase(oldest);
    }
    auto at = std::lower_bound(streams_.begin(), streams_.end(), id, by_id);
    streams_.insert(at, Stream{id, next_ping_, window, blocks, ended});
  }
  waiting_ = true;
}

ResetStreams::Stream* ResetStreams::find(std::uint32_t id) {
  auto it = std::lower_bound(streams_.begin(), streams_.end(), id, by_id);
  return it != streams_.end() && it->id == id ? &*it : nullptr;
}

bool ResetStreams::forget(std::uint32_t id) {
  auto it = std::lower_bound(streams_.begin(), streams_.end(), id, by_id);
  if (it == streams_.end() || it->id != id) return false;
  streams_.erase(it);
  return true;
}

void ResetStreams::forget_above(std::uint32_t id) {
  streams_.erase(std::upper_bound(streams_.begin(), streams_.end(), id,
                                  [](std::uint32_t n, const Stream& s) { return n < s.id; }),
                 streams_.end());
}

std::optional<std::uint32_t> ResetStreams::ping_due() {
  if (in_flight_ != 0 || !waiting_) return std::nullopt;
  waiting_ = false;
  in_flight_ = next_ping_++;
  if (next_ping_ == 0) next_ping_ = 1;  // (0 means none)
  return in_flight_;
}

bool ResetStreams::on_ping_ack(std::uint32_t n) {
  if (n == 0 || n != in_flight_) return false;
  in_flight_ = 0;
  // Every stream reset before the PING went.
  std::erase_if(streams_, [n](const Stream& s) { return s.ping <= n; });
  return true;
}

}  // namespace spindle::h2::detail
