#pragma once
/// Runtime: N workers (default: one per core), started and stopped as a unit. No global state:
/// any number of runtimes can be created and destroyed in one process.

#include <cassert>
#include <cstddef>
#include <memory>
#include <vector>

#include "spindle/fiber/spawn.h"
#include "spindle/fiber/stack_pool.h"
#include "spindle/fiber/worker.h"

namespace spindle {

/// How a Runtime is built.
struct RuntimeOptions {
  /// Number of workers; 0 means one per available core.
  std::size_t workers = 0;
  /// Default usable stack size of a fiber, in bytes.
  std::size_t stack_size = StackPool::kDefaultStackSize;
  /// Stacks each worker keeps for reuse at most; by default every stack that comes back (the
  /// worker's trim gives back, once a second, those not reused since the last: StackPool).
  std::size_t stack_cache = StackPool::kKeepAll;
  /// Fiber stacks of the default size from huge-page chunks (StackPool): less CPU where many
  /// fibers wait at once, their whole size resident per stack in use, a canary instead of a
  /// guard page between them.
  bool huge_page_stacks = false;
  /// Ignore SIGPIPE process-wide on start (so a write to a closed socket is an EPIPE error, not
  /// a signal; sendfile has no MSG_NOSIGNAL).
  bool ignore_sigpipe = true;
  /// Install the SIGSEGV handler that reports fiber stack overflows by name.
  bool report_stack_overflow = true;
};

/// A set of workers.
class Runtime {
 public:
  /// Creates the workers (threads start in start()). Throws std::system_error if the kernel
  /// refuses an epoll or eventfd.
  explicit Runtime(RuntimeOptions options = {});
  /// stop() and join().
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Starts the worker threads. Idempotent.
  void start();
  /// Asks every worker to cancel its fibers and exit once they have finished. Returns at once;
  /// safe from any thread, including a fiber of this runtime. A fiber that never reaches a
  /// cancellable wait keeps its worker alive (the worker logs a warning after 5 s).
  void stop();
  /// Waits for the worker threads to exit. Must not be called from a worker thread.
  void join();
  /// Cancels every fiber alive now on every worker (each sees stop_requested() and its waits
  /// fail with operation_canceled), but keeps the workers running: what is left of a drain can
  /// be ended while the objects its fibers use still exist. Returns at once.
  void cancel_fibers();

  /// Number of workers.
  std::size_t size() const { return workers_.size(); }
  /// Worker `i` (0-based).
  Worker& worker(std::size_t i) { return *workers_.at(i); }
  /// The options in force.
  const RuntimeOptions& options() const { return options_; }

  /// Starts the runtime if needed, runs `fn` in a fiber on worker 0 and waits for it from the
  /// calling (non-worker) thread. Returns its value or rethrows its exception.
  template <typename Fn>
  std::invoke_result_t<Fn> block_on(Fn&& fn) {
    assert(Worker::current() == nullptr && "block_on from a worker thread would deadlock it");
    start();
    return spawn_on(worker(0), std::forward<Fn>(fn)).join();
  }

 private:
  /// The options in force.
  RuntimeOptions options_;
  /// The workers.
  std::vector<std::unique_ptr<Worker>> workers_;
  /// True once start() ran.
  bool started_ = false;
  /// True once join() finished.
  bool joined_ = false;
};

}  // namespace spindle
