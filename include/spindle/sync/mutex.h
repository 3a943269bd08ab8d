#pragma once
/// Mutex: a fiber-aware mutual-exclusion lock (std::timed_mutex names). A contended lock()
/// parks the fiber, never the thread; unlock() wakes the first waiter, which competes for the
/// lock again (no hand-off: throughput over strict FIFO fairness).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <system_error>

#include "spindle/fiber/spin_lock.h"
#include "spindle/io/deadline.h"
#include "spindle/sync/wait_list.h"

namespace spindle {

/// A mutex for fibers on any worker (and plain threads). Uncontended lock/unlock is one
/// compare-and-swap each.
class Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  /// Acquires the lock, waiting as long as it takes. Not cancellable (like std::mutex).
  void lock() { (void)lock_until(Deadline::never(), kNotCancellable); }
  /// Acquires the lock if it is free.
  bool try_lock() {
    std::uint32_t expected = kUnlocked;
    return state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire);
  }
  /// Acquires the lock before `deadline`. Returns {} when acquired, std::errc::timed_out or
  /// std::errc::operation_canceled (the fiber was asked to stop) when not.
  [[nodiscard]] std::error_code lock_until(Deadline deadline, bool cancellable = kCancellable);
  /// try_lock_until for std::unique_lock: true when acquired.
  bool try_lock_until(Clock::time_point when) { return !lock_until(Deadline::at(when)); }
  /// try_lock_for for std::unique_lock: true when acquired.
  template <typename Rep, typename Period>
  bool try_lock_for(std::chrono::duration<Rep, Period> d) {
    return !lock_until(Deadline::after(d));
  }
  /// Releases the lock and wakes the first waiter, if any.
  void unlock() {
    if (state_.exchange(kUnlocked, std::memory_order_release) == kContended) unlock_slow();
  }

 private:
  static constexpr std::uint32_t kUnlocked = 0;
  static constexpr std::uint32_t kLocked = 1;
  /// Locked, and waiters may be queued: unlock must look at the wait list.
  static constexpr std::uint32_t kContended = 2;

  void unlock_slow();

  /// kUnlocked, kLocked or kContended.
  std::atomic<std::uint32_t> state_{kUnlocked};
  /// Guards waiters_.
  SpinLock lock_;
  /// Fibers and threads waiting for the lock.
  WaitList waiters_;
};

}  // namespace spindle
