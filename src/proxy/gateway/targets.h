#pragma once
// Which target of an upstream a request goes to, and what its failures say of the target
// (private to src/proxy): used by the forwarded request, forward_auth and mirror alike.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <system_error>
#include <vector>

#include "spindle/proxy/gateway.h"

namespace spindle::proxy::detail {

/// Which targets a request has tried: a bit each for the first 64, a list beyond.
class TriedTargets {
 public:
  /// True if target `i` was tried.
  bool contains(std::size_t i) const {
    return i < 64 ? (low_ >> i) & 1 : std::ranges::find(high_, i) != high_.end();
  }
  /// Notes target `i` as tried.
  void add(std::size_t i) {
    if (i < 64) {
      low_ |= std::uint64_t{1} << i;
    } else if (!contains(i)) {
      high_.push_back(i);
    }
  }

 private:
  std::uint64_t low_ = 0;          ///< targets 0 to 63, a bit each
  std::vector<std::size_t> high_;  ///< targets from 64 on
};

/// True if a failure says something about the target's health (not the client's doing, nor
/// our own limits).
bool counts_against_target(std::error_code ec);

/// A target of `upstream` by its balancer, among the healthy ones not tried yet; or, with
/// fewer healthy targets than the panic threshold, among all not tried yet (`panic` says so).
/// nullopt when none is left.
std::optional<std::size_t> pick_target(Gateway::WorkerState& worker,
                                       const Gateway::Upstream& upstream, const TriedTargets& tried,
                                       std::uint64_t key_hash, bool* panic = nullptr);

/// A failure of target `index` that says something about it (counts_against_target): counted
/// by passive checking, which may eject the target, within the upstream's cap (logged either
/// way, and counted in `metrics` under `series`).
void note_target_failure(const Gateway::Upstream& upstream, std::size_t index, Metrics* metrics,
                         std::uint32_t series);

}  // namespace spindle::proxy::detail
