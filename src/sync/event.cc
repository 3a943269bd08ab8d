#include "spindle/sync/event.h"

#include <mutex>

namespace spindle {

void Event::set() {
  std::lock_guard guard(lock_);
  set_.store(true, std::memory_order_release);
  waiters_.notify_all();
}

void Event::reset() {
  std::lock_guard guard(lock_);
  set_.store(false, std::memory_order_relaxed);
}

bool Event::is_set() const { return set_.load(std::memory_order_acquire); }

std::error_code Event::wait(Deadline deadline, bool cancellable) {
  std::unique_lock guard(lock_);
  while (!set_.load(std::memory_order_relaxed)) {
    if (auto ec = waiters_.wait(lock_, deadline, cancellable)) return ec;
  }
  return {};
}

}  // namespace spindle
