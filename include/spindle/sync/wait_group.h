#pragma once
/// WaitGroup: waits for a set of fibers (or any counted work) to finish.

#include <cstddef>
#include <system_error>

#include "spindle/fiber/spin_lock.h"
#include "spindle/io/deadline.h"
#include "spindle/sync/wait_list.h"

namespace spindle {

/// Counts outstanding work; wait() returns once the count is back to zero.
class WaitGroup {
 public:
  WaitGroup() = default;
  WaitGroup(const WaitGroup&) = delete;
  WaitGroup& operator=(const WaitGroup&) = delete;

  /// Adds `n` to the count.
  void add(std::size_t n = 1);
  /// Subtracts one; at zero, wakes every waiter. Calling it more often than add() is a bug.
  void done();
  /// The count now.
  std::size_t count();
  /// Waits until the count is zero. Returns {}, std::errc::timed_out or (if `cancellable`)
  /// std::errc::operation_canceled. Not cancellable: for an owner that must outlive the work
  /// it counts even after it was asked to stop.
  [[nodiscard]] std::error_code wait(Deadline deadline = Deadline::never(),
                                     bool cancellable = kCancellable);

 private:
  /// Guards count_ and waiters_.
  SpinLock lock_;
  /// Outstanding work.
  std::size_t count_ = 0;
  /// Who waits for zero.
  WaitList waiters_;
};

}  // namespace spindle
