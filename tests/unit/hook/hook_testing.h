#pragma once
// What the hook tests share: socket pairs, fibers run on one worker, a watchdog that unblocks a
// test whose call held its thread, and the raw system calls no hook sees (they stand for the
// paths the hooks cannot see: glibc's insides, syscall(2), an inherited descriptor).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/io/deadline.h"

namespace spindle::hook_testing {

/// A connected pair of blocking sockets of `type` (AF_UNIX), closed when it goes.
struct Pair {
  int a = -1, b = -1;
  explicit Pair(int type = SOCK_STREAM) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, type, 0, fds), 0);
    a = fds[0];
    b = fds[1];
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
  ~Pair() {
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
  }
};

/// Runs `fibers` on `runtime` at once; the wall time until all are done.
inline std::chrono::milliseconds on_runtime(Runtime& runtime,
                                            std::vector<std::function<void()>> fibers) {
  auto started = Clock::now();
  runtime.block_on([&] {
    std::vector<JoinHandle<void>> running;
    for (auto& f : fibers) running.push_back(spawn(std::move(f)));
    for (auto& r : running) r.join();
  });
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
}

/// Runs `fibers` on one worker (of a runtime of their own) at once; the wall time taken.
inline std::chrono::milliseconds on_one_worker(std::vector<std::function<void()>> fibers) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  return on_runtime(runtime, std::move(fibers));
}

/// Calls `rescue` on a thread of its own if it is not dismissed within `patience`: a test whose
/// call held its worker's thread then ends (and fails on its timing) instead of hanging.
class Watchdog {
 public:
  Watchdog(std::chrono::milliseconds patience, std::function<void()> rescue)
      : thread_([this, patience, rescue = std::move(rescue)] {
          std::unique_lock guard(lock_);
          if (!ended_.wait_for(guard, patience, [&] { return dismissed_; })) {
            fired_ = true;
            rescue();
          }
        }) {}
  ~Watchdog() { dismiss(); }
  /// Stops it; true if it had fired.
  bool dismiss() {
    {
      std::lock_guard guard(lock_);
      dismissed_ = true;
    }
    ended_.notify_all();
    if (thread_.joinable()) thread_.join();
    return fired_;
  }

 private:
  std::mutex lock_;
  std::condition_variable ended_;
  bool dismissed_ = false;
  bool fired_ = false;
  std::thread thread_;
};

/// System calls made bare: what a path the hooks cannot see would do.
inline int raw_close(int fd) { return static_cast<int>(::syscall(SYS_close, fd)); }
inline int raw_socketpair(int type, int fds[2]) {
  return static_cast<int>(::syscall(SYS_socketpair, AF_UNIX, type, 0, fds));
}
inline int raw_dup3(int from, int to) { return static_cast<int>(::syscall(SYS_dup3, from, to, 0)); }
/// The descriptor's flags as the kernel has them (the hooked fcntl could say otherwise).
inline long raw_flags(int fd) { return ::syscall(SYS_fcntl, fd, F_GETFL); }

/// Moves descriptor `from` to the number `to` where no hook sees it (the number then holds a
/// descriptor the hooks were not told about).
inline void raw_move(int from, int to) {
  ASSERT_EQ(raw_dup3(from, to), to);
  ASSERT_EQ(raw_close(from), 0);
}

}  // namespace spindle::hook_testing
