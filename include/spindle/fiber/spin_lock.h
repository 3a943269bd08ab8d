#pragma once
/// SpinLock: a test-and-test-and-set lock for the few-instruction critical sections of the wait
/// machinery (wait lists, join state, worker inboxes), which may be shared between workers.

#include <atomic>

namespace spindle {

/// A spin lock; spins with a pause hint, then yields the thread. Never parks a fiber.
class SpinLock {
 public:
  /// Acquires the lock.
  void lock() noexcept {
    for (int spins = 0;; ++spins) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) relax(spins);
    }
  }
  /// Acquires the lock if it is free.
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  /// Releases the lock.
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  /// Backs off: a CPU pause first, a sched_yield once the holder has clearly been descheduled.
  static void relax(int spins) noexcept;

  /// True while held.
  std::atomic<bool> locked_{false};
};

}  // namespace spindle
