// The interposed calls that wait for several descriptors or for time, and getaddrinfo
// (include/spindle/hook/hook.h): on a fiber, poll/ppoll/select park it until one of their
// descriptors is ready, the sleeps park it for their time, and getaddrinfo runs on a helper
// thread. Anywhere else each is libc's call.
#include <netdb.h>
#include <poll.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "real.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/sync/blocking_pool.h"
#include "wait.h"

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
  // The signal mask is a thread's: a fiber shares its worker's, so it is not changed here.
  if (!on_fiber() || mask != nullptr) return real_ppoll(fds, count, timeout, mask);
  if (timeout != nullptr && !valid(*timeout)) return refused();
  Deadline deadline =
      timeout == nullptr ? Deadline::never() : deadline_after(timeout->tv_sec, timeout->tv_nsec);
  return spindle::hook::detail::poll_on_fiber(fds, count, deadline);
}

int select(int count, fd_set* readable, fd_set* writable, fd_set* failed, timeval* timeout) {
  SPINDLE_REAL(select);
  if (!on_fiber()) return real_select(count, readable, writable, failed, timeout);
  // As Linux: microseconds past a second carry into the seconds; a negative part is refused.
  if (count < 0 || (timeout != nullptr && (timeout->tv_sec < 0 || timeout->tv_usec < 0))) {
    return refused();
  }
  std::vector<pollfd> fds;
  for (int fd = 0; fd < count; ++fd) {
    short events = 0;
    if (readable != nullptr && FD_ISSET(fd, readable)) events |= POLLIN;
    if (writable != nullptr && FD_ISSET(fd, writable)) events |= POLLOUT;
    if (failed != nullptr && FD_ISSET(fd, failed)) events |= POLLPRI;
    if (events != 0) fds.push_back({fd, events, 0});
  }
  Deadline deadline = timeout == nullptr
                          ? Deadline::never()
                          : deadline_after(timeout->tv_sec + timeout->tv_usec / 1'000'000,
                                           std::int64_t{timeout->tv_usec % 1'000'000} * 1000);
  int n = spindle::hook::detail::poll_on_fiber(fds.data(), fds.size(), deadline);
  if (n < 0) return n;
  for (fd_set* set : {readable, writable, failed}) {
    if (set != nullptr) FD_ZERO(set);
  }
  int ready = 0;
  for (const pollfd& p : fds) {
    if (p.revents & POLLNVAL) {
      errno = EBADF;
      return -1;
    }
    bool in = readable && (p.revents & (POLLIN | POLLHUP | POLLERR)) && (p.events & POLLIN);
    bool out = writable && (p.revents & (POLLOUT | POLLERR)) && (p.events & POLLOUT);
    bool pri = failed && (p.revents & POLLPRI);
    if (in) FD_SET(p.fd, readable);
    if (out) FD_SET(p.fd, writable);
    if (pri) FD_SET(p.fd, failed);
    ready += in + out + pri;
  }
  if (timeout != nullptr) {
    // As Linux: the time that was not slept.
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline.when() -
                                                                      spindle::Clock::now());
    if (ready == 0 || left.count() < 0) left = {};
    *timeout = timeval{static_cast<time_t>(left.count() / 1'000'000),
                       static_cast<suseconds_t>(left.count() % 1'000'000)};
  }
  return ready;
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
