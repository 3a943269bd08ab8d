// Which target a request goes to, and what its failures say of the target (targets.h).
#include "targets.h"

#include "spindle/base/log.h"

namespace spindle::proxy::detail {

using http::ExchangeErrc;

bool counts_against_target(std::error_code ec) {
  return ec != ExchangeErrc::kNoCapacity && ec != ExchangeErrc::kCancelled &&
         ec != ExchangeErrc::kPreempted && ec != ExchangeErrc::kHeadTooLarge &&
         ec != std::errc::invalid_argument;
}

std::optional<std::size_t> pick_target(Gateway::WorkerState& worker,
                                       const Gateway::Upstream& upstream, const TriedTargets& tried,
                                       std::uint64_t key_hash, bool* panic) {
  // The worker's scratch list: nothing parks between filling it and the pick.
  auto now = coarse_now();  // ejections last seconds
  std::vector<TargetView>& views = worker.views;
  views.resize(upstream.targets.size());
  for (std::size_t i = 0; i < views.size(); ++i) {
    views[i] = TargetView{.weight = upstream.targets[i].config.weight,
                          .priority = upstream.targets[i].config.priority,
                          .healthy = upstream.targets[i].health->healthy(now),
                          .in_flight = worker.in_flight[upstream.index][i],
                          .excluded = tried.contains(i)};
  }
  bool panicking = narrow_to_priority(views, upstream.config->panic_threshold);
  if (panic != nullptr) *panic = panicking;
  return worker.balancers[upstream.index]->pick(views, key_hash);
}

void note_target_failure(const Gateway::Upstream& upstream, std::size_t index, Metrics* metrics,
                         std::uint32_t series) {
  using Verdict = Gateway::Upstream::Verdict;
  Verdict verdict = upstream.record_failure(index, coarse_now());
  if (verdict == Verdict::kCounted) return;
  const Gateway::Target& target = upstream.targets[index];
  if (verdict == Verdict::kEjected) {
    log_warn("upstream {}: target {} failed {} times within {} ms: out for as long",
             upstream.config->name, target.label, upstream.config->passive_health.max_fails,
             upstream.config->passive_health.fail_timeout.count());
  } else {
    log_warn(
        "upstream {}: target {} is failing, but ejecting it would leave too few targets in "
        "(max_ejection_percent {}%, one always stays): it stays",
        upstream.config->name, target.label, upstream.config->passive_health.max_ejection_percent);
  }
  if (metrics != nullptr) metrics->record_ejection(series, verdict == Verdict::kWithheld);
}

}  // namespace spindle::proxy::detail
