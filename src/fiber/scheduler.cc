#include "spindle/fiber/scheduler.h"

#include <boost/context/detail/fcontext.hpp>

#include <cassert>

#include "sanitizer.h"
#include "spindle/fiber/worker.h"

namespace spindle {

// Fibers switch with Boost.Context's fcontext primitives (make_fcontext / jump_fcontext), the
// assembly under boost::context::fiber. Driving them directly lets a finished fiber simply
// jump away and leave its stack to the pool: no forced unwinding, no frames that run after
// the last switch (which would also confuse ThreadSanitizer's shadow stacks).
namespace fctx = boost::context::detail;

/// The first frame of every fiber: runs its body, then leaves its stack for good.
struct FiberEntry {
  [[noreturn]] static void run(fctx::transfer_t transfer) {
    auto* fiber = static_cast<Fiber*>(transfer.data);
    fiber->caller_ = transfer.fctx;
    Scheduler& self = fiber->worker().scheduler();
    sanitizer::finish_switch(nullptr, &self.thread_stack_bottom_, &self.thread_stack_size_);
    fiber->main();
    fiber->exited_ = true;
    // The last switch: nullptr lets ASan free this stack's fake frames.
    sanitizer::start_switch(nullptr, self.thread_stack_bottom_, self.thread_stack_size_);
    sanitizer::tsan_switch(self.thread_tsan_fiber_);
    fctx::jump_fcontext(fiber->caller_, nullptr);
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
  fiber->context_ =
      fctx::make_fcontext(fiber->stack_.top(), fiber->stack_.size, &FiberEntry::run);
}

bool Scheduler::resume(Fiber* fiber) {
  assert(current_ == nullptr);
  current_ = fiber;
  if (!thread_tsan_fiber_) thread_tsan_fiber_ = sanitizer::tsan_current();
  void* fake_stack = nullptr;
  sanitizer::start_switch(&fake_stack, fiber->stack_.base, fiber->stack_.size);
  sanitizer::tsan_switch(fiber->tsan_fiber_);
  fctx::transfer_t back = fctx::jump_fcontext(fiber->context_, fiber);
  sanitizer::finish_switch(fake_stack, nullptr, nullptr);
  fiber->context_ = back.fctx;
  current_ = nullptr;
  if (after_.fn) std::exchange(after_, AfterSwitch{})();
  return fiber->exited_;
}

void Scheduler::suspend(AfterSwitch after) {
  Fiber* fiber = current_;
  assert(fiber != nullptr);
  after_ = after;
  sanitizer::start_switch(&fiber->asan_fake_stack_, thread_stack_bottom_, thread_stack_size_);
  sanitizer::tsan_switch(thread_tsan_fiber_);
  fctx::transfer_t back = fctx::jump_fcontext(fiber->caller_, nullptr);
  // Resumed: the scheduler's context may differ from the one we left (it is the same thread,
  // but a different point in its loop).
  fiber->caller_ = back.fctx;
  sanitizer::finish_switch(fiber->asan_fake_stack_, &thread_stack_bottom_, &thread_stack_size_);
}

}  // namespace spindle
