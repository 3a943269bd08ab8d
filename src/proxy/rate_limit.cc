#include "spindle/proxy/rate_limit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace spindle::proxy {
namespace {

// Slots looked at for one key, from its home slot on.
constexpr std::size_t kProbe = 8;

std::int64_t nanos(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

std::shared_ptr<RateLimitTable> RateLimitRegistry::table(const std::string& route,
                                                         std::size_t index, double rate,
                                                         unsigned burst) {
  std::string key = fmt::format("{}#{}:{}/{}", route, index, rate, burst);
  std::lock_guard guard(lock_);
  auto& table = tables_[key];
  if (!table) table = std::make_shared<RateLimitTable>(rate, burst);
  return table;
}

std::uint64_t rate_limit_hash(std::string_view key) {
  // FNV-1a, then a final mix (splitmix64) so that similar keys land far apart.
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h == 0 ? 1 : h;
}

RateLimitTable::RateLimitTable(double rate, unsigned burst, std::size_t slots)
    : interval_(static_cast<std::int64_t>(std::max(1.0, 1e9 / rate))),
      tolerance_(interval_ * static_cast<std::int64_t>(burst)),
      burst_(burst),
      slots_(std::max<std::size_t>(slots, kProbe)) {}

RateLimitTable::Slot* RateLimitTable::find(std::uint64_t key, std::int64_t now) {
  std::size_t home = key % slots_.size();
  for (std::size_t i = 0; i < kProbe; ++i) {
    Slot& s = slots_[(home + i) % slots_.size()];
    if (s.key.load(std::memory_order_acquire) == key) return &s;
  }
  // Not there: take a free slot, or one whose key has been quiet long enough to have its full
  // burst back (forgetting it changes nothing).
  for (std::size_t i = 0; i < kProbe; ++i) {
    Slot& s = slots_[(home + i) % slots_.size()];
    std::uint64_t owner = s.key.load(std::memory_order_acquire);
    if (owner != 0 && s.tat.load(std::memory_order_acquire) > now) continue;
    if (s.key.compare_exchange_strong(owner, key, std::memory_order_acq_rel)) {
      s.tat.store(now, std::memory_order_release);
      return &s;
    }
    if (owner == key) return &s;  // another worker claimed it for the same key
  }
  return nullptr;
}

RateLimitTable::Decision RateLimitTable::take(std::uint64_t key, Clock::time_point when) {
  std::int64_t now = nanos(when);
  Slot* slot = find(key, now);
  if (slot == nullptr) return Decision{.allowed = true, .remaining = 0};  // no room: let it by
  std::int64_t tat = slot->tat.load(std::memory_order_acquire);
  for (;;) {
    std::int64_t next = std::max(tat, now) + interval_;
    if (next - now > tolerance_) {
      double wait = static_cast<double>(next - now - tolerance_) / 1e9;
      return Decision{.allowed = false,
                      .remaining = 0,
                      .retry_after = wait,
                      .reset = static_cast<double>(std::max(tat, now) - now) / 1e9};
    }
    if (slot->tat.compare_exchange_weak(tat, next, std::memory_order_acq_rel)) {
      auto left = static_cast<std::uint64_t>((tolerance_ - (next - now)) / interval_);
      return Decision{.allowed = true,
                      .remaining = left,
                      .retry_after = 0,
                      .reset = static_cast<double>(next - now) / 1e9};
    }
  }
}

}  // namespace spindle::proxy
