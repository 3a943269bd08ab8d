#pragma once
// Where a worker's pool puts a call (private to src/pg; no I/O, so that the rule is tested on
// its own). docs/database.md states the rule: the statements of a worker stay on the fewest
// connections that keep up, because each connection is a server process woken for every batch
// it is sent; statements spread over half-idle connections each wake a process for little work.

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>

namespace spindle::pg {

/// What the pool knows of one of its connections when it places a call, in the pool's order.
struct Lane {
  /// New calls may join it (healthy, not a transaction's, not kept free for one).
  bool open_to_calls = true;
  /// Statements sent and not answered, and calls handed it that have not sent yet.
  std::size_t depth = 0;
  /// How long its oldest unanswered statement has waited (zero when none).
  std::chrono::nanoseconds oldest{0};
  /// The server's recent time per statement answered on it (zero: not known yet).
  std::chrono::nanoseconds per_statement{0};
};

/// Where a call goes: `lane` (none: it waits for a connection to open) and whether another
/// connection should open.
struct Placement {
  std::optional<std::size_t> lane;
  bool open_another = false;
};

/// More statements than this on one connection wait too long whatever its recent pace says.
inline constexpr std::size_t kDeepestPipeline = 512;

/// A connection keeps up while its oldest statement waited less than `budget` and the
/// statements before a new one would take less than `budget` at its recent pace.
inline bool keeps_up(const Lane& lane, std::chrono::nanoseconds budget) {
  if (lane.depth == 0) return true;
  if (lane.depth >= kDeepestPipeline || lane.oldest >= budget) return false;
  return lane.per_statement * static_cast<std::int64_t>(lane.depth + 1) <= budget;
}

/// The first connection open to calls that keeps up (an idle one keeps up); when none does,
/// the least deep of those open to calls, and another connection opens if `room`.
inline Placement place(std::span<const Lane> lanes, bool room, std::chrono::nanoseconds budget) {
  std::optional<std::size_t> least;
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    const Lane& lane = lanes[i];
    if (!lane.open_to_calls) continue;
    if (keeps_up(lane, budget)) return Placement{.lane = i};
    if (!least || lane.depth < lanes[*least].depth) least = i;
  }
  return Placement{.lane = least, .open_another = room};
}

}  // namespace spindle::pg
