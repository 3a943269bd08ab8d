#pragma once
/// Balancers: which target of an upstream takes the next request. One balancer per worker and
/// upstream (no locks: a worker's requests are its own); what they read of the targets —
/// weight, health, requests in flight on this worker — is passed in on every pick.
///
/// round_robin and weighted: smooth weighted round robin, as nginx's round robin (weights 5,
/// 1, 1 give a a b a c a a: no burst of one target; equal weights give plain rotation).
/// least_connections: the fewest requests in flight relative to weight, ties in turn.
/// random_two: of two targets drawn at random, the one with fewer requests in flight.
/// consistent_hash: a ring of 160 points per unit of weight (fewer, in proportion, when the
/// weights add up to more than 256: SRV weights go to 1000); a key goes to the first point at
/// or after its hash, so removing a target moves only the keys it had.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/proxy/config.h"

namespace spindle::proxy {

/// What a balancer knows of one target when it picks.
struct TargetView {
  /// From the configuration (1-1000).
  unsigned weight = 1;
  /// Its SRV priority (0 for configured targets): lower ones first, the others are backups.
  unsigned priority = 0;
  /// False while health checks have taken it out.
  bool healthy = true;
  /// Requests in flight to it from this worker.
  std::size_t in_flight = 0;
  /// Already tried for this request (a retry goes elsewhere).
  bool excluded = false;

  bool available() const { return healthy && !excluded; }
};

/// What a balancer is made over, per target: where it sits on consistent_hash's ring (its
/// name, port and address, such as "api.test:80 10.0.0.2:80": not its position, nor anything
/// that changes with the other targets, so that adding or removing another target leaves its
/// points) and its weight.
struct RingTarget {
  std::string key;      ///< the target's name, port and address
  unsigned weight = 1;  ///< 1-1000
};

class Balancer {
 public:
  virtual ~Balancer() = default;
  /// The index of the target to use, or nullopt if none is available. `key_hash` is the hash
  /// of the request's key (hash_key()) for consistent_hash; the others ignore it.
  virtual std::optional<std::size_t> pick(std::span<const TargetView> targets,
                                          std::uint64_t key_hash) = 0;

  /// The balancer `upstream` asks for, over its configured targets (their order and weights).
  static std::unique_ptr<Balancer> make(const UpstreamConfig& upstream);
  /// A balancer of `kind` over `targets` as they were resolved (from SRV records, a name's
  /// addresses or the configuration), in the order picks index them.
  static std::unique_ptr<Balancer> make(BalancerKind kind, std::span<const RingTarget> targets);
};

/// Narrows `targets` to those a pick may take (the others are marked excluded) and says
/// whether the upstream panics. The priority taken is the lowest with a healthy target not yet
/// tried (RFC 2782: the others are backups, used when every target of the lower ones is down
/// or tried). Panic, as Envoy's: when the healthy share of each priority, summed over the
/// priorities (at most 100%), is below `panic_threshold` percent, the checks (or the clients
/// causing the failures) are more likely wrong than the targets: every target counts as
/// healthy, and the lowest priority with one not yet tried is taken.
bool narrow_to_priority(std::span<TargetView> targets, unsigned panic_threshold);

/// A 64-bit hash of `key` (FNV-1a, then mixed), stable across processes and runs: instances
/// of spindle behind one L4 balancer send a key to the same target.
std::uint64_t hash_key(std::string_view key);

}  // namespace spindle::proxy
