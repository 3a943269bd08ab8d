#pragma once
/// Fiber: one cooperatively scheduled thread of execution with its own stack, bound for life to
/// the Worker that started it.
///
/// Users hold fibers through JoinHandle (spawn.h) and act on the current one through
/// this_fiber (this_fiber.h); this header is the machinery both are built on.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "spindle/fiber/spin_lock.h"
#include "spindle/fiber/stack_pool.h"
#include "spindle/io/deadline.h"

namespace spindle {

class Worker;
class Waiter;

/// A fiber's id: unique within its Runtime. The high 16 bits are the worker index.
using FiberId = std::uint64_t;

/// Options for one spawn.
struct SpawnOptions {
  /// Usable stack bytes; 0 means the worker's default (RuntimeOptions::stack_size).
  std::size_t stack_size = 0;
  /// Spawned on its worker's own thread, it runs before the fibers runnable already (at the
  /// next switch), not after them: for a fiber that stands in for the spawner should it park,
  /// so that what they do together stays together in the worker's round.
  bool run_next = false;
};

/// A function run after the running fiber has switched off its stack: used to release a lock
/// that protects the wait list the fiber just joined, so nobody can wake it before it sleeps.
struct AfterSwitch {
  /// What to run; nullptr for nothing.
  void (*fn)(void*) = nullptr;
  /// Its argument.
  void* arg = nullptr;

  /// An AfterSwitch that unlocks `lock`.
  static AfterSwitch unlock(SpinLock& lock) {
    return {[](void* l) { static_cast<SpinLock*>(l)->unlock(); }, &lock};
  }
  void operator()() const {
    if (fn) fn(arg);
  }
};

namespace detail {
/// Arms `hook(arg)` to run on the calling fiber just before it next gives up its worker (a
/// park or a yield; not its end), once; `hook` nullptr disarms. No effect outside fibers.
/// The HTTP server's runners use it to start a second fiber only when the first waits. Not
/// for handlers: there is one hook per fiber, and a handler's would replace its runner's.
/// The hook must not park, and it runs while the fiber may still hold the lock of what it
/// parks on (released after the switch): keep it to bookkeeping and spawning.
void on_next_suspend(void (*hook)(void*), void* arg);
}  // namespace detail

/// The state of one fiber. Reference-counted: its worker holds a reference while it runs, and
/// each JoinHandle holds one.
class Fiber {
 public:
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  virtual ~Fiber();

  /// Fiber objects come from the thread's block cache (base/block_cache.h): a server spawns one
  /// per request, and more are alive at once than malloc's per-thread cache keeps.
  static void* operator new(std::size_t size);
  static void operator delete(void* p, std::size_t size);

  /// The id, unique within the runtime.
  FiberId id() const { return id_; }
  /// The worker this fiber runs on, for its whole life.
  Worker& worker() const { return *worker_; }
  /// Asks the fiber to stop: sets the flag and wakes it if it is parked in a cancellable wait,
  /// which then returns std::errc::operation_canceled. Safe from any thread.
  void request_stop();
  /// True once request_stop() was called.
  bool stop_requested() const { return stop_.load(std::memory_order_acquire); }
  /// True once the body has returned or thrown.
  bool finished() const;

  /// Blocks the calling fiber (or thread) until this fiber has finished. Not cancellable.
  void wait_finished();
  /// Marks the fiber as detached: an exception escaping it will be logged, as nobody joins.
  void detach();

  /// Adds a reference.
  void add_ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  /// Drops a reference; the last one deletes the fiber.
  void release() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  /// The usable stack (valid while the fiber runs).
  const Stack& stack() const { return stack_; }

 protected:
  /// A fiber that will run on `worker`. The creator owns the initial reference.
  Fiber(Worker& worker, SpawnOptions options);

  /// Runs the body and keeps its result or exception. Must not throw.
  virtual void run_body() = 0;
  /// The exception that escaped the body, if any.
  std::exception_ptr error_;

 private:
  friend class Worker;
  friend class Scheduler;
  friend struct FiberEntry;
  friend class FiberLocalStorage;
  friend void detail::on_next_suspend(void (*hook)(void*), void* arg);
  friend std::error_code park(Waiter& waiter, Deadline deadline, bool cancellable,
                              AfterSwitch after);

  /// The fiber's first frame: body, then join bookkeeping.
  void main();
  /// Wakes the joiner and logs an unobserved exception of a detached fiber.
  void finish();
  /// Logs the exception that ended this detached fiber (nobody joins it to see it).
  void log_unobserved_error() const;
  /// On the owner thread: if parked in a cancellable wait, wakes it as cancelled.
  void cancel_wait();

  /// References; the fiber is deleted when it reaches zero.
  std::atomic<int> refs_{1};
  /// Set by request_stop().
  std::atomic<bool> stop_{false};
  /// The owning worker.
  Worker* worker_;
  /// Unique id.
  FiberId id_;
  /// Requested stack size (0: worker default).
  std::size_t stack_size_;
  /// SpawnOptions::run_next.
  bool run_next_ = false;
  /// The stack, once started.
  Stack stack_;
  /// The fiber's saved context (a Boost.Context fcontext_t) while it is suspended.
  void* context_ = nullptr;
  /// True once the worker created the context.
  bool started_ = false;
  /// Link in the scheduler's run queue or the worker's remote inbox.
  Fiber* next_ready_ = nullptr;
  /// Links in the worker's list of live fibers.
  Fiber* prev_live_ = nullptr;
  Fiber* next_live_ = nullptr;
  /// The waiter this fiber is parked on if the wait is cancellable (owner thread only).
  Waiter* cancellable_wait_ = nullptr;
  /// detail::on_next_suspend's hook and its argument (owner thread only).
  void (*suspend_hook_)(void*) = nullptr;
  void* suspend_hook_arg_ = nullptr;

  /// Guards done_, detached_ and joiner_.
  mutable SpinLock join_lock_;
  /// True once finished.
  bool done_ = false;
  /// True once detached.
  bool detached_ = false;
  /// Whoever waits in wait_finished(), or nullptr.
  Waiter* joiner_ = nullptr;

  /// Fiber-local values: (key, value, destructor). Empty (no allocation) unless used.
  struct Local {
    const void* key;
    void* value;
    void (*destroy)(void*);
  };
  std::vector<Local> locals_;

  /// Sanitizer bookkeeping (unused in normal builds).
  void* asan_fake_stack_ = nullptr;
  void* tsan_fiber_ = nullptr;
};

namespace detail {

/// A fiber whose body returns T.
template <typename T>
class ResultFiber : public Fiber {
 public:
  using Fiber::Fiber;

  /// Returns the body's value or rethrows its exception. Call once, after it finished.
  T take_result() {
    if (error_) std::rethrow_exception(error_);
    if constexpr (!std::is_void_v<T>) return std::move(*value_);
  }

 protected:
  /// The body's value, once it returned.
  std::conditional_t<std::is_void_v<T>, char, std::optional<T>> value_{};
};

/// A fiber running a callable `Fn` that returns T.
template <typename T, typename Fn>
class FiberImpl final : public ResultFiber<T> {
 public:
  FiberImpl(Worker& worker, SpawnOptions options, Fn fn)
      : ResultFiber<T>(worker, options), fn_(std::move(fn)) {}

 private:
  void run_body() override {
    try {
      if constexpr (std::is_void_v<T>) {
        (*fn_)();
      } else {
        this->value_.emplace((*fn_)());
      }
    } catch (...) {
      this->error_ = std::current_exception();
    }
    // Captures die on the fiber, so their destructors may still park.
    fn_.reset();
  }

  /// The body; reset once it ran.
  std::optional<Fn> fn_;
};

}  // namespace detail
}  // namespace spindle
