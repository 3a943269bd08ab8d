#pragma once
// Where a worker's pool puts a call (private to src/pg; no I/O, so that the rule is tested on
// its own). docs/database.md states the rule: the statements of a worker stay on the fewest
// connections that keep up, because each connection is a server process woken for every batch
// it is sent; statements spread over half-idle connections each wake a process for little work.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace spindle::pg {

/// What the pool knows of one of its connections when it places a call, in the pool's order.
struct Lane {
  /// New calls may join it (healthy, not a transaction's, not kept free for one).
  bool open_to_calls = true;
  /// Statements sent and not answered, and calls handed it that have not sent yet.
  std::size_t depth = 0;
  /// How long its server has answered nothing while it holds a statement (zero when none).
  std::chrono::nanoseconds stalled{0};
  /// The server's recent time per statement answered on it while it was behind (zero: not
  /// known yet).
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

/// A connection keeps up while its server answered something within `budget` and the
/// statements before a new one would take at most `budget` at its recent pace.
inline bool keeps_up(const Lane& lane, std::chrono::nanoseconds budget) {
  if (lane.depth == 0) return true;
  if (lane.depth >= kDeepestPipeline || lane.stalled >= budget) return false;
  return lane.per_statement * static_cast<std::int64_t>(lane.depth + 1) <= budget;
}

/// A connection's pace after a read that took `answered` answers (at least one), `elapsed`
/// after the previous read (or after the send of the first of them, if later). Only while the
/// server is `behind` (a statement sent before the previous read is still unanswered) is that
/// its own pace; once it caught up, the time also holds the worker's delay in reading (answers
/// waiting in the socket while the worker ran requests), so it can only lower the pace. Each
/// read moves the pace an eighth of the way (zero: not known yet, the sample is taken whole).
inline std::chrono::nanoseconds next_pace(std::chrono::nanoseconds pace,
                                          std::chrono::nanoseconds elapsed, std::size_t answered,
                                          bool behind) {
  std::chrono::nanoseconds sample = elapsed / static_cast<std::int64_t>(answered);
  if (pace.count() == 0) return sample;
  if (!behind) sample = std::min(sample, pace);
  return pace + (sample - pace) / 8;
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
