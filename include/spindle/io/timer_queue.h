#pragma once
/// TimerQueue: the per-worker set of pending timers, a binary min-heap of intrusive nodes.
///
/// push and erase are O(log n); the earliest timer is O(1). Not thread-safe: a queue belongs to
/// one worker, and only that worker's thread touches it.
///
/// The heap holds each timer's key (when, insertion order) beside its pointer, so sifting
/// compares within the heap's own array: a timer lives in a parked fiber's frame, and with a
/// thousand requests waiting, reading each one's `when` on the way cost a cache miss a level.

#include <cstddef>
#include <cstdint>
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
  /// Removes `t` if it is queued. O(log n).
  void erase(Timer* t);
  /// The earliest timer, or nullptr if empty.
  Timer* top() const { return heap_.empty() ? nullptr : heap_.front().timer; }
  /// Removes and returns the earliest timer if it is due at `now`, else nullptr.
  Timer* pop_due(Clock::time_point now);
  /// Number of queued timers.
  std::size_t size() const { return heap_.size(); }
  /// True if no timer is queued.
  bool empty() const { return heap_.empty(); }

 private:
  struct Entry {
    Clock::time_point when;
    std::uint64_t seq;  ///< insertion order: equal deadlines fire first in, first out
    Timer* timer;
  };
  static bool earlier(const Entry& a, const Entry& b) {
    return a.when < b.when || (a.when == b.when && a.seq < b.seq);
  }
  void place(std::size_t i, const Entry& e);
  void sift_up(std::size_t i);
  void sift_down(std::size_t i);

  /// The heap; heap_[i].timer->index == i for every element.
  std::vector<Entry> heap_;
  /// Next insertion sequence number.
  std::uint64_t next_seq_ = 0;
};

}  // namespace spindle
