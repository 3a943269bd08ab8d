#include "spindle/proxy/balancer.h"

#include <fmt/format.h>

#include <algorithm>

namespace spindle::proxy {
namespace {

// splitmix64's finaliser: spreads the bits of a weak hash.
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Smooth weighted round robin: every pick adds each available target's weight to its current
// weight and takes the largest, which then gives back the total.
class Weighted final : public Balancer {
 public:
  explicit Weighted(std::size_t count) : current_(count, 0) {}
  std::optional<std::size_t> pick(std::span<const TargetView> targets, std::uint64_t) override {
    if (current_.size() != targets.size()) current_.assign(targets.size(), 0);
    std::optional<std::size_t> best;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (!targets[i].available()) continue;
      current_[i] += targets[i].weight;
      total += targets[i].weight;
      if (!best || current_[i] > current_[*best]) best = i;
    }
    if (best) current_[*best] -= total;
    return best;
  }

 private:
  std::vector<std::int64_t> current_;
};

class LeastConnections final : public Balancer {
 public:
  std::optional<std::size_t> pick(std::span<const TargetView> targets, std::uint64_t) override {
    std::optional<std::size_t> best;
    // Start after the last pick, so that ties go round.
    for (std::size_t k = 0; k < targets.size(); ++k) {
      std::size_t i = (start_ + k) % targets.size();
      if (!targets[i].available()) continue;
      // in_flight / weight, compared without division.
      if (!best || targets[i].in_flight * targets[*best].weight <
                       targets[*best].in_flight * targets[i].weight) {
        best = i;
      }
    }
    if (best) start_ = *best + 1;
    return best;
  }

 private:
  std::size_t start_ = 0;
};

class RandomTwo final : public Balancer {
 public:
  std::optional<std::size_t> pick(std::span<const TargetView> targets, std::uint64_t) override {
    available_.clear();
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (targets[i].available()) available_.push_back(i);
    }
    if (available_.empty()) return std::nullopt;
    if (available_.size() == 1) return available_[0];
    std::size_t a = next() % available_.size();
    std::size_t b = next() % (available_.size() - 1);
    if (b >= a) ++b;  // two distinct ones
    const TargetView& x = targets[available_[a]];
    const TargetView& y = targets[available_[b]];
    return x.in_flight * y.weight <= y.in_flight * x.weight ? available_[a] : available_[b];
  }

 private:
  std::uint64_t next() { return mix(state_ += 0x9e3779b97f4a7c15ULL); }
  std::uint64_t state_ = 0x853c49e6748fea9bULL;
  std::vector<std::size_t> available_;
};

class ConsistentHash final : public Balancer {
 public:
  explicit ConsistentHash(std::span<const RingTarget> targets) {
    // A target's points depend on its own weight only, so a target that joins or leaves moves
    // only keys to or from itself, whatever the weights add up to (a ring scaled to the total
    // would move keys among the others). Bounded per target: weights past kMostWeight count as
    // kMostWeight here (at most 160 x 256 points, ~640 KiB, a target).
    constexpr std::uint64_t kPointsPerWeight = 160, kMostWeight = 256;
    for (std::size_t t = 0; t < targets.size(); ++t) {
      std::uint64_t points =
          kPointsPerWeight * std::clamp<std::uint64_t>(targets[t].weight, 1, kMostWeight);
      for (std::uint64_t p = 0; p < points; ++p) {
        ring_.push_back({hash_key(fmt::format("{}#{}", targets[t].key, p)), t});
      }
    }
    std::ranges::sort(ring_, {}, &Point::hash);
  }
  std::optional<std::size_t> pick(std::span<const TargetView> targets,
                                  std::uint64_t key_hash) override {
    if (ring_.empty()) return std::nullopt;
    auto it = std::ranges::lower_bound(ring_, key_hash, {}, &Point::hash);
    // Walk on from the key's point to the first available target.
    for (std::size_t n = 0; n < ring_.size(); ++n, ++it) {
      if (it == ring_.end()) it = ring_.begin();
      if (it->target < targets.size() && targets[it->target].available()) return it->target;
    }
    return std::nullopt;
  }

 private:
  struct Point {
    std::uint64_t hash;
    std::size_t target;
  };
  std::vector<Point> ring_;
};

}  // namespace

namespace {

// The healthy share of each priority of `targets`, summed (Envoy's normalised total health),
// true if below `threshold` percent. No allocation: picks are per request.
bool below_panic_threshold(std::span<const TargetView> targets, unsigned threshold) {
  std::size_t healthy = 0;
  bool one_priority = true;
  for (const TargetView& t : targets) {
    healthy += t.healthy ? 1 : 0;
    one_priority = one_priority && t.priority == targets[0].priority;
  }
  if (one_priority) return healthy * 100 < std::size_t{threshold} * targets.size();
  // Priorities are few: each is found by a scan for the next one up.
  double share = 0;
  std::optional<unsigned> done;
  for (;;) {
    std::optional<unsigned> next;
    for (const TargetView& t : targets) {
      if ((!done || t.priority > *done) && (!next || t.priority < *next)) next = t.priority;
    }
    if (!next) break;
    std::size_t up = 0, all = 0;
    for (const TargetView& t : targets) {
      if (t.priority != *next) continue;
      up += t.healthy ? 1 : 0;
      ++all;
    }
    share += static_cast<double>(up) / static_cast<double>(all);
    done = next;
  }
  return std::min(share, 1.0) * 100 + 1e-9 < threshold;
}

}  // namespace

bool narrow_to_priority(std::span<TargetView> targets, unsigned panic_threshold) {
  if (targets.empty()) return false;
  bool panicking = below_panic_threshold(targets, panic_threshold);
  if (panicking) {
    for (TargetView& t : targets) t.healthy = true;
  }
  std::optional<unsigned> lowest;
  for (const TargetView& t : targets) {
    if (t.available() && (!lowest || t.priority < *lowest)) lowest = t.priority;
  }
  if (lowest) {
    for (TargetView& t : targets) t.excluded = t.excluded || t.priority != *lowest;
  }
  return panicking;
}

std::uint64_t hash_key(std::string_view key) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : key) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return mix(h);
}

std::unique_ptr<Balancer> Balancer::make(const UpstreamConfig& upstream) {
  std::vector<RingTarget> targets;
  for (const TargetConfig& t : upstream.targets) {
    targets.push_back({fmt::format("{}:{}", t.host, t.port), t.weight});
  }
  return make(upstream.balancer, targets);
}

std::unique_ptr<Balancer> Balancer::make(BalancerKind kind, std::span<const RingTarget> targets) {
  switch (kind) {
    case BalancerKind::kRoundRobin:  // with equal weights, smooth weighted is plain rotation
    case BalancerKind::kWeighted:
      return std::make_unique<Weighted>(targets.size());
    case BalancerKind::kLeastConnections:
      return std::make_unique<LeastConnections>();
    case BalancerKind::kRandomTwo:
      return std::make_unique<RandomTwo>();
    case BalancerKind::kConsistentHash:
      return std::make_unique<ConsistentHash>(targets);
  }
  return std::make_unique<Weighted>(targets.size());
}

}  // namespace spindle::proxy
