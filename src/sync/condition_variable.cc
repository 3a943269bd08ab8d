#include "spindle/sync/condition_variable.h"

namespace spindle {

std::error_code ConditionVariable::wait_until(Mutex& mutex, Deadline deadline) {
  lock_.lock();
  // Released only once we are on the list (under lock_), so no notification in between is lost.
  mutex.unlock();
  auto ec = waiters_.wait(lock_, deadline);
  lock_.unlock();
  // The caller's invariants need the mutex back even when cancelled.
  (void)mutex.lock_until(Deadline::never(), kNotCancellable);
  return ec;
}

void ConditionVariable::notify_one() {
  lock_.lock();
  waiters_.notify_one();
  lock_.unlock();
}

void ConditionVariable::notify_all() {
  lock_.lock();
  waiters_.notify_all();
  lock_.unlock();
}

}  // namespace spindle
