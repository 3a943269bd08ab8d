#pragma once
// What the hooks know of each descriptor (private to src/hook): whether it is a socket, whether
// its user asked for O_NONBLOCK, whether the hooks made it non-blocking underneath, its
// SO_RCVTIMEO/SO_SNDTIMEO, and its registration with the reactor of the worker that waits on
// it. One table for the process (the descriptors are the process's); its entries live in
// blocks that are never freed, so a fiber woken by a close still reads valid memory.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "spindle/io/reactor.h"

namespace spindle {
class Worker;
}

namespace spindle::hook::detail {

/// What dup'ed descriptors share (their open file description): O_NONBLOCK as the user set it
/// and as the hooks keep it, and the socket's timeouts. Freed with the last descriptor.
struct Description {
  /// The user asked for O_NONBLOCK (so it gets EAGAIN as it expects).
  bool user_nonblock = false;
  /// The hooks set O_NONBLOCK underneath (the user still sees a blocking descriptor).
  bool made_nonblock = false;
  /// SO_RCVTIMEO and SO_SNDTIMEO (0: none).
  std::chrono::microseconds receive_timeout{0}, send_timeout{0};
  /// The descriptors that share it.
  std::atomic<int> references{1};
};

/// One descriptor's state. Fields other than the atomics are touched by the thread using the
/// descriptor (a descriptor is used by one thread at a time, as libc expects anyway).
struct FdState {
  /// 0: not looked at yet; 1: looked at (the fields below are good).
  std::atomic<int> known{0};
  /// Bumped by every close (and dup2 onto it): a wait that sees it change was for a
  /// descriptor that is gone.
  std::atomic<std::uint32_t> generation{0};
  /// A socket: the only kind the hooks make wait on a fiber.
  bool socket = false;
  /// Its open file description's state (shared with its duplicates).
  Description* file = nullptr;
  /// The worker whose reactor has it registered, and the slot there (nullptr: none).
  Worker* owner = nullptr;
  IoSlot* slot = nullptr;
};

/// The process's table.
class FdTable {
 public:
  /// The state of `fd` (nullptr for a negative or too large one), looked at first if it has
  /// not been: fstat says whether it is a socket, fcntl whether it is non-blocking already.
  FdState* get(int fd);
  /// Records a descriptor the hooks just saw made (socket, accept): no system call.
  void made(int fd, bool socket, bool user_nonblock);
  /// Copies what is known of `from` to `to` (dup: they share one open file description).
  void copied(int from, int to);
  /// Forgets `fd` before it is closed (or replaced by dup2): fibers parked on it wake with
  /// EBADF, and its reactor slot is released (on its worker's thread).
  void forget(int fd);

  /// Registers `fd` with `worker`'s reactor (the calling thread's) if it is not registered
  /// already; false if another worker has it, or epoll refuses it (a regular file). The
  /// registration ends with the descriptor's close, or with the worker's thread.
  bool register_with(int fd, FdState& state, Worker& worker);

  /// The one table.
  static FdTable& instance();

 private:
  static constexpr int kBlock = 1024;
  static constexpr int kBlocks = 1024;  // room for 1,048,576 descriptors
  /// The entry of `fd`, its block made on first use.
  FdState* entry(int fd);
  std::mutex grow_lock_;
  std::atomic<FdState*> blocks_[kBlocks] = {};
};

}  // namespace spindle::hook::detail
