#include "spindle/sync/semaphore.h"

#include <mutex>

namespace spindle {

std::error_code Semaphore::acquire(Deadline deadline) {
  std::unique_lock guard(lock_);
  if (permits_ > 0) {
    --permits_;
    return {};
  }
  // Woken without error means release() handed its permit to us.
  return waiters_.wait(lock_, deadline);
}

bool Semaphore::try_acquire() {
  std::lock_guard guard(lock_);
  if (permits_ == 0) return false;
  --permits_;
  return true;
}

void Semaphore::release(std::size_t n) {
  std::lock_guard guard(lock_);
  for (; n > 0; --n) {
    if (!waiters_.notify_one()) break;
  }
  permits_ += n;
}

std::size_t Semaphore::available() {
  std::lock_guard guard(lock_);
  return permits_;
}

}  // namespace spindle
