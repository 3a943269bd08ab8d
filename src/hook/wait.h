#pragma once
// How a hooked call waits (private to src/hook): on a fiber, parked until the worker's reactor
// reports the descriptor ready; on a plain thread, in poll(2).

#include <poll.h>

#include "fd_table.h"
#include "spindle/fiber/io_wait.h"
#include "spindle/io/deadline.h"

namespace spindle::hook::detail {

/// libc's own functions, found past the program's definitions (dlsym RTLD_NEXT).
struct Real {
  int (*poll)(pollfd*, nfds_t, int);
  int (*close)(int);
  static const Real& get();
};

/// How a wait ended.
enum class WaitEnd {
  kReady,        ///< the descriptor is ready (or reported an error: the call will say which)
  kTimedOut,     ///< the deadline passed
  kClosed,       ///< the descriptor was closed meanwhile (EBADF)
  kInterrupted,  ///< the fiber was asked to stop (EINTR)
};

/// True if the caller runs on a spindle fiber (where the hooks may park).
bool on_fiber();

/// Waits until `fd` is ready for `direction`: a fiber parks (registering the descriptor with
/// its worker's reactor on first use), a thread polls.
WaitEnd wait_fd(int fd, FdState& state, IoDirection direction, Deadline deadline);

/// poll(2) for a fiber: parks until one of `fds` is ready, `deadline` passes (0) or the fiber
/// is asked to stop (-1, EINTR); the revents are poll's own.
int poll_on_fiber(pollfd* fds, nfds_t count, Deadline deadline);

/// A poll timeout in milliseconds (negative: none) as a deadline.
Deadline deadline_in(int timeout_ms);

}  // namespace spindle::hook::detail
