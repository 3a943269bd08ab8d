#pragma once
/// Scheduler: one worker's FIFO run queue and the context switches between its fibers.
///
/// Owner-thread only. A fiber runs until it parks, yields or finishes; it then switches
/// straight to the next runnable fiber (no detour through the worker loop), or back to the
/// worker loop when the queue is empty or the round's switch budget is spent, so that timers
/// and sockets are looked at regularly.

#include <cstddef>

#include "spindle/fiber/fiber.h"

namespace spindle {

/// Run queue plus switching for one worker.
class Scheduler {
 public:
  /// Appends a runnable fiber to the queue. O(1), no allocation (intrusive link).
  void push(Fiber* fiber);
  /// Puts a runnable fiber first in the queue. O(1).
  void push_front(Fiber* fiber);
  /// Removes the first runnable fiber, or returns nullptr.
  Fiber* pop();
  /// Number of fibers in the queue.
  std::size_t ready() const { return ready_; }

  /// From the worker loop: runs queued fibers, making at most `budget` switches between
  /// fibers, and returns once control comes back to the loop.
  void run(std::size_t budget);
  /// From inside the running fiber: switches to the next runnable fiber (or the worker loop);
  /// `after` runs once this fiber is off its stack. Returns when something resumes this fiber.
  void suspend(AfterSwitch after = {});
  /// The fiber now running on this scheduler, or nullptr.
  Fiber* current() const { return current_; }

  /// Prepares a new fiber's context on its stack (no switch happens yet).
  static void prepare(Fiber* fiber);

 private:
  /// Holds the first frame of every fiber (defined with the switching code).
  friend struct FiberEntry;

  /// The next fiber to switch to from a fiber, or nullptr for the worker loop.
  Fiber* next_for_fiber();
  /// Leaves `from` (nullptr: the worker loop) for `to` (nullptr: the worker loop); returns
  /// when something switches back to `from`.
  void switch_to(Fiber* from, Fiber* to);
  /// Runs on arrival in any context: records the context we came from, runs its AfterSwitch.
  void arrive(Fiber* self, void* from_fiber, void* from_context);

  /// Head and tail of the intrusive run queue.
  Fiber* head_ = nullptr;
  Fiber* tail_ = nullptr;
  /// Length of the run queue.
  std::size_t ready_ = 0;
  /// The running fiber.
  Fiber* current_ = nullptr;
  /// Switches between fibers left before control must return to the worker loop.
  std::size_t budget_ = 0;
  /// The worker loop's saved context while fibers run.
  void* loop_context_ = nullptr;
  /// What the context that just switched out asked to run.
  AfterSwitch after_;
  /// The worker thread stack's bounds and TSan fiber, for sanitizer annotations.
  const void* thread_stack_bottom_ = nullptr;
  std::size_t thread_stack_size_ = 0;
  void* thread_tsan_fiber_ = nullptr;
  /// ASan's fake-stack handle of the worker loop while it is switched out.
  void* loop_fake_stack_ = nullptr;
};

}  // namespace spindle
