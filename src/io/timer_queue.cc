#include "spindle/io/timer_queue.h"

#include <algorithm>
#include <cassert>

namespace spindle {

void TimerQueue::place(std::size_t i, const Entry& e) {
  heap_[i] = e;
  if (e.timer != nullptr) e.timer->index = i;
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
  t->index = Timer::kNotQueued;
  if (i + 1 == heap_.size()) {
    heap_.pop_back();  // the last entry leaves no gap
  } else {
    heap_[i].timer = nullptr;
    ++holes_;
  }
  if (holes_ == heap_.size()) {
    heap_.clear();  // nothing but holes: an idle worker keeps no deadline to wake for
    holes_ = 0;
  } else if (holes_ > kHoleFloor && holes_ > heap_.size() / 2) {
    compact();
  }
}

Timer* TimerQueue::pop_due(Clock::time_point now) {
  while (!heap_.empty() && heap_.front().when <= now) {
    Timer* t = heap_.front().timer;
    remove_root();
    if (t != nullptr) {
      t->index = Timer::kNotQueued;
      return t;
    }
    --holes_;
  }
  return nullptr;
}

void TimerQueue::remove_root() {
  Entry last = heap_.back();
  heap_.pop_back();
  if (heap_.empty()) return;
  place(0, last);
  sift_down(0);
}

void TimerQueue::compact() {
  std::erase_if(heap_, [](const Entry& e) { return e.timer == nullptr; });
  holes_ = 0;
  // The standard heap algorithms use this heap's layout (a parent at (i - 1) / 2): made in
  // linear time within this array, then each timer's index written once.
  std::ranges::make_heap(heap_, [](const Entry& a, const Entry& b) { return earlier(b, a); });
  for (std::size_t i = 0; i < heap_.size(); ++i) heap_[i].timer->index = i;
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
