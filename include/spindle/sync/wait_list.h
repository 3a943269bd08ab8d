#pragma once
/// WaitList: the one core of every sync/ primitive — a FIFO of parked waiters.
///
/// The list is guarded by a SpinLock that belongs to the primitive (so one lock can cover the
/// primitive's own state and several lists). Waiters may be fibers of any worker or plain
/// threads; a waiter leaves the list when notified, timed out or cancelled.

#include <cstddef>
#include <system_error>

#include "spindle/fiber/spin_lock.h"
#include "spindle/fiber/waiter.h"
#include "spindle/io/deadline.h"

namespace spindle {

/// An intrusive FIFO of waiters. Every member requires the guarding lock to be held.
class WaitList {
 public:
  WaitList() = default;
  WaitList(const WaitList&) = delete;
  WaitList& operator=(const WaitList&) = delete;

  /// Parks the caller at the back of the list. `lock` is held on entry, released while parked
  /// and held again on return. Returns {} when notified, std::errc::timed_out or (if
  /// `cancellable`) std::errc::operation_canceled.
  std::error_code wait(SpinLock& lock, Deadline deadline, bool cancellable = kCancellable);
  /// Wakes the first waiter that can still be woken. True if one was.
  bool notify_one();
  /// Wakes every waiter; returns how many.
  std::size_t notify_all();
  /// True if nobody waits.
  bool empty() const { return head_ == nullptr; }

 private:
  void push_back(Waiter* waiter);
  void remove(Waiter* waiter);
  Waiter* pop_front();

  /// Oldest waiter.
  Waiter* head_ = nullptr;
  /// Newest waiter.
  Waiter* tail_ = nullptr;
};

}  // namespace spindle
