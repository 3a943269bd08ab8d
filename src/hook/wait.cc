#include "wait.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/waiter.h"
#include "spindle/fiber/worker.h"

namespace spindle::hook::detail {
namespace {

using std::chrono::milliseconds;

// The longest a parked fiber goes without looking again at its registration, and the longest
// pause between looks at a descriptor it cannot park on.
constexpr milliseconds kLongestLook{8000};
constexpr milliseconds kLongestPause{16};
// A timeout of this many seconds or more is none (its microseconds would overflow).
constexpr std::int64_t kNoTimeoutSeconds = 100ll * 366 * 24 * 3600;

short events_of(IoDirection direction) {
  return direction == IoDirection::kRead ? POLLIN : POLLOUT;
}

Deadline earlier(Deadline deadline, milliseconds from_now) {
  Deadline other = Deadline::after(from_now);
  return deadline.when() < other.when() ? deadline : other;
}

// Parks on `slot` (the registration of `state` on this worker) for `direction`. After the
// wake the slot is touched only if the entry still names it: one let go meanwhile may be
// another descriptor's by now, or gone with its block of the reactor's table.
std::error_code park_on(IoSlot& slot, FdState& state, IoDirection direction, Deadline until) {
  if (direction == IoDirection::kWrite) {
    if (auto ec = Worker::current()->reactor().watch_writable(slot)) return ec;
  }
  Waiter waiter;
  Waiter** parked = direction == IoDirection::kRead ? &slot.reader : &slot.writer;
  *parked = &waiter;
  auto ec = park(waiter, until, kCancellable);
  if (state.slot.load(std::memory_order_relaxed) == &slot && *parked == &waiter) {
    *parked = nullptr;
  }
  return ec;
}

// Why a parked fiber was woken by a cancellation: asked to stop, or its slot let go (the
// descriptor closed, its registration made again).
bool asked_to_stop() { return this_fiber::stop_requested(); }

}  // namespace

int real_poll(pollfd* fds, nfds_t count, int timeout_ms) {
  static const auto poll =
      reinterpret_cast<int (*)(pollfd*, nfds_t, int)>(::dlsym(RTLD_NEXT, "poll"));
  return poll(fds, count, timeout_ms);
}

bool on_fiber() { return current_fiber() != nullptr && !in_forked_child(); }

Deadline deadline_after(std::int64_t seconds, std::int64_t nanoseconds, Clock::time_point from) {
  constexpr std::int64_t kCentury = 100ll * 366 * 24 * 3600;
  if (seconds >= kCentury) return Deadline::never();
  return Deadline::at(from + std::chrono::seconds(seconds) + std::chrono::nanoseconds(nanoseconds));
}

Deadline deadline_in(int timeout_ms) {
  return timeout_ms < 0 ? Deadline::never() : Deadline::after(milliseconds(timeout_ms));
}

Deadline Waiting::deadline() {
  if (deadline_) return *deadline_;
  bool receive = timeout_ == Timeout::kReceive;
  std::int64_t us = (receive ? state_.receive_timeout_us : state_.send_timeout_us).load();
  if ((state_.facts.load(std::memory_order_relaxed) & kShared) != 0) {
    timeval t{};
    socklen_t size = sizeof t;
    // (A negative timeout, "do not wait", reads back as none: the noted one is kept.)
    if (::getsockopt(fd_, SOL_SOCKET, receive ? SO_RCVTIMEO : SO_SNDTIMEO, &t, &size) == 0 &&
        (us >= 0 || t.tv_sec != 0 || t.tv_usec != 0)) {
      us = t.tv_sec >= kNoTimeoutSeconds ? 0 : std::int64_t{t.tv_sec} * 1'000'000 + t.tv_usec;
    }
  }
  if (us < 0) {
    deadline_ = Deadline::at(started_);  // Linux: a negative timeout is "do not wait"
  } else {
    deadline_ = us > 0 ? deadline_after(us / 1'000'000, us % 1'000'000 * 1000, started_)
                       : Deadline::never();
  }
  return *deadline_;
}

bool Waiting::user_blocks() {
  // The flags were read as the call began (cooperative()); only a descriptor made again at the
  // number since is asked again.
  if (!renewed_) return true;
  long flags = ::syscall(SYS_fcntl, fd_, F_GETFL);
  return flags < 0 || (flags & O_NONBLOCK) == 0;  // (a bad descriptor: the next try says so)
}

WaitEnd Waiting::wait(IoDirection direction) {
  Worker& worker = *Worker::current();
  if (state_.generation.load(std::memory_order_acquire) != generation_) return WaitEnd::kClosed;
  if (deadline().expired()) return WaitEnd::kTimedOut;
  Registration r = FdTable::instance().slot_for(fd_, state_, generation_, worker, look_again_);
  look_again_ = false;
  if (r.renewed) {
    renewed_ = true;
    return WaitEnd::kReady;  // the call tries again, on the descriptor now at the number
  }
  if (r.slot == nullptr || (direction == IoDirection::kRead ? r.slot->reader : r.slot->writer)) {
    return look_now_and_then(direction);
  }
  if (state_.generation.load(std::memory_order_acquire) != generation_) return WaitEnd::kClosed;
  std::error_code ec = park_on(*r.slot, state_, direction, earlier(deadline(), next_look_));
  if (state_.generation.load(std::memory_order_acquire) != generation_) return WaitEnd::kClosed;
  if (ec == std::errc::operation_canceled && asked_to_stop()) return WaitEnd::kInterrupted;
  if (ec == std::errc::timed_out) {
    if (deadline().expired()) return WaitEnd::kTimedOut;
    next_look_ = std::min(next_look_ * 2, kLongestLook);
    look_again_ = true;
  } else if (ec && ec != std::errc::operation_canceled) {
    look_again_ = true;  // epoll refused the registration: it is not the descriptor's
  }
  return WaitEnd::kReady;
}

WaitEnd Waiting::look_now_and_then(IoDirection direction) {
  // Another worker has the descriptor registered (or another fiber waits on it here, or epoll
  // will not have it): poll it without waiting, then sleep a little.
  pollfd p{fd_, events_of(direction), 0};
  if (real_poll(&p, 1, 0) != 0) return WaitEnd::kReady;
  return pause();
}

WaitEnd Waiting::pause() {
  auto left = deadline().is_finite()
                  ? std::chrono::ceil<milliseconds>(deadline().when() - Clock::now())
                  : kLongestPause;
  auto pause = std::clamp(left, milliseconds(0), pause_);
  pause_ = std::min(pause_ * 2, kLongestPause);
  if (this_fiber::sleep_for(pause) && asked_to_stop()) return WaitEnd::kInterrupted;
  if (state_.generation.load(std::memory_order_acquire) != generation_) return WaitEnd::kClosed;
  if (deadline().expired()) return WaitEnd::kTimedOut;
  return WaitEnd::kReady;
}

namespace {

// True if a poll for `events` waits as a reader does: what wakes a reader (data, urgent data,
// the peer's shutdown, a hang-up or error, which poll reports whatever was asked) is what it
// waits for. Only a poll for POLLOUT alone is the writer's.
bool waits_as_reader(short events) {
  return (events & (POLLIN | POLLPRI | POLLRDHUP)) != 0 || (events & POLLOUT) == 0;
}

// The registrations on this worker of the descriptors of `fds`, in `slots` (their entries in
// `states`): true if the fiber can park on them all (each registered here, none with another
// fiber waiting on it for the same).
bool find_slots(pollfd* fds, nfds_t count, std::vector<FdState*>& states,
                std::vector<IoSlot*>& slots, bool look_again) {
  Worker& worker = *Worker::current();
  FdTable& table = FdTable::instance();
  bool parkable = true;
  for (nfds_t i = 0; i < count; ++i) {
    slots[i] = nullptr;
    if (fds[i].fd < 0) continue;
    states[i] = table.entry(fds[i].fd);
    if (states[i] == nullptr) {
      parkable = false;
      continue;
    }
    auto generation = states[i]->generation.load(std::memory_order_acquire);
    IoSlot* slot = table.slot_for(fds[i].fd, *states[i], generation, worker, look_again).slot;
    slots[i] = slot;
    bool reads = waits_as_reader(fds[i].events);
    bool writes = (fds[i].events & POLLOUT) != 0;
    if (slot == nullptr || (reads && slot->reader) || (writes && slot->writer)) parkable = false;
    if (slot != nullptr && writes && worker.reactor().watch_writable(*slot)) parkable = false;
  }
  return parkable;
}

// Parks on every slot of `slots` at once (one waiter published on each): the first readiness
// wakes the fiber, or `until`.
std::error_code park_on_all(pollfd* fds, nfds_t count, const std::vector<FdState*>& states,
                            const std::vector<IoSlot*>& slots, Deadline until) {
  Waiter waiter;
  for (nfds_t i = 0; i < count; ++i) {
    if (slots[i] == nullptr) continue;
    if (waits_as_reader(fds[i].events)) slots[i]->reader = &waiter;
    if ((fds[i].events & POLLOUT) != 0) slots[i]->writer = &waiter;
  }
  std::error_code ec = park(waiter, until, kCancellable);
  for (nfds_t i = 0; i < count; ++i) {
    // (A slot let go meanwhile is not touched: see park_on.)
    IoSlot* slot = slots[i];
    if (slot == nullptr || states[i]->slot.load(std::memory_order_relaxed) != slot) continue;
    if (slot->reader == &waiter) slot->reader = nullptr;
    if (slot->writer == &waiter) slot->writer = nullptr;
  }
  return ec;
}

}  // namespace

int poll_on_fiber(pollfd* fds, nfds_t count, Deadline deadline) {
  std::vector<IoSlot*> slots(count, nullptr);
  std::vector<FdState*> states(count, nullptr);
  milliseconds next_look{250}, pause{1};
  bool look_again = false;
  for (;;) {
    int n = real_poll(fds, count, 0);
    if (n != 0) return n;
    if (deadline.expired()) return 0;
    bool parkable = find_slots(fds, count, states, slots, look_again);
    look_again = false;
    std::error_code ec;
    if (!parkable) {
      // Looked at now and then, a little longer each time.
      auto left = std::chrono::ceil<milliseconds>(deadline.when() - Clock::now());
      ec = this_fiber::sleep_for(deadline.is_finite() ? std::clamp(left, milliseconds(0), pause)
                                                      : pause);
      pause = std::min(pause * 2, kLongestPause);
    } else {
      ec = park_on_all(fds, count, states, slots, earlier(deadline, next_look));
      if (ec == std::errc::timed_out && !deadline.expired()) {
        next_look = std::min(next_look * 2, kLongestLook);
        look_again = true;  // (the registrations may no longer be the descriptors')
      }
    }
    if (ec == std::errc::operation_canceled && asked_to_stop()) {
      errno = EINTR;
      return -1;
    }
  }
}

}  // namespace spindle::hook::detail
