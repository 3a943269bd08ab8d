#pragma once
/// Rate limits shared by every worker of a process, without locks: a GCRA (generic cell rate
/// algorithm) per key, whose one number — the key's theoretical arrival time — lives in an
/// atomic slot of a fixed-size table and is moved on by compare-and-swap. Exact across workers;
/// memory fixed at creation.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "spindle/io/deadline.h"

namespace spindle::proxy {

class RateLimitTable {
 public:
  /// `rate` requests per second on average, `burst` at once; room for `slots` keys at a time
  /// (a key that has been quiet for longer than a full burst takes no room).
  RateLimitTable(double rate, unsigned burst, std::size_t slots = 1 << 16);

  struct Decision {
    bool allowed = true;
    /// Requests the key could still make at once now.
    std::uint64_t remaining = 0;
    /// Seconds until a refused request would be allowed (0 when allowed).
    double retry_after = 0;
    /// Seconds until the key is back to a full burst.
    double reset = 0;
  };
  /// Counts one request of the key whose hash is `key` at `now`. Any thread.
  Decision take(std::uint64_t key, Clock::time_point now);

  unsigned burst() const { return burst_; }

 private:
  struct alignas(16) Slot {
    /// The key's hash (0: free), and its theoretical arrival time in ns on the steady clock.
    std::atomic<std::uint64_t> key{0};
    std::atomic<std::int64_t> tat{0};
  };
  /// The slot of `key` (claimed if need be), or nullptr when the probe window is all taken by
  /// busy keys.
  Slot* find(std::uint64_t key, std::int64_t now);

  std::int64_t interval_;   // ns between requests at the steady rate
  std::int64_t tolerance_;  // ns of credit: burst x interval
  unsigned burst_;
  std::vector<Slot> slots_;
};

/// The tables of a process's rate limits, kept across configurations: a reload that keeps a
/// route's limit (same route, place, rate and burst) keeps its counts.
class RateLimitRegistry {
 public:
  std::shared_ptr<RateLimitTable> table(const std::string& route, std::size_t index, double rate,
                                        unsigned burst);

 private:
  std::mutex lock_;
  std::map<std::string, std::shared_ptr<RateLimitTable>> tables_;
};

/// A 64-bit hash of a rate-limit key (never 0).
std::uint64_t rate_limit_hash(std::string_view key);

}  // namespace spindle::proxy
