#include "spindle/fiber/scheduler.h"

#include <cassert>

#include "sanitizer.h"

namespace spindle {

void Scheduler::push(Fiber* fiber) {
  fiber->next_ready_ = nullptr;
  if (tail_) {
    tail_->next_ready_ = fiber;
  } else {
    head_ = fiber;
  }
  tail_ = fiber;
  ++ready_;
}

Fiber* Scheduler::pop() {
  Fiber* fiber = head_;
  if (!fiber) return nullptr;
  head_ = fiber->next_ready_;
  if (!head_) tail_ = nullptr;
  fiber->next_ready_ = nullptr;
  --ready_;
  return fiber;
}

bool Scheduler::resume(Fiber* fiber) {
  assert(current_ == nullptr);
  current_ = fiber;
  if (!thread_tsan_fiber_) thread_tsan_fiber_ = sanitizer::tsan_current();
  void* fake_stack = nullptr;
  sanitizer::start_switch(&fake_stack, fiber->stack_.base, fiber->stack_.size);
  sanitizer::tsan_switch(fiber->tsan_fiber_);
  fiber->context_ = std::move(fiber->context_).resume();
  sanitizer::finish_switch(fake_stack, nullptr, nullptr);
  current_ = nullptr;
  if (after_.fn) std::exchange(after_, AfterSwitch{})();
  return !fiber->context_;
}

void Scheduler::suspend(AfterSwitch after) {
  Fiber* fiber = current_;
  assert(fiber != nullptr);
  after_ = after;
  sanitizer::start_switch(&fiber->asan_fake_stack_, thread_stack_bottom_, thread_stack_size_);
  sanitizer::tsan_switch(thread_tsan_fiber_);
  fiber->caller_ = std::move(fiber->caller_).resume();
  sanitizer::finish_switch(fiber->asan_fake_stack_, &thread_stack_bottom_, &thread_stack_size_);
}

void Scheduler::on_fiber_entry(Fiber*) {
  sanitizer::finish_switch(nullptr, &thread_stack_bottom_, &thread_stack_size_);
}

void Scheduler::on_fiber_exit(Fiber*) {
  // nullptr: this stack's fake frames can be freed, it is never resumed again.
  sanitizer::start_switch(nullptr, thread_stack_bottom_, thread_stack_size_);
  sanitizer::tsan_switch(thread_tsan_fiber_);
}

}  // namespace spindle
