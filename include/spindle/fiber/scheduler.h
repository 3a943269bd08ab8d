#pragma once
/// Scheduler: one worker's FIFO run queue and the context switches into and out of fibers.
///
/// Owner-thread only. A fiber runs until it parks, yields or finishes; it then switches back to
/// the scheduler's context (the worker thread's own stack), which picks the next one.

#include <cstddef>

#include "spindle/fiber/fiber.h"

namespace spindle {

/// Run queue plus switching for one worker.
class Scheduler {
 public:
  /// Appends a runnable fiber to the queue. O(1), no allocation (intrusive link).
  void push(Fiber* fiber);
  /// Removes the first runnable fiber, or returns nullptr.
  Fiber* pop();
  /// Number of fibers in the queue.
  std::size_t ready() const { return ready_; }

  /// Switches into `fiber` until it parks, yields or finishes; then runs its AfterSwitch.
  /// Returns true if the fiber finished.
  bool resume(Fiber* fiber);
  /// From inside the running fiber: switches back to the scheduler, which runs `after` once off
  /// this stack. Returns when something resumes this fiber.
  void suspend(AfterSwitch after = {});
  /// The fiber now running on this scheduler, or nullptr.
  Fiber* current() const { return current_; }

  /// Prepares a new fiber's context on its stack (no switch happens yet).
  static void prepare(Fiber* fiber);

 private:
  /// Holds the first frame of every fiber (defined with the switching code).
  friend struct FiberEntry;

  /// Head and tail of the intrusive run queue.
  Fiber* head_ = nullptr;
  Fiber* tail_ = nullptr;
  /// Length of the run queue.
  std::size_t ready_ = 0;
  /// The running fiber.
  Fiber* current_ = nullptr;
  /// What the fiber that just switched out asked to run.
  AfterSwitch after_;
  /// The scheduler stack's bounds and TSan fiber, for sanitizer annotations.
  const void* thread_stack_bottom_ = nullptr;
  std::size_t thread_stack_size_ = 0;
  void* thread_tsan_fiber_ = nullptr;
};

}  // namespace spindle
