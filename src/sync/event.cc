#include "spindle/sync/event.h"

#include <mutex>

namespace spindle {

void Event::set() {
  std::lock_guard guard(lock_);
  set_ = true;
  waiters_.notify_all();
}

void Event::reset() {
  std::lock_guard guard(lock_);
  set_ = false;
}

bool Event::is_set() {
  std::lock_guard guard(lock_);
  return set_;
}

std::error_code Event::wait(Deadline deadline, bool cancellable) {
  std::unique_lock guard(lock_);
  while (!set_) {
    if (auto ec = waiters_.wait(lock_, deadline, cancellable)) return ec;
  }
  return {};
}

}  // namespace spindle
