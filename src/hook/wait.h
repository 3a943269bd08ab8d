#pragma once
// How a hooked call waits on a fiber (private to src/hook): parked until the worker's reactor
// reports the descriptor ready. On a plain thread the hooks never wait: the call is libc's.

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <optional>

#include "fd_table.h"
#include "spindle/fiber/io_wait.h"
#include "spindle/io/deadline.h"

namespace spindle::hook::detail {

/// libc's poll (the hooks' own looks at descriptors must not come back to them).
int real_poll(pollfd* fds, nfds_t count, int timeout_ms);

/// True if the caller runs on a spindle fiber (where the hooks may park).
bool on_fiber();

/// How a wait ended.
enum class WaitEnd {
  kReady,        ///< try the call again (the descriptor may be ready, or said an error)
  kTimedOut,     ///< the deadline passed
  kClosed,       ///< the descriptor was closed (or replaced) meanwhile: EBADF
  kInterrupted,  ///< the fiber was asked to stop: EINTR
};

/// The waits of one hooked call on one descriptor, on a fiber. The call is made with
/// MSG_DONTWAIT; each time it says EAGAIN, user_blocks() tells whether its program expects it
/// to wait, and wait() parks until the descriptor is ready. A fiber parked long on a
/// descriptor looks again now and then whether its registration is still for the descriptor
/// at that number (one closed and replaced where no hook saw it otherwise leaves it parked
/// for good), and retries the call.
class Waiting {
 public:
  /// Which of the socket's timeouts bounds the call: SO_RCVTIMEO or SO_SNDTIMEO.
  enum class Timeout { kReceive, kSend };

  /// For a call on `fd` whose entry had `generation` and `facts` when the call began.
  Waiting(int fd, FdState& state, std::uint32_t generation, std::uint32_t facts, Timeout timeout)
      : fd_(fd),
        state_(state),
        generation_(generation),
        facts_(facts),
        timeout_(timeout),
        started_(Clock::now()) {}

  /// True if the descriptor's program expects the call to wait: not non-blocking. Read as the
  /// call began (as libc's call does); asked of the kernel again once the descriptor at the
  /// number was made again.
  bool user_blocks();
  /// Parks until the descriptor is ready for `direction` (or a reason to try again).
  WaitEnd wait(IoDirection direction);
  /// Sleeps a little (longer each time) where no readiness says when to try again.
  WaitEnd pause();

 private:
  /// Waits without a registration of this worker: looks now and then.
  WaitEnd look_now_and_then(IoDirection direction);
  /// When the call times out: the socket's timeout from the call's start (looked up on the
  /// first wait: asked of the kernel for a shared socket, whose duplicates may have set it).
  Deadline deadline();

  int fd_;
  FdState& state_;
  std::uint32_t generation_;
  std::uint32_t facts_;
  Timeout timeout_;
  Clock::time_point started_;
  std::optional<Deadline> deadline_;
  /// How long to park before looking again at the registration (it doubles).
  std::chrono::milliseconds next_look_{250};
  /// How long to sleep between looks without a registration (it doubles).
  std::chrono::milliseconds pause_{1};
  /// The next wait first checks that the registration is still the descriptor's.
  bool look_again_ = false;
  /// The registration was made again: what was known of the descriptor was forgotten.
  bool renewed_ = false;
};

/// poll(2) for a fiber: parks until one of `fds` is ready, `deadline` passes (0) or the fiber
/// is asked to stop (-1, EINTR); the revents are poll's own.
int poll_on_fiber(pollfd* fds, nfds_t count, Deadline deadline);

/// `seconds` and `nanoseconds` (valid: neither negative) from `from` as a deadline: never for
/// a time so long (a century and more) that the clock's arithmetic would overflow.
Deadline deadline_after(std::int64_t seconds, std::int64_t nanoseconds,
                        Clock::time_point from = Clock::now());

/// A poll timeout in milliseconds (negative: none) as a deadline.
Deadline deadline_in(int timeout_ms);

}  // namespace spindle::hook::detail
