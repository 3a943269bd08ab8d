#include "spindle/sync/wait_list.h"

namespace spindle {

std::error_code WaitList::wait(SpinLock& lock, Deadline deadline, bool cancellable) {
  Waiter waiter;
  push_back(&waiter);
  auto ec = park(waiter, deadline, cancellable, AfterSwitch::unlock(lock));
  lock.lock();
  // A notifier unlinks whom it wakes; a timeout or cancellation leaves the unlinking to us.
  if (waiter.linked) remove(&waiter);
  return ec;
}

bool WaitList::notify_one() {
  while (Waiter* waiter = pop_front()) {
    if (waiter->notify()) return true;
    // Already claimed by its deadline or a cancellation: it will return an error; try the next.
  }
  return false;
}

std::size_t WaitList::notify_all() {
  std::size_t woken = 0;
  while (Waiter* waiter = pop_front()) woken += waiter->notify() ? 1 : 0;
  return woken;
}

void WaitList::push_back(Waiter* waiter) {
  waiter->next = nullptr;
  waiter->prev = tail_;
  if (tail_) {
    tail_->next = waiter;
  } else {
    head_ = waiter;
  }
  tail_ = waiter;
  waiter->linked = true;
}

void WaitList::remove(Waiter* waiter) {
  if (waiter->prev) {
    waiter->prev->next = waiter->next;
  } else {
    head_ = waiter->next;
  }
  if (waiter->next) {
    waiter->next->prev = waiter->prev;
  } else {
    tail_ = waiter->prev;
  }
  waiter->prev = waiter->next = nullptr;
  waiter->linked = false;
}

Waiter* WaitList::pop_front() {
  Waiter* waiter = head_;
  if (waiter) remove(waiter);
  return waiter;
}

}  // namespace spindle
