#pragma once
/// BlockingPool: helper threads for work that would hold a worker's thread (a password hash
/// that takes milliseconds on purpose, a blocking library call). The asking fiber parks until
/// the work is done; its worker serves other fibers meanwhile.

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "spindle/sync/event.h"

namespace spindle {

class BlockingPool {
 public:
  /// Starts `threads` helper threads (at least 1).
  explicit BlockingPool(std::size_t threads = 1);
  /// Finishes the work queued, then stops the threads.
  ~BlockingPool();
  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  /// Runs `fn` on a helper thread and returns its value; from a fiber it parks (not
  /// cancellably: the work, once queued, runs to its end), from a plain thread it blocks.
  template <typename Fn>
  auto run(Fn fn) -> decltype(fn()) {
    struct Job {
      Event done;
      std::optional<decltype(fn())> value;
    };
    auto job = std::make_shared<Job>();
    submit([job, fn = std::move(fn)]() mutable {
      job->value.emplace(fn());
      job->done.set();
    });
    // Not cancellable: the work runs to its end whatever happens to the fiber.
    (void)job->done.wait(Deadline::never(), kNotCancellable);
    return std::move(*job->value);
  }

 private:
  void submit(std::function<void()> task);
  void loop();

  std::mutex lock_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace spindle
