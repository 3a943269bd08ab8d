#include "spindle/io/timer_queue.h"

#include <cassert>

namespace spindle {

void TimerQueue::place(std::size_t i, const Entry& e) {
  heap_[i] = e;
  e.timer->index = i;
}

void TimerQueue::push(Timer* t) {
  assert(!t->queued());
  heap_.push_back({t->when, next_seq_++, t});
  t->index = heap_.size() - 1;
  sift_up(t->index);
}

void TimerQueue::erase(Timer* t) {
  if (!t->queued()) return;
  std::size_t i = t->index;
  assert(i < heap_.size() && heap_[i].timer == t);
  Entry last = heap_.back();
  heap_.pop_back();
  t->index = Timer::kNotQueued;
  if (last.timer == t) return;
  place(i, last);
  // The moved element may belong above or below its new position.
  sift_up(i);
  sift_down(last.timer->index);
}

Timer* TimerQueue::pop_due(Clock::time_point now) {
  if (heap_.empty() || heap_.front().when > now) return nullptr;
  Timer* t = heap_.front().timer;
  erase(t);
  return t;
}

void TimerQueue::sift_up(std::size_t i) {
  Entry e = heap_[i];
  while (i > 0) {
    std::size_t parent = (i - 1) / 2;
    if (!earlier(e, heap_[parent])) break;
    place(i, heap_[parent]);
    i = parent;
  }
  place(i, e);
}

void TimerQueue::sift_down(std::size_t i) {
  Entry e = heap_[i];
  const std::size_t n = heap_.size();
  for (;;) {
    std::size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && earlier(heap_[child + 1], heap_[child])) ++child;
    if (!earlier(heap_[child], e)) break;
    place(i, heap_[child]);
    i = child;
  }
  place(i, e);
}

}  // namespace spindle
