#include "wait.h"

#include <dlfcn.h>

#include <cerrno>
#include <vector>

#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/waiter.h"
#include "spindle/fiber/worker.h"

namespace spindle::hook::detail {
namespace {

template <typename Fn>
Fn* next_definition(const char* name) {
  return reinterpret_cast<Fn*>(::dlsym(RTLD_NEXT, name));
}

bool registered_here(int fd, FdState& state, Worker& worker) {
  return FdTable::instance().register_with(fd, state, worker);
}

// How long a fiber that cannot park on a descriptor (another worker has it registered) sleeps
// between two looks at it.
constexpr auto kLookAgain = std::chrono::milliseconds(1);

int milliseconds_left(Deadline deadline) {
  if (!deadline.is_finite()) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline.when() - Clock::now());
  return static_cast<int>(std::max<std::int64_t>(left.count(), 0));
}

}  // namespace

const Real& Real::get() {
  static const Real real{next_definition<int(pollfd*, nfds_t, int)>("poll"),
                         next_definition<int(int)>("close")};
  return real;
}

bool on_fiber() { return current_fiber() != nullptr; }

Deadline deadline_in(int timeout_ms) {
  return timeout_ms < 0 ? Deadline::never()
                        : Deadline::after(std::chrono::milliseconds(timeout_ms));
}

WaitEnd wait_fd(int fd, FdState& state, IoDirection direction, Deadline deadline) {
  short events = direction == IoDirection::kRead ? POLLIN : POLLOUT;
  if (!on_fiber()) {
    pollfd p{fd, events, 0};
    int n = Real::get().poll(&p, 1, milliseconds_left(deadline));
    if (n < 0) return errno == EINTR ? WaitEnd::kInterrupted : WaitEnd::kReady;
    return n == 0 ? WaitEnd::kTimedOut : WaitEnd::kReady;
  }
  std::uint32_t generation = state.generation.load(std::memory_order_acquire);
  Worker& worker = *Worker::current();
  if (!registered_here(fd, state, worker)) {
    // Another worker waits on it: look now and then, without parking on its reactor.
    for (;;) {
      pollfd p{fd, events, 0};
      if (Real::get().poll(&p, 1, 0) != 0) return WaitEnd::kReady;
      if (deadline.expired()) return WaitEnd::kTimedOut;
      if (this_fiber::sleep_for(kLookAgain)) return WaitEnd::kInterrupted;
      if (state.generation.load(std::memory_order_acquire) != generation) return WaitEnd::kClosed;
    }
  }
  std::error_code ec = wait_ready(*state.slot, direction, deadline);
  if (state.generation.load(std::memory_order_acquire) != generation) return WaitEnd::kClosed;
  if (!ec) return WaitEnd::kReady;
  return ec == std::errc::timed_out ? WaitEnd::kTimedOut : WaitEnd::kInterrupted;
}

int poll_on_fiber(pollfd* fds, nfds_t count, Deadline deadline) {
  const Real& real = Real::get();
  Worker& worker = *Worker::current();
  FdTable& table = FdTable::instance();
  // The descriptors that can be waited on here; with any other, poll is looked at now and then.
  std::vector<FdState*> states(count, nullptr);
  bool parkable = true;
  for (nfds_t i = 0; i < count; ++i) {
    if (fds[i].fd < 0) continue;
    FdState* s = table.get(fds[i].fd);
    if (s == nullptr || !registered_here(fds[i].fd, *s, worker)) {
      parkable = false;
      continue;
    }
    states[i] = s;
  }
  for (;;) {
    int n = real.poll(fds, count, 0);
    if (n != 0) return n;
    if (deadline.expired()) return 0;
    if (!parkable) {
      if (this_fiber::sleep_for(kLookAgain)) {
        errno = EINTR;
        return -1;
      }
      continue;
    }
    // One waiter published on every slot wanted: the first readiness claims it.
    Waiter waiter;
    bool taken = false;
    for (nfds_t i = 0; i < count && !taken; ++i) {
      if (states[i] == nullptr) continue;
      IoSlot& slot = *states[i]->slot;
      if ((fds[i].events & POLLOUT) != 0) {
        if (slot.writer != nullptr || worker.reactor().watch_writable(slot)) taken = true;
        if (!taken) slot.writer = &waiter;
      }
      if ((fds[i].events & (POLLIN | POLLPRI)) != 0 && !taken) {
        if (slot.reader != nullptr) taken = true;
        if (!taken) slot.reader = &waiter;
      }
    }
    std::error_code ec;
    if (taken) {
      ec = this_fiber::sleep_for(kLookAgain);  // another fiber waits on one of them: look again
    } else {
      ec = park(waiter, deadline, kCancellable);
    }
    for (nfds_t i = 0; i < count; ++i) {
      if (states[i] == nullptr || states[i]->slot == nullptr) continue;
      if (states[i]->slot->reader == &waiter) states[i]->slot->reader = nullptr;
      if (states[i]->slot->writer == &waiter) states[i]->slot->writer = nullptr;
    }
    if (ec == std::errc::operation_canceled) {
      // Asked to stop, or a descriptor closed under us: poll says which on the next look.
      bool closed = false;
      for (nfds_t i = 0; i < count; ++i) closed = closed || (states[i] && !states[i]->slot);
      if (!closed) {
        errno = EINTR;
        return -1;
      }
      return real.poll(fds, count, 0);  // POLLNVAL for the closed one
    }
  }
}

}  // namespace spindle::hook::detail
