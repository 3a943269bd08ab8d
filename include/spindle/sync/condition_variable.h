#pragma once
/// ConditionVariable: waits for a condition guarded by a spindle::Mutex (std names).

#include <system_error>

#include "spindle/fiber/spin_lock.h"
#include "spindle/io/deadline.h"
#include "spindle/sync/mutex.h"
#include "spindle/sync/wait_list.h"

namespace spindle {

/// A condition variable for fibers on any worker and plain threads.
class ConditionVariable {
 public:
  ConditionVariable() = default;
  ConditionVariable(const ConditionVariable&) = delete;
  ConditionVariable& operator=(const ConditionVariable&) = delete;

  /// Atomically releases `mutex` and waits for a notification, `deadline` or cancellation;
  /// re-acquires `mutex` before returning in every case. Returns {}, std::errc::timed_out or
  /// std::errc::operation_canceled. Spurious wake-ups are possible; prefer the predicate form.
  std::error_code wait_until(Mutex& mutex, Deadline deadline);
  /// Waits until `pred()` holds (checked under `mutex`). Returns {} when it holds, or the error
  /// that ended the wait while it did not.
  template <typename Pred>
  std::error_code wait_until(Mutex& mutex, Deadline deadline, Pred pred) {
    while (!pred()) {
      if (auto ec = wait_until(mutex, deadline)) return pred() ? std::error_code{} : ec;
    }
    return {};
  }
  /// Waits with no deadline (still cancellable).
  std::error_code wait(Mutex& mutex) { return wait_until(mutex, Deadline::never()); }
  /// Waits for `pred` with no deadline (still cancellable).
  template <typename Pred>
  std::error_code wait(Mutex& mutex, Pred pred) {
    return wait_until(mutex, Deadline::never(), std::move(pred));
  }

  /// Wakes one waiter.
  void notify_one();
  /// Wakes every waiter.
  void notify_all();

 private:
  /// Guards waiters_.
  SpinLock lock_;
  /// The waiting fibers and threads.
  WaitList waiters_;
};

}  // namespace spindle
