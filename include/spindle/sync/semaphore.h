#pragma once
/// Semaphore: a counting semaphore for fibers on any worker and plain threads.

#include <cstddef>
#include <system_error>

#include "spindle/fiber/spin_lock.h"
#include "spindle/io/deadline.h"
#include "spindle/sync/wait_list.h"

namespace spindle {

/// Counts permits; acquire() takes one, waiting if none is free, release() gives them back
/// (straight to waiters first, in FIFO order).
class Semaphore {
 public:
  /// A semaphore with `permits` free permits.
  explicit Semaphore(std::size_t permits) : permits_(permits) {}
  Semaphore(const Semaphore&) = delete;
  Semaphore& operator=(const Semaphore&) = delete;

  /// Takes a permit, waiting until `deadline`. Returns {}, std::errc::timed_out or
  /// std::errc::operation_canceled.
  [[nodiscard]] std::error_code acquire(Deadline deadline = Deadline::never());
  /// Takes a permit if one is free.
  bool try_acquire();
  /// Returns `n` permits.
  void release(std::size_t n = 1);
  /// Free permits now (a snapshot).
  std::size_t available();

 private:
  /// Guards permits_ and waiters_.
  SpinLock lock_;
  /// Free permits.
  std::size_t permits_;
  /// Who waits for a permit.
  WaitList waiters_;
};

}  // namespace spindle
