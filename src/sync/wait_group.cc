#include "spindle/sync/wait_group.h"

#include <cassert>
#include <mutex>

namespace spindle {

void WaitGroup::add(std::size_t n) {
  std::lock_guard guard(lock_);
  count_ += n;
}

void WaitGroup::done() {
  std::lock_guard guard(lock_);
  assert(count_ > 0 && "WaitGroup::done without add");
  if (--count_ == 0) waiters_.notify_all();
}

std::size_t WaitGroup::count() {
  std::lock_guard guard(lock_);
  return count_;
}

std::error_code WaitGroup::wait(Deadline deadline, bool cancellable) {
  std::unique_lock guard(lock_);
  while (count_ != 0) {
    if (auto ec = waiters_.wait(lock_, deadline, cancellable)) return ec;
  }
  return {};
}

}  // namespace spindle
