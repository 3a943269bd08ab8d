#include "spindle/sync/mutex.h"

namespace spindle {

std::error_code Mutex::lock_until(Deadline deadline, bool cancellable) {
  if (try_lock()) return {};
  for (;;) {
    lock_.lock();
    // Mark the mutex contended so that the holder's unlock looks at the wait list. If it was
    // free we now hold it (contended needlessly: our unlock just finds nobody to wake).
    if (state_.exchange(kContended, std::memory_order_acquire) == kUnlocked) {
      lock_.unlock();
      return {};
    }
    auto ec = waiters_.wait(lock_, deadline, cancellable);
    lock_.unlock();
    if (ec) return ec;
    // Woken by an unlock: compete again. No hand-off, so the unlocker (or anyone running) may
    // take it first; that avoids a lock convoy at the cost of strict FIFO fairness.
  }
}

void Mutex::unlock_slow() {
  // Called when the state was kContended: it is now unlocked; wake one waiter to compete.
  lock_.lock();
  waiters_.notify_one();
  lock_.unlock();
}

}  // namespace spindle
