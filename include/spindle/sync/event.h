#pragma once
/// Event: a manual-reset flag that fibers and threads can wait for.

#include <atomic>
#include <system_error>

#include "spindle/fiber/spin_lock.h"
#include "spindle/io/deadline.h"
#include "spindle/sync/wait_list.h"

namespace spindle {

/// Once set, every wait returns at once until reset().
class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// Sets the flag and wakes every waiter. Safe from any thread, fiber or not.
  void set();
  /// Clears the flag.
  void reset();
  /// True if set (a load: no lock taken).
  bool is_set() const;
  /// Waits until set. Returns {}, std::errc::timed_out or std::errc::operation_canceled
  /// (never with `cancellable` false: kNotCancellable).
  [[nodiscard]] std::error_code wait(Deadline deadline = Deadline::never(),
                                     bool cancellable = true);

 private:
  /// Guards waiters_ and changes of set_.
  SpinLock lock_;
  /// The flag: changed under lock_, read without it where a stale answer is as good.
  std::atomic<bool> set_{false};
  /// Who waits for it.
  WaitList waiters_;
};

}  // namespace spindle
