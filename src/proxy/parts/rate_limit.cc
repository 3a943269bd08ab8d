#include "spindle/proxy/rate_limit.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <unordered_map>

#include "spindle/base/log.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/worker.h"
#include "spindle/sync/event.h"

namespace spindle::proxy {
namespace {

// Slots looked at for one key, from its home slot on.
constexpr std::size_t kProbe = 8;

std::int64_t nanos(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

std::shared_ptr<RateLimiter> RateLimitRegistry::limiter(const std::string& route, std::size_t index,
                                                        const RateLimitConfig& config,
                                                        const std::optional<RedisConfig>& redis,
                                                        const std::optional<Address>& redis_address,
                                                        std::size_t workers) {
  std::string key = fmt::format("{}#{}:{}/{}", route, index, config.rate, config.burst);
  std::string clients_key;
  if (config.store == RateLimitConfig::Store::kRedis) {
    if (!redis) throw std::logic_error("rate_limit with store: redis and no redis configured");
    clients_key = fmt::format("{}={} {} {} {} {}", redis->address(),
                              redis_address ? redis_address->to_string() : "unresolved",
                              redis->timeout.count(), redis->database, redis->password,
                              redis->backoff.count());
    fmt::format_to(std::back_inserter(key), " redis {} {} {}", clients_key, config.batch,
                   config.fail_open);
  }
  std::lock_guard guard(lock_);
  // The configurations own their limits; the registry only finds them again. A limit no
  // configuration holds any more is gone (a table is 1 MiB: reloads that change a rate would
  // otherwise keep one each), and so is a Redis no limit uses (a changed `redis` section: its
  // clients close their connections), as soon as the last request of the old configuration
  // ends. The configuration in force holds its own while the next is built, so a limit both
  // share keeps its counts.
  std::erase_if(limiters_, [](const auto& entry) { return entry.second.expired(); });
  std::erase_if(redis_, [](const auto& entry) { return entry.second.expired(); });
  if (auto kept = limiters_[key].lock()) return kept;
  std::shared_ptr<RateLimiter> limiter;
  if (config.store == RateLimitConfig::Store::kLocal) {
    limiter = std::make_shared<RateLimitTable>(config.rate, config.burst);
    limiters_[key] = limiter;
    return limiter;
  }
  auto clients = redis_[clients_key].lock();
  if (!clients) {
    clients = std::make_shared<RedisClients>(*redis, redis_address, workers);
    redis_[clients_key] = clients;
  }
  // Instances with the same route and settings share counts; other settings are other keys.
  std::string prefix =
      fmt::format("spindle:rl:{}:{}:{}:{}:", route, index, config.rate, config.burst);
  unsigned batch = config.batch != 0 ? config.batch : std::max(1u, config.burst / 10);
  limiter = std::make_shared<RedisRateLimit>(clients, std::move(prefix), config.rate, config.burst,
                                             batch, config.fail_open, workers);
  limiters_[key] = limiter;
  return limiter;
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
    : secret_(SipKey::random()),
      interval_(static_cast<std::int64_t>(std::max(1.0, 1e9 / rate))),
      tolerance_(interval_ * static_cast<std::int64_t>(burst)),
      burst_(burst),
      slots_(std::max<std::size_t>(slots, kProbe)) {}

RateLimitTable::Slot* RateLimitTable::find(std::uint64_t key, std::int64_t now) {
  std::size_t home = key % slots_.size();
  auto slot = [&](std::size_t i) -> Slot& { return slots_[(home + i) % slots_.size()]; };
  for (std::size_t i = 0; i < kProbe; ++i) {
    if (slot(i).key.load(std::memory_order_acquire) == key) return &slot(i);
  }
  // Not there: take a free slot, or one whose key has been quiet long enough to have its full
  // burst back (forgetting it changes nothing). A key still counting is never forgotten: that
  // would give it its burst again, as often as someone can make other keys take its place.
  for (std::size_t i = 0; i < kProbe; ++i) {
    Slot& s = slot(i);
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

std::int64_t RateLimitTable::next_free(std::uint64_t key) const {
  std::size_t home = key % slots_.size();
  std::int64_t earliest = INT64_MAX;
  for (std::size_t i = 0; i < kProbe; ++i) {
    earliest =
        std::min(earliest, slots_[(home + i) % slots_.size()].tat.load(std::memory_order_acquire));
  }
  return earliest;
}

RateLimitTable::Decision RateLimitTable::take(std::string_view text, Clock::time_point when) {
  std::int64_t now = nanos(when);
  std::uint64_t key = siphash(secret_, text);
  if (key == 0) key = 1;
  Slot* slot = find(key, now);
  if (slot == nullptr) {
    // No room for the key: refused, never waved through uncounted. Its window frees as soon
    // as one of its keys has its full burst back.
    double wait = static_cast<double>(std::max<std::int64_t>(next_free(key) - now, 0)) / 1e9;
    return Decision{.allowed = false, .remaining = 0, .retry_after = wait, .reset = wait};
  }
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

// ---- shared through Redis -----------------------------------------------------------------

namespace spindle::proxy {
namespace {

// GCRA over a batch, in Redis's own time (TIME, µs): grants up to ARGV[3] tokens of the key
// KEYS[1], each moving its theoretical arrival time on by the interval (ARGV[1] µs) as long as
// it stays within the tolerance (ARGV[2] µs: burst x interval) of now. Returns {granted, how
// far the arrival time is ahead of now, in µs}.
constexpr std::string_view kTakeScript = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now then tat = now end
local grant = math.floor((tolerance - (tat - now)) / interval)
if grant > want then grant = want end
if grant < 0 then grant = 0 end
if grant > 0 then
  tat = tat + grant * interval
  redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
end
return {grant, math.floor(tat - now)}
)lua";

// How long unspent tokens stay usable: a worker that stops seeing a key does not keep its
// tokens from the other instances for longer.
constexpr auto kLease = std::chrono::seconds(1);

// Keys a worker keeps before it sweeps out those with nothing left to remember.
constexpr std::size_t kSweepAbove = 4096;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

struct RedisRateLimit::KeyState {
  /// Tokens granted by Redis and not spent yet; usable until `expires`.
  unsigned tokens = 0;
  Clock::time_point expires{};
  /// Redis refused: no token before this.
  Clock::time_point refused_until{};
  /// What Redis said last: requests left at once, and seconds to a full burst.
  std::uint64_t remaining = 0;
  double reset = 0;
  /// A request to Redis is on its way; `refilled` is set when it is back.
  bool refilling = false;
  std::shared_ptr<Event> refilled;
  /// The last request to Redis failed.
  bool failed = false;
};

struct RedisRateLimit::WorkerKeys {
  std::unordered_map<std::uint64_t, std::shared_ptr<KeyState>> keys;
  Clock::time_point next_sweep{};
};

RedisRateLimit::RedisRateLimit(std::shared_ptr<RedisClients> redis, std::string prefix, double rate,
                               unsigned burst, unsigned batch, bool fail_open, std::size_t workers)
    : redis_(std::move(redis)),
      prefix_(std::move(prefix)),
      interval_us_(1e6 / rate),
      tolerance_us_(1e6 / rate * burst),
      burst_(burst),
      batch_(std::max(1u, batch)),
      fail_open_(fail_open),
      workers_(workers) {}

RedisRateLimit::~RedisRateLimit() = default;

RateLimiter::Decision RedisRateLimit::failed() const {
  if (fail_open_) return Decision{.allowed = true, .remaining = 0};
  return Decision{.allowed = false, .remaining = 0, .retry_after = 1, .unavailable = true};
}

void RedisRateLimit::refill(KeyState& state, std::uint64_t key, Deadline deadline) {
  state.refilling = true;
  auto refilled = state.refilled = std::make_shared<Event>();
  std::string redis_key = fmt::format("{}{:016x}", prefix_, key);
  std::string interval = fmt::format("{:.3f}", interval_us_);
  std::string tolerance = fmt::format("{:.3f}", tolerance_us_);
  std::string want = std::to_string(batch_);
  std::string_view args[] = {"EVAL", kTakeScript, "1", redis_key, interval, tolerance, want};
  auto reply = redis_->current().call(args, deadline);
  auto now = Clock::now();
  bool valid = reply && reply->type == RedisReply::Type::kArray && reply->elements.size() == 2 &&
               reply->elements[0].type == RedisReply::Type::kInteger &&
               reply->elements[1].type == RedisReply::Type::kInteger;
  if (valid) {
    // Bounded by what the script can answer (a broken store or a proxy before it may say
    // anything): never more tokens than asked, never further ahead than the tolerance.
    auto granted =
        static_cast<unsigned>(std::clamp<long long>(reply->elements[0].integer, 0, batch_));
    double ahead = std::clamp(static_cast<double>(reply->elements[1].integer), 0.0, tolerance_us_);
    if (now >= state.expires) state.tokens = 0;
    state.tokens += granted;
    state.expires = now + kLease;
    state.remaining =
        static_cast<std::uint64_t>(std::max(0.0, tolerance_us_ - ahead) / interval_us_);
    state.reset = ahead / 1e6;
    if (granted == 0) {
      state.refused_until = now + std::chrono::microseconds(static_cast<std::int64_t>(
                                      std::ceil(ahead + interval_us_ - tolerance_us_)));
    }
    state.failed = false;
  } else {
    state.failed = true;  // (an error reply is logged by the client, once per back-off)
  }
  state.refilling = false;
  refilled->set();
}

RateLimiter::Decision RedisRateLimit::take(std::string_view text, Clock::time_point now) {
  // Named in Redis by a hash every instance computes alike (the keys are Redis's to keep).
  std::uint64_t key = rate_limit_hash(text);
  auto& slot = workers_.at(Worker::current()->index());
  if (!slot) slot = std::make_unique<WorkerKeys>();
  WorkerKeys& worker = *slot;
  if (worker.keys.size() > kSweepAbove && now >= worker.next_sweep) {
    std::erase_if(worker.keys, [&](const auto& entry) {
      const KeyState& s = *entry.second;
      return entry.second.use_count() == 1 && !s.refilling && now >= s.expires &&
             now >= s.refused_until;
    });
    worker.next_sweep = now + std::chrono::seconds(1);
  }
  auto& entry = worker.keys[key];
  if (!entry) entry = std::make_shared<KeyState>();
  std::shared_ptr<KeyState> state = entry;  // a sweep during a park must not free it
  Deadline deadline = Deadline::at(now + redis_->config().timeout);
  for (;;) {
    if (state->tokens > 0 && now < state->expires) {
      --state->tokens;
      if (state->tokens * 2 <= batch_ && !state->refilling && batch_ > 1) {
        // Half spent: the next batch is fetched while this one lasts.
        spawn([self = shared_from_this(), state, key] {
          self->refill(*state, key, Deadline::after(self->redis_->config().timeout));
        }).detach();
      }
      return Decision{.allowed = true,
                      .remaining = state->remaining + state->tokens,
                      .retry_after = 0,
                      .reset = state->reset};
    }
    if (now < state->refused_until) {
      return Decision{.allowed = false,
                      .remaining = 0,
                      .retry_after = seconds(state->refused_until - now),
                      .reset = state->reset};
    }
    if (deadline.expired(now)) return failed();
    if (state->refilling) {
      std::shared_ptr<Event> refilled = state->refilled;
      if (refilled->wait(deadline)) return failed();
    } else {
      refill(*state, key, deadline);
    }
    if (state->failed) return failed();
    now = Clock::now();
  }
}

}  // namespace spindle::proxy
