// The interposed libc functions (include/spindle/hook/hook.h). Each finds libc's own by
// dlsym(RTLD_NEXT) once, and goes to it unless the call is one the hooks make cooperative: a
// blocking call on a socket its user has not made non-blocking, made on a spindle fiber (or on a
// thread, for a socket the hooks already made non-blocking underneath).
#include "spindle/hook/hook.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "fd_table.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/sync/blocking_pool.h"
#include "wait.h"

using spindle::Deadline;
using spindle::IoDirection;
using spindle::hook::detail::FdState;
using spindle::hook::detail::FdTable;
using spindle::hook::detail::on_fiber;
using spindle::hook::detail::WaitEnd;

// What the hook library's CMake target makes the linker pull in: this object, and with it every
// definition below (a static library's objects are linked only when something needs them).
extern "C" const int spindle_hook_linked = 1;

bool spindle::hook::linked() { return spindle_hook_linked == 1; }

namespace {

// libc's definition of `name`, of the type of ours.
#define REAL(name) \
  static const auto real_##name = reinterpret_cast<decltype(&::name)>(::dlsym(RTLD_NEXT, #name))

// The descriptor's state if a call on it may wait cooperatively: a socket whose user has not
// made it non-blocking, called on a fiber (which then makes it non-blocking underneath), or on a
// thread once the hooks did so. nullptr: the call is libc's as it is.
FdState* cooperative(int fd) {
  FdState* s = FdTable::instance().get(fd);
  if (s == nullptr || !s->socket || s->file->user_nonblock) return nullptr;
  if (!s->file->made_nonblock) {
    if (!on_fiber()) return nullptr;
    REAL(fcntl);
    int flags = real_fcntl(fd, F_GETFL);
    if (flags < 0 || real_fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return nullptr;
    s->file->made_nonblock = true;
  }
  return s;
}

Deadline deadline_of(std::chrono::microseconds timeout) {
  return timeout.count() > 0 ? Deadline::after(timeout) : Deadline::never();
}

// Runs `call` until it does not say EAGAIN, waiting for `direction` in between, as a blocking
// call would (SO_RCVTIMEO / SO_SNDTIMEO give EAGAIN when they pass, as Linux does).
template <typename Call>
auto cooperative_io(int fd, IoDirection direction, Call call) -> decltype(call()) {
  FdState* s = cooperative(fd);
  if (s == nullptr) return call();
  Deadline deadline = deadline_of(direction == IoDirection::kRead ? s->file->receive_timeout
                                                                  : s->file->send_timeout);
  for (;;) {
    auto n = call();
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return n;
    switch (wait_fd(fd, *s, direction, deadline)) {
      case WaitEnd::kReady:
        continue;
      case WaitEnd::kTimedOut:
        errno = EAGAIN;
        return -1;
      case WaitEnd::kClosed:
        errno = EBADF;
        return -1;
      case WaitEnd::kInterrupted:
        errno = EINTR;
        return -1;
    }
  }
}

// The helper threads that resolve names for fibers (getaddrinfo blocks in glibc).
spindle::BlockingPool& resolver_threads() {
  static auto* pool = new spindle::BlockingPool(4);  // never destroyed: see fd_table.h
  return *pool;
}

}  // namespace

extern "C" {

// ---- descriptors made and closed -----------------------------------------------------------

int socket(int domain, int type, int protocol) {
  REAL(socket);
  int fd = real_socket(domain, type, protocol);
  if (fd >= 0) FdTable::instance().made(fd, true, (type & SOCK_NONBLOCK) != 0);
  return fd;
}

int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  REAL(accept4);
  int got = cooperative_io(fd, IoDirection::kRead,
                           [&] { return real_accept4(fd, address, length, flags); });
  if (got >= 0) FdTable::instance().made(got, true, (flags & SOCK_NONBLOCK) != 0);
  return got;
}

int accept(int fd, sockaddr* address, socklen_t* length) { return accept4(fd, address, length, 0); }

int connect(int fd, const sockaddr* address, socklen_t length) {
  REAL(connect);
  FdState* s = cooperative(fd);
  if (s == nullptr) return real_connect(fd, address, length);
  if (real_connect(fd, address, length) == 0) return 0;
  if (errno != EINPROGRESS) return -1;
  switch (wait_fd(fd, *s, IoDirection::kWrite, deadline_of(s->file->send_timeout))) {
    case WaitEnd::kReady:
      break;
    case WaitEnd::kTimedOut:
      errno = ETIMEDOUT;
      return -1;
    case WaitEnd::kClosed:
      errno = EBADF;
      return -1;
    case WaitEnd::kInterrupted:
      errno = EINTR;
      return -1;
  }
  int error = 0;
  socklen_t size = sizeof error;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) return -1;
  if (error != 0) {
    errno = error;
    return -1;
  }
  return 0;
}

int close(int fd) {
  FdTable::instance().forget(fd);
  return spindle::hook::detail::Real::get().close(fd);
}

int dup(int fd) {
  REAL(dup);
  int copy = real_dup(fd);
  if (copy >= 0) FdTable::instance().copied(fd, copy);
  return copy;
}

int dup3(int fd, int target, int flags) {
  REAL(dup3);
  if (fd != target) FdTable::instance().forget(target);  // dup3 closes it first
  int copy = real_dup3(fd, target, flags);
  if (copy >= 0) FdTable::instance().copied(fd, copy);
  return copy;
}

int dup2(int fd, int target) {
  REAL(dup2);
  if (fd != target) FdTable::instance().forget(target);
  int copy = real_dup2(fd, target);
  if (copy >= 0 && fd != target) FdTable::instance().copied(fd, copy);
  return copy;
}

// ---- flags and options -----------------------------------------------------------------------

}  // extern "C"

namespace {

int hooked_fcntl(int fd, int command, long argument) {
  REAL(fcntl);
  FdState* s = command == F_GETFL || command == F_SETFL ? FdTable::instance().get(fd) : nullptr;
  if (s == nullptr || !s->socket) return real_fcntl(fd, command, argument);
  if (command == F_GETFL) {
    int flags = real_fcntl(fd, F_GETFL);
    // O_NONBLOCK as the user last set it, not as the hooks keep it underneath.
    if (flags >= 0 && s->file->made_nonblock && !s->file->user_nonblock) flags &= ~O_NONBLOCK;
    return flags;
  }
  s->file->user_nonblock = (argument & O_NONBLOCK) != 0;
  if (s->file->made_nonblock) argument |= O_NONBLOCK;
  return real_fcntl(fd, F_SETFL, argument);
}

}  // namespace

extern "C" {

// The argument's type follows the command: an int, a pointer, or none (read as a long, which
// passes either on this ABI). Programs built with _FILE_OFFSET_BITS=64 call fcntl64.
int fcntl(int fd, int command, ...) {
  va_list args;
  va_start(args, command);
  long argument = va_arg(args, long);
  va_end(args);
  return hooked_fcntl(fd, command, argument);
}

int fcntl64(int fd, int command, ...) {
  va_list args;
  va_start(args, command);
  long argument = va_arg(args, long);
  va_end(args);
  return hooked_fcntl(fd, command, argument);
}

int ioctl(int fd, unsigned long request, ...) {
  REAL(ioctl);
  va_list args;
  va_start(args, request);
  void* argument = va_arg(args, void*);
  va_end(args);
  if (request == FIONBIO && argument != nullptr) {
    if (FdState* s = FdTable::instance().get(fd); s != nullptr && s->socket) {
      s->file->user_nonblock = *static_cast<int*>(argument) != 0;
      if (s->file->made_nonblock) {
        int on = 1;
        return real_ioctl(fd, FIONBIO, &on);
      }
    }
  }
  return real_ioctl(fd, request, argument);
}

int setsockopt(int fd, int level, int name, const void* value, socklen_t length) {
  REAL(setsockopt);
  int rc = real_setsockopt(fd, level, name, value, length);
  if (rc == 0 && level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO) &&
      length >= sizeof(timeval)) {
    if (FdState* s = FdTable::instance().get(fd)) {
      const auto* tv = static_cast<const timeval*>(value);
      auto timeout = std::chrono::seconds(tv->tv_sec) + std::chrono::microseconds(tv->tv_usec);
      (name == SO_RCVTIMEO ? s->file->receive_timeout : s->file->send_timeout) = timeout;
    }
  }
  return rc;
}

// ---- reads and writes -------------------------------------------------------------------------

ssize_t read(int fd, void* buffer, size_t size) {
  REAL(read);
  return cooperative_io(fd, IoDirection::kRead, [&] { return real_read(fd, buffer, size); });
}

ssize_t readv(int fd, const iovec* parts, int count) {
  REAL(readv);
  return cooperative_io(fd, IoDirection::kRead, [&] { return real_readv(fd, parts, count); });
}

ssize_t recv(int fd, void* buffer, size_t size, int flags) {
  REAL(recv);
  return cooperative_io(fd, IoDirection::kRead, [&] { return real_recv(fd, buffer, size, flags); });
}

ssize_t recvfrom(int fd, void* buffer, size_t size, int flags, sockaddr* from, socklen_t* length) {
  REAL(recvfrom);
  return cooperative_io(fd, IoDirection::kRead,
                        [&] { return real_recvfrom(fd, buffer, size, flags, from, length); });
}

ssize_t recvmsg(int fd, msghdr* message, int flags) {
  REAL(recvmsg);
  return cooperative_io(fd, IoDirection::kRead, [&] { return real_recvmsg(fd, message, flags); });
}

ssize_t write(int fd, const void* data, size_t size) {
  REAL(write);
  return cooperative_io(fd, IoDirection::kWrite, [&] { return real_write(fd, data, size); });
}

ssize_t writev(int fd, const iovec* parts, int count) {
  REAL(writev);
  return cooperative_io(fd, IoDirection::kWrite, [&] { return real_writev(fd, parts, count); });
}

ssize_t send(int fd, const void* data, size_t size, int flags) {
  REAL(send);
  return cooperative_io(fd, IoDirection::kWrite, [&] { return real_send(fd, data, size, flags); });
}

ssize_t sendto(int fd, const void* data, size_t size, int flags, const sockaddr* to,
               socklen_t length) {
  REAL(sendto);
  return cooperative_io(fd, IoDirection::kWrite,
                        [&] { return real_sendto(fd, data, size, flags, to, length); });
}

ssize_t sendmsg(int fd, const msghdr* message, int flags) {
  REAL(sendmsg);
  return cooperative_io(fd, IoDirection::kWrite, [&] { return real_sendmsg(fd, message, flags); });
}

// The fortified forms (_FORTIFY_SOURCE) that libraries built with it call instead.
ssize_t __read_chk(int fd, void* buffer, size_t size, size_t room) {
  if (size > room) ::abort();
  return read(fd, buffer, size);
}

ssize_t __recv_chk(int fd, void* buffer, size_t size, size_t room, int flags) {
  if (size > room) ::abort();
  return recv(fd, buffer, size, flags);
}

ssize_t __recvfrom_chk(int fd, void* buffer, size_t size, size_t room, int flags, sockaddr* from,
                       socklen_t* length) {
  if (size > room) ::abort();
  return recvfrom(fd, buffer, size, flags, from, length);
}

// ---- waiting for several --------------------------------------------------------------------

int poll(pollfd* fds, nfds_t count, int timeout_ms) {
  if (!on_fiber() || timeout_ms == 0)
    return spindle::hook::detail::Real::get().poll(fds, count, timeout_ms);
  return spindle::hook::detail::poll_on_fiber(fds, count,
                                              spindle::hook::detail::deadline_in(timeout_ms));
}

int ppoll(pollfd* fds, nfds_t count, const timespec* timeout, const sigset_t* mask) {
  REAL(ppoll);
  // The signal mask is a thread's: a fiber shares its worker's, so it is not changed here.
  if (!on_fiber() || mask != nullptr) return real_ppoll(fds, count, timeout, mask);
  Deadline deadline = timeout == nullptr
                          ? Deadline::never()
                          : Deadline::after(std::chrono::seconds(timeout->tv_sec) +
                                            std::chrono::nanoseconds(timeout->tv_nsec));
  return spindle::hook::detail::poll_on_fiber(fds, count, deadline);
}

int select(int count, fd_set* readable, fd_set* writable, fd_set* failed, timeval* timeout) {
  REAL(select);
  if (!on_fiber()) return real_select(count, readable, writable, failed, timeout);
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
                          : Deadline::after(std::chrono::seconds(timeout->tv_sec) +
                                            std::chrono::microseconds(timeout->tv_usec));
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
  if (timeout != nullptr && ready == 0) *timeout = timeval{0, 0};  // as Linux: what is left
  return ready;
}

// ---- sleeping ---------------------------------------------------------------------------------

int nanosleep(const timespec* duration, timespec* left) {
  REAL(nanosleep);
  if (!on_fiber() || duration == nullptr) return real_nanosleep(duration, left);
  auto wanted =
      std::chrono::seconds(duration->tv_sec) + std::chrono::nanoseconds(duration->tv_nsec);
  auto started = spindle::Clock::now();
  if (spindle::this_fiber::sleep_for(wanted)) {
    auto gone = spindle::Clock::now() - started;
    auto rest = std::chrono::duration_cast<std::chrono::nanoseconds>(wanted - gone);
    if (left != nullptr) {
      left->tv_sec = static_cast<time_t>(rest.count() / 1'000'000'000);
      left->tv_nsec = static_cast<long>(rest.count() % 1'000'000'000);
    }
    errno = EINTR;
    return -1;
  }
  return 0;
}

int clock_nanosleep(clockid_t clock, int flags, const timespec* request, timespec* left) {
  REAL(clock_nanosleep);
  if (!on_fiber() || request == nullptr) return real_clock_nanosleep(clock, flags, request, left);
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
  REAL(getaddrinfo);
  if (!on_fiber()) return real_getaddrinfo(node, service, hints, result);
  // glibc's resolver blocks in its own socket calls (which no hook sees): a helper thread
  // waits for it while the fiber is parked.
  return resolver_threads().run([&] { return real_getaddrinfo(node, service, hints, result); });
}

}  // extern "C"
