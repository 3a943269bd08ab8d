#include "spindle/fiber/scheduler.h"

#include <boost/context/detail/fcontext.hpp>
#include <cassert>
#include <utility>

#include "sanitizer.h"
#include "spindle/fiber/worker.h"

namespace spindle {

// Fibers switch with Boost.Context's fcontext primitives (make_fcontext / jump_fcontext), the
// assembly under boost::context::fiber. Driving them directly lets a fiber jump straight to the
// next one, and a finished fiber jump away and leave its stack to the pool: no forced
// unwinding, no frames that run after the last switch (which would confuse ThreadSanitizer).
//
// Every jump passes the fiber it leaves (nullptr for the worker loop) as its data, so whoever
// arrives records where that context was saved.
namespace fctx = boost::context::detail;

/// The first frame of every fiber: runs its body, then leaves its stack for good.
struct FiberEntry {
  [[noreturn]] static void run(fctx::transfer_t transfer) {
    Scheduler& self = Worker::current()->scheduler();
    Fiber* fiber = self.current_;
    self.arrive(fiber, transfer.data, transfer.fctx);
    fiber->main();
    // Our stack goes back to the pool once we are off it.
    self.after_ = {
        [](void* f) { static_cast<Fiber*>(f)->worker().retire_fiber(static_cast<Fiber*>(f)); },
        fiber};
    Fiber* next = self.next_for_fiber();
    self.current_ = next;
    // nullptr fake stack: ASan may free this stack's fake frames, it never runs again.
    if (next) {
      sanitizer::start_switch(nullptr, next->stack_.base, next->stack_.size);
      sanitizer::tsan_switch(next->tsan_fiber_);
      fctx::jump_fcontext(next->context_, fiber);
    } else {
      sanitizer::start_switch(nullptr, self.thread_stack_bottom_, self.thread_stack_size_);
      sanitizer::tsan_switch(self.thread_tsan_fiber_);
      fctx::jump_fcontext(self.loop_context_, fiber);
    }
    __builtin_unreachable();
  }
};

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

void Scheduler::push_front(Fiber* fiber) {
  fiber->next_ready_ = head_;
  head_ = fiber;
  if (!tail_) tail_ = fiber;
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

void Scheduler::prepare(Fiber* fiber) {
  fiber->context_ = fctx::make_fcontext(fiber->stack_.top(), fiber->stack_.size, &FiberEntry::run);
}

Fiber* Scheduler::next_for_fiber() {
  if (budget_ == 0) return nullptr;
  Fiber* next = pop();
  if (next) --budget_;
  return next;
}

void Scheduler::run(std::size_t budget) {
  assert(current_ == nullptr);
  Fiber* first = pop();
  if (!first) return;
  if (!thread_tsan_fiber_) thread_tsan_fiber_ = sanitizer::tsan_current();
  budget_ = budget;
  switch_to(nullptr, first);
}

void Scheduler::suspend(AfterSwitch after) {
  Fiber* self = current_;
  assert(self != nullptr);
  // Disarmed before it runs: what it does (a spawn, say) does not fire it again.
  if (self->suspend_hook_) std::exchange(self->suspend_hook_, nullptr)(self->suspend_hook_arg_);
  after_ = after;
  Fiber* next = next_for_fiber();
  if (next == self) {
    // A yield with nobody else runnable: carry on (a yield has nothing to run after).
    std::exchange(after_, AfterSwitch{})();
    return;
  }
  switch_to(self, next);
}

void Scheduler::switch_to(Fiber* from, Fiber* to) {
  current_ = to;
  void** fake_stack = from ? &from->asan_fake_stack_ : &loop_fake_stack_;
  void* target;
  if (to) {
    sanitizer::start_switch(fake_stack, to->stack_.base, to->stack_.size);
    sanitizer::tsan_switch(to->tsan_fiber_);
    target = to->context_;
  } else {
    sanitizer::start_switch(fake_stack, thread_stack_bottom_, thread_stack_size_);
    sanitizer::tsan_switch(thread_tsan_fiber_);
    target = loop_context_;
  }
  fctx::transfer_t back = fctx::jump_fcontext(target, from);
  arrive(from, back.data, back.fctx);
}

void Scheduler::arrive(Fiber* self, void* from_fiber, void* from_context) {
  if (self) {
    // On a fiber stack: learn the worker stack's bounds when we came from the loop.
    const void** bottom = from_fiber ? nullptr : &thread_stack_bottom_;
    std::size_t* size = from_fiber ? nullptr : &thread_stack_size_;
    sanitizer::finish_switch(self->asan_fake_stack_, bottom, size);
  } else {
    sanitizer::finish_switch(loop_fake_stack_, nullptr, nullptr);
  }
  if (from_fiber) {
    static_cast<Fiber*>(from_fiber)->context_ = from_context;
  } else {
    loop_context_ = from_context;
  }
  if (after_.fn) std::exchange(after_, AfterSwitch{})();
}

}  // namespace spindle
