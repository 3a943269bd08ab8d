#include "spindle/io/timer_queue.h"

#include <cassert>

namespace spindle {

void TimerQueue::place(std::size_t i, Timer* t) {
  heap_[i] = t;
  t->index = i;
}

void TimerQueue::push(Timer* t) {
  assert(!t->queued());
  t->seq = next_seq_++;
  heap_.push_back(t);
  t->index = heap_.size() - 1;
  sift_up(t->index);
}

void TimerQueue::erase(Timer* t) {
  if (!t->queued()) return;
  std::size_t i = t->index;
  assert(i < heap_.size() && heap_[i] == t);
  Timer* last = heap_.back();
  heap_.pop_back();
  t->index = Timer::kNotQueued;
  if (last == t) return;
  place(i, last);
  // The moved element may belong above or below its new position.
  sift_up(i);
  sift_down(last->index);
}

Timer* TimerQueue::pop_due(Clock::time_point now) {
  if (heap_.empty() || heap_.front()->when > now) return nullptr;
  Timer* t = heap_.front();
  erase(t);
  return t;
}

void TimerQueue::sift_up(std::size_t i) {
  Timer* t = heap_[i];
  while (i > 0) {
    std::size_t parent = (i - 1) / 2;
    if (!earlier(t, heap_[parent])) break;
    place(i, heap_[parent]);
    i = parent;
  }
  place(i, t);
}

void TimerQueue::sift_down(std::size_t i) {
  Timer* t = heap_[i];
  const std::size_t n = heap_.size();
  for (;;) {
    std::size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && earlier(heap_[child + 1], heap_[child])) ++child;
    if (!earlier(heap_[child], t)) break;
    place(i, heap_[child]);
    i = child;
  }
  place(i, t);
}

}  // namespace spindle
