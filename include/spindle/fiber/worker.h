#pragma once
/// Worker: one OS thread with its own Scheduler, Reactor, timers and stack pool. Fibers never
/// leave the worker that started them, so nothing on the hot path takes a lock.

#include <sys/epoll.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "spindle/fiber/buffer_pool.h"
#include "spindle/fiber/fiber.h"
#include "spindle/fiber/idle_cache.h"
#include "spindle/fiber/scheduler.h"
#include "spindle/fiber/spin_lock.h"
#include "spindle/fiber/stack_pool.h"
#include "spindle/io/reactor.h"
#include "spindle/io/timer_queue.h"

namespace spindle {

class Runtime;
struct RuntimeOptions;

/// A task posted to a worker from any thread.
using Task = std::move_only_function<void()>;

/// Work a fiber leaves to its worker for when the round of runnable fibers it is part of has
/// run: the worker does it on its loop (not in a fiber; it must not block) before it looks at
/// its timers and sockets again. Writes that many fibers would each make between their own
/// work go out in a row this way, so that the kernel's work for each does not evict the
/// fibers' code and data from the caches in between. Owned by its maker, which must withdraw
/// it (Worker::withdraw) before it goes while it may still be queued.
struct RoundEndTask {
  void (*run)(RoundEndTask& task) = nullptr;
  /// True from Worker::at_round_end until it runs or is withdrawn.
  bool queued = false;
};

/// One event-loop thread of a Runtime.
class Worker {
 public:
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker();

  /// The worker whose thread is calling, or nullptr on any other thread (a thread_local; the
  /// other one is the per-thread cache of fiber objects in fiber.cc).
  static Worker* current();

  /// Position in the runtime, 0-based.
  std::size_t index() const { return index_; }
  /// The runtime that owns this worker.
  Runtime& runtime() const { return *runtime_; }

  /// Runs `task` on this worker's thread soon (outside any fiber; it must not block). Safe from
  /// any thread: an MPSC inbox plus an eventfd wake-up.
  void post(Task task);

  /// Makes `fiber` (owned by this worker) runnable, starting it if new. From the owner thread
  /// it goes straight onto the run queue; from another thread through the inbox.
  void schedule(Fiber* fiber);

  /// The scheduler (owner thread only).
  Scheduler& scheduler() { return scheduler_; }
  /// The reactor (owner thread only).
  Reactor& reactor() { return reactor_; }
  /// The timers (owner thread only).
  TimerQueue& timers() { return timers_; }

  /// Queues `task` to run once the current round of runnable fibers has run (owner thread;
  /// not already queued).
  void at_round_end(RoundEndTask& task) {
    task.queued = true;
    round_end_.push_back(&task);
  }
  /// Takes `task` off the queue if it is still there (owner thread).
  void withdraw(RoundEndTask& task);
  /// The stack pool (owner thread only).
  StackPool& stacks() { return stacks_; }
  /// The I/O buffer pool (owner thread only).
  BufferPool& buffers() { return buffers_; }
  /// Fibers started on this worker and not yet finished (owner thread only).
  std::size_t live_fibers() const { return live_count_; }
  /// Has `cache` trimmed with the worker's own pools, for as long as someone else holds it
  /// too (owner thread).
  void keep_trimmed(std::shared_ptr<IdleCache> cache);
  /// Gives back the pooled memory (stacks, buffers, fiber objects, kept_trimmed caches) not
  /// used since the last call, then free heap pages to the kernel if that was much. The loop
  /// calls it once a second while some pool holds more than its floor; returns the bytes.
  std::size_t trim_idle_memory();
  /// Tells the worker that `bytes` of heap were freed by objects of another layer (closed
  /// connections): after a burst they leave free pages inside malloc's arenas, which the next
  /// trim of a quiet worker gives back (owner thread).
  void note_released(std::size_t bytes) { released_ += bytes; }

  /// How many times the loop has polled the reactor (owner thread). A reader that drained a
  /// socket and sees the same count later knows no readiness edge was delivered in between.
  std::uint64_t polls() const { return polls_; }
  /// When the calling thread's worker last looked at its reactor: when what that look woke (a
  /// request's bytes) came in, to within one turn of the loop. One clock read a poll, shared
  /// by everything the poll woke, where a read of the clock by each request would show in its
  /// cost. The clock itself outside a worker, or before its first poll.
  static Clock::time_point last_poll_time() {
    const Worker* worker = current();
    return worker != nullptr && worker->polled_at_ != Clock::time_point{} ? worker->polled_at_
                                                                          : Clock::now();
  }
  /// A fresh fiber id (owner thread or before start).
  FiberId next_fiber_id() {
    return (FiberId{index_} << 48) | (fiber_seq_.fetch_add(1, std::memory_order_relaxed) + 1);
  }

 private:
  friend class Runtime;
  friend struct FiberEntry;

  Worker(Runtime& runtime, std::size_t index, const RuntimeOptions& options);

  /// Starts the thread.
  void start();
  /// Asks the loop to cancel every fiber and exit once none is left. Any thread.
  void request_stop();
  /// Waits for the thread to exit.
  void join();

  /// The thread's body.
  void loop();
  /// Runs posted tasks and makes remotely woken fibers runnable.
  void drain_inbox();
  /// Runs the fibers that are runnable now (not those they make runnable).
  void run_ready();
  /// Runs the tasks the round left (at_round_end), in the order they came.
  void run_round_end();
  /// Fires due timers.
  void fire_timers(Clock::time_point now);
  /// Waits for I/O (or for `timeout`) and wakes the parked fibers.
  void poll(std::chrono::milliseconds timeout);
  /// How long poll() may sleep.
  std::chrono::milliseconds poll_timeout(Clock::time_point now) const;
  /// Creates the fiber's context and queues it (owner thread).
  void start_fiber(Fiber* fiber);
  /// Unlinks a finished fiber and drops the worker's reference.
  void retire_fiber(Fiber* fiber);
  /// Cancels every live fiber (owner thread).
  void cancel_all();
  /// A fiber that could not get a stack: it finishes with the error instead of running.
  void fail_start(Fiber* fiber, std::exception_ptr error);
  /// Wakes the waiter parked in `slot` (reader or writer), if any.
  static void wake_io(Waiter*& parked);
  /// Wakes the reader parked on `slot` (there is one), reading into its buffer first if it
  /// offered one (ReadAhead).
  static void wake_reader(IoSlot& slot);
  /// True if some pool holds more than its floor (so a trim is due in a second).
  bool holds_idle_memory() const;

  /// The owning runtime.
  Runtime* runtime_;
  /// Position in the runtime.
  std::size_t index_;
  /// The OS thread.
  std::thread thread_;
  /// Run queue and switching.
  Scheduler scheduler_;
  /// epoll + eventfd.
  Reactor reactor_;
  /// Pending timers.
  TimerQueue timers_;
  /// Fiber stacks for this worker.
  StackPool stacks_;
  /// I/O buffers lent to this worker's fibers.
  BufferPool buffers_;

  /// Guards the inbox.
  SpinLock inbox_lock_;
  /// Posted tasks.
  std::vector<Task> inbox_tasks_;
  /// Remotely woken or remotely spawned fibers (intrusive list via next_ready_).
  Fiber* inbox_fibers_head_ = nullptr;
  Fiber* inbox_fibers_tail_ = nullptr;
  /// True while the inbox may be non-empty (lets the loop skip the lock when idle).
  std::atomic<bool> inbox_nonempty_{false};
  /// Scratch vector the inbox tasks are swapped into.
  std::vector<Task> running_tasks_;
  /// What the current round of fibers left for its end (at_round_end).
  std::vector<RoundEndTask*> round_end_;

  /// Head of the intrusive list of live fibers.
  Fiber* live_head_ = nullptr;
  /// Number of live fibers.
  std::size_t live_count_ = 0;
  /// Reactor polls so far, and when the last one returned.
  std::uint64_t polls_ = 0;
  Clock::time_point polled_at_{};
  /// Counter behind next_fiber_id() (atomic: a fiber may be created on another thread).
  std::atomic<FiberId> fiber_seq_{0};
  /// Set by request_stop(); the loop exits when no fiber is left.
  std::atomic<bool> stop_requested_{false};
  /// True once the loop has cancelled all fibers for the stop.
  bool stopping_ = false;
  /// When stopping began, to report fibers that ignore cancellation.
  Clock::time_point stop_started_{};
  /// True once the slow-stop warning was logged.
  bool stop_warned_ = false;
  /// Fires a second after a pool went over its floor: trim_idle_memory().
  Timer trim_timer_;
  /// Pools of other layers trimmed with ours (keep_trimmed).
  std::vector<std::shared_ptr<IdleCache>> idle_caches_;
  /// Heap freed by other layers since the last malloc_trim (note_released).
  std::size_t released_ = 0;
  /// fiber_seq_ at the last trim: how many fibers started since tells whether it is quiet.
  FiberId seq_at_trim_ = 0;
  /// Fibers that could not start since the last log of it, and when that was.
  std::size_t failed_starts_ = 0;
  Clock::time_point last_start_failure_log_{};
};

}  // namespace spindle
