#include "spindle/sync/mutex.h"

namespace spindle {

std::error_code Mutex::lock_until(Deadline deadline, bool cancellable) {
  if (try_lock()) return {};
  lock_.lock();
  // Mark the mutex contended so that the holder's unlock comes to the wait list; if it was
  // released meanwhile we now hold it (contended needlessly: its unlock just finds nobody).
  if (state_.exchange(kContended, std::memory_order_acquire) == kUnlocked) {
    lock_.unlock();
    return {};
  }
  // Woken without error means unlock() handed the lock to us (state stays kContended).
  auto ec = waiters_.wait(lock_, deadline, cancellable);
  lock_.unlock();
  return ec;
}

void Mutex::unlock_slow() {
  lock_.lock();
  if (!waiters_.notify_one()) state_.store(kUnlocked, std::memory_order_release);
  lock_.unlock();
}

}  // namespace spindle
