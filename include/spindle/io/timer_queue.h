#pragma once
/// TimerQueue: the per-worker set of pending timers, a binary min-heap of intrusive nodes.
///
/// push is O(log n), and O(1) for a deadline no earlier than the others (a timeout from now, the
/// usual case); erase is O(1). Not thread-safe: a queue belongs to one worker, and only that
/// worker's thread touches it.
///
/// A timer lives in a parked fiber's frame, so the heap touches timers as little as it can. It
/// holds each timer's key (when, insertion order) beside its pointer, so sifting compares within
/// its own array (reading each `when` on the way cost a cache miss a level). And erase leaves a
/// hole: the entry keeps its key, and so its place, without its timer. Erasing the textbook way
/// (the last entry moved into the gap and sifted down) wrote the `index` of every timer it moved
/// past — about seven other parked fibers' stacks an erase with a thousand requests waiting,
/// each write a cache miss and often a TLB miss, and most timers are erased, not fired. Holes
/// leave as they reach the root, or all at once when they outnumber the timers (so the heap holds
/// at most about twice its timers, whatever the pattern of pushes and erases).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "spindle/io/deadline.h"

namespace spindle {

class Waiter;

/// One pending timer. The owner embeds it (no allocation) and must erase it before destroying it.
struct Timer {
  /// Position in the heap, or kNotQueued.
  static constexpr std::size_t kNotQueued = SIZE_MAX;

  /// When the timer fires (read by push; changing it while queued changes nothing).
  Clock::time_point when{};
  /// Heap position (maintained by TimerQueue).
  std::size_t index = kNotQueued;
  /// Whom the timer wakes when it fires (the fiber layer's waiter), or nullptr.
  Waiter* waiter = nullptr;
  /// Otherwise, what to call when it fires (on the worker thread, outside any fiber).
  void (*on_fire)(Timer& timer) = nullptr;
  /// Whatever on_fire needs.
  void* owner = nullptr;

  /// True while the timer is in a queue.
  bool queued() const { return index != kNotQueued; }
};

/// A min-heap of timers ordered by (when, insertion order).
class TimerQueue {
 public:
  /// Adds `t` (which must not be queued), to fire at `t->when`. O(log n).
  void push(Timer* t);
  /// Removes `t` if it is queued. O(1), but for the occasional compaction.
  void erase(Timer* t);
  /// No timer fires before this moment (it may be an erased timer's: waking then finds nothing
  /// due, and the next answer is later); nullopt if no timer is queued.
  std::optional<Clock::time_point> next_deadline() const {
    if (heap_.empty()) return std::nullopt;
    return heap_.front().when;
  }
  /// Removes and returns the earliest timer if it is due at `now`, else nullptr.
  Timer* pop_due(Clock::time_point now);
  /// Number of queued timers.
  std::size_t size() const { return heap_.size() - holes_; }
  /// True if no timer is queued.
  bool empty() const { return size() == 0; }
  /// Entries the heap holds, erased timers' holes included: at most twice size() plus
  /// kHoleFloor.
  std::size_t slots() const { return heap_.size(); }

  /// Holes a heap may hold beyond half its entries before they are all removed at once.
  static constexpr std::size_t kHoleFloor = 64;

 private:
  struct Entry {
    Clock::time_point when;
    std::uint64_t seq;  ///< insertion order: equal deadlines fire first in, first out
    Timer* timer;       ///< nullptr: a hole, left by erase
  };
  static bool earlier(const Entry& a, const Entry& b) {
    return a.when < b.when || (a.when == b.when && a.seq < b.seq);
  }
  void place(std::size_t i, const Entry& e);
  void sift_up(std::size_t i);
  void sift_down(std::size_t i);
  /// Removes the root entry (a timer's or a hole).
  void remove_root();
  /// Removes every hole.
  void compact();

  /// The heap; heap_[i].timer->index == i for every entry that is not a hole.
  std::vector<Entry> heap_;
  /// Entries of heap_ that are holes.
  std::size_t holes_ = 0;
  /// Next insertion sequence number.
  std::uint64_t next_seq_ = 0;
};

}  // namespace spindle
