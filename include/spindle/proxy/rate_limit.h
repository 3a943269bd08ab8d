#pragma once
/// Rate limits. Local ones are shared by every worker of a process without locks: a GCRA
/// (generic cell rate algorithm) per key, whose one number — the key's theoretical arrival
/// time — lives in an atomic slot of a fixed-size table and is moved on by compare-and-swap.
/// Exact across workers; memory fixed at creation. Shared ones keep that number in Redis, for
/// every instance that uses it.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/base/siphash.h"
#include "spindle/io/deadline.h"
#include "spindle/proxy/config.h"
#include "spindle/proxy/redis.h"

namespace spindle::proxy {

/// A rate limit: counts requests by key and says whether each may pass.
class RateLimiter {
 public:
  struct Decision {
    bool allowed = true;
    /// Requests the key could still make at once now.
    std::uint64_t remaining = 0;
    /// Seconds until a refused request would be allowed (0 when allowed).
    double retry_after = 0;
    /// Seconds until the key is back to a full burst.
    double reset = 0;
    /// Refused because the shared store could not be asked in time (failure_mode: closed).
    bool unavailable = false;
  };
  virtual ~RateLimiter() = default;
  /// Counts one request of `key` at `now`. From a fiber of a runtime (a shared store parks
  /// it, never longer than its timeout).
  virtual Decision take(std::string_view key, Clock::time_point now) = 0;
  /// Requests allowed at once.
  virtual unsigned burst() const = 0;
};

/// A local rate limit: a fixed table of slots, each a key's hash and its theoretical arrival
/// time. A key's slot is looked for in a window of 8 from its home, chosen by SipHash under a
/// secret made for the table (so clients cannot aim keys at one window). A key takes a free
/// slot there, or one whose key has its full burst back (forgetting that changes nothing); a
/// key that finds neither is refused (429), never let by uncounted, and no key still counting
/// is ever forgotten (docs/operations.md: what a flood can cost).
class RateLimitTable final : public RateLimiter {
 public:
  /// `rate` requests per second on average, `burst` at once; room for `slots` keys at a time
  /// (a key that has been quiet for longer than a full burst takes no room).
  RateLimitTable(double rate, unsigned burst, std::size_t slots = 1 << 16);

  /// Any thread, never parks.
  Decision take(std::string_view key, Clock::time_point now) override;

  unsigned burst() const override { return burst_; }

 private:
  struct alignas(16) Slot {
    /// The key's hash (0: free), and its theoretical arrival time in ns on the steady clock.
    std::atomic<std::uint64_t> key{0};
    std::atomic<std::int64_t> tat{0};
  };
  /// The slot of the key with hash `key`: its own, else a free or quiet one of its window
  /// (claimed), else nullptr.
  Slot* find(std::uint64_t key, std::int64_t now);
  /// When the window of `key` next has a slot free (ns on the steady clock).
  std::int64_t next_free(std::uint64_t key) const;

  SipKey secret_;           // the slot hash's key, this table's own
  std::int64_t interval_;   // ns between requests at the steady rate
  std::int64_t tolerance_;  // ns of credit: burst x interval
  unsigned burst_;
  std::vector<Slot> slots_;
};

/// A rate limit shared by every instance that uses one Redis. The counts live in Redis (a GCRA
/// there, moved on by a script); a worker takes tokens from it a batch at a time and spends
/// them without asking again, fetching the next batch in the background when half is spent.
/// So no more than the limit is ever admitted over all instances (each token was granted by
/// Redis), and fewer by at most the tokens held unspent: 1.5 batches per worker per instance,
/// each token lost after a second unspent. A request waits for Redis only when its worker holds
/// no token for its key, and then never longer than the Redis timeout; if Redis cannot be asked
/// in time, `fail_open` decides.
class RedisRateLimit final : public RateLimiter,
                             public std::enable_shared_from_this<RedisRateLimit> {
 public:
  /// Counts under keys starting with `prefix`; `batch` tokens per request to Redis.
  RedisRateLimit(std::shared_ptr<RedisClients> redis, std::string prefix, double rate,
                 unsigned burst, unsigned batch, bool fail_open, std::size_t workers);
  ~RedisRateLimit() override;

  Decision take(std::string_view key, Clock::time_point now) override;
  unsigned burst() const override { return burst_; }

 private:
  struct KeyState;
  struct WorkerKeys;
  /// Asks Redis for a batch of tokens for `key`.
  void refill(KeyState& state, std::uint64_t key, Deadline deadline);
  /// The decision while Redis cannot be asked.
  Decision failed() const;

  std::shared_ptr<RedisClients> redis_;
  std::string prefix_;
  double interval_us_;
  double tolerance_us_;
  unsigned burst_;
  unsigned batch_;
  bool fail_open_;
  std::vector<std::unique_ptr<WorkerKeys>> workers_;
};

/// The rate limits of a process, kept across configurations: a reload that keeps a route's
/// limit (same route, place and settings) keeps its counts, and one Redis keeps its
/// connections.
class RateLimitRegistry {
 public:
  /// The limit of middleware `index` of `route`, for a runtime of `workers` workers; `redis`
  /// (resolved to `redis_address`; none while its name has no address) is needed for store:
  /// redis.
  std::shared_ptr<RateLimiter> limiter(const std::string& route, std::size_t index,
                                       const RateLimitConfig& config,
                                       const std::optional<RedisConfig>& redis,
                                       const std::optional<Address>& redis_address,
                                       std::size_t workers);

 private:
  std::mutex lock_;
  /// Held by the configurations that use them.
  std::map<std::string, std::weak_ptr<RateLimiter>> limiters_;
  std::map<std::string, std::weak_ptr<RedisClients>> redis_;
};

/// A 64-bit hash of a rate-limit key (never 0), the same in every process: what names a
/// shared limit's key in Redis.
std::uint64_t rate_limit_hash(std::string_view key);

}  // namespace spindle::proxy
