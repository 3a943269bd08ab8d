// The interposed calls that wait for several descriptors or for time, and getaddrinfo
// (include/spindle/hook/hook.h): on a fiber, poll/ppoll/select/pselect/epoll_wait/epoll_pwait
// (and the _FORTIFY_SOURCE poll/ppoll) park it until one of their descriptors is ready, the sleeps
// park it for their time, and getaddrinfo runs on a helper thread. Anywhere else each is libc's
// call.
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "real.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/sync/blocking_pool.h"
#include "wait.h"

// glibc's end of a program whose buffer check failed (not in its headers).
extern "C" [[noreturn]] void __chk_fail();

using spindle::Deadline;
using spindle::hook::detail::deadline_after;
using spindle::hook::detail::on_fiber;

namespace {

// A time libc takes: neither part negative, the nanoseconds less than a second.
bool valid(const timespec& t) {
  return t.tv_sec >= 0 && t.tv_nsec >= 0 && t.tv_nsec < 1'000'000'000;
}

// A call's arguments refused, as libc refuses them.
int refused() {
  errno = EINVAL;
  return -1;
}

// The helper threads that resolve names for fibers (getaddrinfo blocks in glibc).
spindle::BlockingPool& resolver_threads() {
  static auto* pool = new spindle::BlockingPool(4);  // never destroyed: see fd_table.h
  return *pool;
}

// Copies of select's sets (as many bits as `count`: sets may be larger than fd_set).
class FdSets {
 public:
  FdSets(int count, fd_set* readable, fd_set* writable, fd_set* failed)
      : words_((static_cast<std::size_t>(count) + 63) / 64) {
    fd_set* sets[3] = {readable, writable, failed};
    for (int i = 0; i < 3; ++i) {
      present_[i] = sets[i] != nullptr;
      bits_[i].assign(std::max<std::size_t>(words_, sizeof(fd_set) / 8), 0);
      if (present_[i]) std::memcpy(bits_[i].data(), sets[i], words_ * 8);
    }
  }
  fd_set* set(int i) { return present_[i] ? reinterpret_cast<fd_set*>(bits_[i].data()) : nullptr; }
  void write_back(fd_set* readable, fd_set* writable, fd_set* failed) {
    fd_set* sets[3] = {readable, writable, failed};
    for (int i = 0; i < 3; ++i) {
      if (present_[i]) std::memcpy(sets[i], bits_[i].data(), words_ * 8);
    }
  }

 private:
  std::size_t words_;
  bool present_[3] = {};
  std::vector<std::uint64_t> bits_[3];
};

// select(2) for a fiber, until `deadline`: what select's sets say, in poll's terms (read:
// POLLIN, and a hang-up or error; write: POLLOUT, and an error; exceptions: POLLPRI only).
// The sets are written only when it returns 0 or more: a failure leaves them as they were.
int select_on_fiber(int count, fd_set* readable, fd_set* writable, fd_set* failed,
                    Deadline deadline) {
  std::vector<pollfd> fds;
  for (int fd = 0; fd < count; ++fd) {
    short events = 0;
    if (readable != nullptr && FD_ISSET(fd, readable)) events |= POLLIN;
    if (writable != nullptr && FD_ISSET(fd, writable)) events |= POLLOUT;
    if (failed != nullptr && FD_ISSET(fd, failed)) events |= POLLPRI;
    if (events != 0) fds.push_back({fd, events, 0});
  }
  auto in = [&](const pollfd& p) {
    return readable && (p.events & POLLIN) && (p.revents & (POLLIN | POLLHUP | POLLERR));
  };
  auto out = [&](const pollfd& p) {
    return writable && (p.events & POLLOUT) && (p.revents & (POLLOUT | POLLERR));
  };
  auto pri = [&](const pollfd& p) { return failed && (p.revents & POLLPRI); };
  for (;;) {
    int n = spindle::hook::detail::poll_on_fiber(fds.data(), fds.size(), deadline);
    if (n < 0) return n;
    if (std::ranges::any_of(fds, [](const pollfd& p) { return p.revents & POLLNVAL; })) {
      errno = EBADF;
      return -1;
    }
    int ready = 0;
    for (const pollfd& p : fds) ready += in(p) + out(p) + pri(p);
    if (ready > 0 || n == 0) {
      for (fd_set* set : {readable, writable, failed}) {
        if (set != nullptr) std::memset(set, 0, (static_cast<std::size_t>(count) + 63) / 64 * 8);
      }
      for (const pollfd& p : fds) {
        if (in(p)) FD_SET(p.fd, readable);
        if (out(p)) FD_SET(p.fd, writable);
        if (pri(p)) FD_SET(p.fd, failed);
      }
      return ready;
    }
    // Only hang-ups or errors poll reports always, of descriptors select does not count them
    // for (watched for exceptions alone): they stay so, so they are watched no longer.
    std::erase_if(fds, [](const pollfd& p) { return p.revents != 0; });
  }
}

// epoll_wait(2) for a fiber: parks until the epoll descriptor is readable (it has events), then
// takes them without waiting (another thread may have taken them first: it parks again).
int epoll_on_fiber(int epoll, epoll_event* events, int most, Deadline deadline) {
  SPINDLE_REAL(epoll_wait);
  for (;;) {
    pollfd p{epoll, POLLIN, 0};
    if (spindle::hook::detail::poll_on_fiber(&p, 1, deadline) < 0) return -1;
    int n = real_epoll_wait(epoll, events, most, 0);
    if (n != 0 || deadline.expired()) return n;
  }
}

}  // namespace

extern "C" {

// ---- waiting for several --------------------------------------------------------------------

int poll(pollfd* fds, nfds_t count, int timeout_ms) {
  if (!on_fiber() || timeout_ms == 0)
    return spindle::hook::detail::real_poll(fds, count, timeout_ms);
  return spindle::hook::detail::poll_on_fiber(fds, count,
                                              spindle::hook::detail::deadline_in(timeout_ms));
}

int ppoll(pollfd* fds, nfds_t count, const timespec* timeout, const sigset_t* mask) {
  SPINDLE_REAL(ppoll);
  if (!on_fiber()) return real_ppoll(fds, count, timeout, mask);
  if (timeout != nullptr && !valid(*timeout)) return refused();
  // The signal mask is a thread's: a fiber shares its worker's, so the mask is only in force
  // for a look that does not wait (which delivers a signal pending that it unblocks, EINTR).
  if (mask != nullptr) {
    timespec now{};
    if (int n = real_ppoll(fds, count, &now, mask); n != 0) return n;
  }
  Deadline deadline =
      timeout == nullptr ? Deadline::never() : deadline_after(timeout->tv_sec, timeout->tv_nsec);
  return spindle::hook::detail::poll_on_fiber(fds, count, deadline);
}

// poll and ppoll as built with _FORTIFY_SOURCE (Debian's libraries are): the array's size is
// checked as glibc's checks it, then the call is the hooked one.
int __poll_chk(pollfd* fds, nfds_t count, int timeout_ms, size_t room) {
  if (room / sizeof(pollfd) < count) __chk_fail();
  return poll(fds, count, timeout_ms);
}

int __ppoll_chk(pollfd* fds, nfds_t count, const timespec* timeout, const sigset_t* mask,
                size_t room) {
  if (room / sizeof(pollfd) < count) __chk_fail();
  return ppoll(fds, count, timeout, mask);
}

int select(int count, fd_set* readable, fd_set* writable, fd_set* failed, timeval* timeout) {
  SPINDLE_REAL(select);
  if (!on_fiber()) return real_select(count, readable, writable, failed, timeout);
  // As Linux: microseconds past a second carry into the seconds; a negative part is refused.
  if (count < 0 || (timeout != nullptr && (timeout->tv_sec < 0 || timeout->tv_usec < 0))) {
    return refused();
  }
  Deadline deadline = timeout == nullptr
                          ? Deadline::never()
                          : deadline_after(timeout->tv_sec + timeout->tv_usec / 1'000'000,
                                           std::int64_t{timeout->tv_usec % 1'000'000} * 1000);
  int ready = select_on_fiber(count, readable, writable, failed, deadline);
  if (ready >= 0 && timeout != nullptr) {
    // As Linux: the time that was not slept.
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline.when() -
                                                                      spindle::Clock::now());
    if (ready == 0 || left.count() < 0) left = {};
    *timeout = timeval{static_cast<time_t>(left.count() / 1'000'000),
                       static_cast<suseconds_t>(left.count() % 1'000'000)};
  }
  return ready;
}

int pselect(int count, fd_set* readable, fd_set* writable, fd_set* failed, const timespec* timeout,
            const sigset_t* mask) {
  SPINDLE_REAL(pselect);
  if (!on_fiber()) return real_pselect(count, readable, writable, failed, timeout, mask);
  if (count < 0 || (timeout != nullptr && !valid(*timeout))) return refused();
  // The mask, as ppoll's: in force for a look that does not wait, made on copies of the sets
  // (a look that finds nothing leaves the caller's as they were).
  if (mask != nullptr) {
    FdSets copy(count, readable, writable, failed);
    timespec now{};
    int n = real_pselect(count, copy.set(0), copy.set(1), copy.set(2), &now, mask);
    if (n > 0) copy.write_back(readable, writable, failed);
    if (n != 0) return n;
  }
  Deadline deadline =
      timeout == nullptr ? Deadline::never() : deadline_after(timeout->tv_sec, timeout->tv_nsec);
  return select_on_fiber(count, readable, writable, failed, deadline);
}

int epoll_wait(int epoll, epoll_event* events, int most, int timeout_ms) {
  SPINDLE_REAL(epoll_wait);
  if (!on_fiber() || timeout_ms == 0 || most <= 0) {
    return real_epoll_wait(epoll, events, most, timeout_ms);
  }
  return epoll_on_fiber(epoll, events, most, spindle::hook::detail::deadline_in(timeout_ms));
}

int epoll_pwait(int epoll, epoll_event* events, int most, int timeout_ms, const sigset_t* mask) {
  SPINDLE_REAL(epoll_pwait);
  if (!on_fiber() || timeout_ms == 0 || most <= 0) {
    return real_epoll_pwait(epoll, events, most, timeout_ms, mask);
  }
  // The mask, as ppoll's: in force for a look that does not wait.
  if (mask != nullptr) {
    if (int n = real_epoll_pwait(epoll, events, most, 0, mask); n != 0) return n;
  }
  return epoll_on_fiber(epoll, events, most, spindle::hook::detail::deadline_in(timeout_ms));
}

// ---- sleeping ---------------------------------------------------------------------------------

int nanosleep(const timespec* duration, timespec* left) {
  SPINDLE_REAL(nanosleep);
  if (!on_fiber() || duration == nullptr) return real_nanosleep(duration, left);
  if (!valid(*duration)) return refused();
  Deadline until = deadline_after(duration->tv_sec, duration->tv_nsec);
  if (spindle::this_fiber::sleep_until(until)) {
    if (left != nullptr) {
      // (A sleep of centuries has no deadline: what is left is what was asked.)
      auto rest = std::chrono::duration_cast<std::chrono::nanoseconds>(until.when() -
                                                                       spindle::Clock::now());
      *left = !until.is_finite() ? *duration
                                 : timespec{static_cast<time_t>(rest.count() / 1'000'000'000),
                                            static_cast<long>(rest.count() % 1'000'000'000)};
    }
    errno = EINTR;
    return -1;
  }
  return 0;
}

int clock_nanosleep(clockid_t clock, int flags, const timespec* request, timespec* left) {
  SPINDLE_REAL(clock_nanosleep);
  // Only the clocks a sleep can be measured on here; libc's answers the others (EINVAL for a
  // CPU-time clock or one that does not exist).
  bool measured = clock == CLOCK_REALTIME || clock == CLOCK_MONOTONIC || clock == CLOCK_BOOTTIME ||
                  clock == CLOCK_TAI;
  if (!on_fiber() || request == nullptr || !measured) {
    return real_clock_nanosleep(clock, flags, request, left);
  }
  if (!valid(*request)) return EINVAL;
  timespec relative = *request;
  if ((flags & TIMER_ABSTIME) != 0) {
    timespec now{};
    ::clock_gettime(clock, &now);
    std::int64_t ns =
        (request->tv_sec - now.tv_sec) * 1'000'000'000ll + (request->tv_nsec - now.tv_nsec);
    if (ns <= 0) return 0;
    relative = {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  }
  if (nanosleep(&relative, (flags & TIMER_ABSTIME) != 0 ? nullptr : left) != 0) return errno;
  return 0;
}

int usleep(useconds_t microseconds) {
  timespec t{static_cast<time_t>(microseconds / 1'000'000),
             static_cast<long>(microseconds % 1'000'000) * 1000};
  return nanosleep(&t, nullptr);
}

unsigned int sleep(unsigned int seconds) {
  timespec t{static_cast<time_t>(seconds), 0}, left{};
  if (nanosleep(&t, &left) == 0) return 0;
  return static_cast<unsigned int>(left.tv_sec + (left.tv_nsec > 0 ? 1 : 0));
}

// ---- names ------------------------------------------------------------------------------------

int getaddrinfo(const char* node, const char* service, const addrinfo* hints, addrinfo** result) {
  SPINDLE_REAL(getaddrinfo);
  if (!on_fiber()) return real_getaddrinfo(node, service, hints, result);
  // glibc's resolver blocks in its own socket calls (which no hook sees): a helper thread
  // waits for it while the fiber is parked.
  return resolver_threads().run([&] { return real_getaddrinfo(node, service, hints, result); });
}

}  // extern "C"
