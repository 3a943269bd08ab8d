// The interposed libc functions that make, copy, close and configure descriptors
// (include/spindle/hook/hook.h). Each is libc's call, then a note in the descriptor table
// (fd_table.h); connect and accept also wait cooperatively on a fiber. The reads and writes
// are in io.cc, poll/select, the sleeps and getaddrinfo in multiplex.cc.
#include "spindle/hook/hook.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/time_types.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "cooperative.h"
#include "fd_table.h"
#include "real.h"
#include "wait.h"

using spindle::Deadline;
using spindle::IoDirection;
using spindle::hook::detail::FdTable;
using spindle::hook::detail::WaitEnd;
using spindle::hook::detail::Waiting;
namespace detail = spindle::hook::detail;

// What the hook library's CMake target makes the linker pull in: this object, and with it every
// definition here and in the other objects it needs (a static library's objects are linked
// only when something needs them).
extern "C" const int spindle_hook_linked = 1;

bool spindle::hook::linked() { return spindle_hook_linked == 1; }

namespace {

// True if `fd` is a listening socket (or the kernel cannot say: the call then finds out).
bool listening(int fd) {
  int on = 1;
  socklen_t size = sizeof on;
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &size) != 0 || on != 0;
}

// A socket timeout as the table keeps it, by Linux's rules: microseconds, 0 for none ({0, 0},
// or so long it is none), -1 for a negative one ("do not wait").
std::int64_t timeout_us(const timeval& t) {
  constexpr std::int64_t kCentury = 100ll * 366 * 24 * 3600;
  if (t.tv_sec < 0) return -1;
  if (t.tv_sec >= kCentury) return 0;
  return std::int64_t{t.tv_sec} * 1'000'000 + t.tv_usec;
}

// An errno for how a wait ended without the call being done (kReady is not one).
int error_of(WaitEnd end, int timed_out) {
  switch (end) {
    case WaitEnd::kTimedOut:
      return timed_out;
    case WaitEnd::kClosed:
      return EBADF;
    case WaitEnd::kInterrupted:
      return EINTR;
    case WaitEnd::kReady:
      break;
  }
  return 0;
}

// The facts of an accepted socket: its listener's kind, and `flags`' SOCK_NONBLOCK.
std::uint32_t accepted_facts(int listener, int flags) {
  FdTable& table = FdTable::instance();
  detail::FdState* s = table.entry(listener);
  std::uint32_t facts = s == nullptr ? 0 : table.facts(listener, *s);
  if ((facts & detail::kSocket) == 0) return 0;  // learned when needed
  facts &= detail::kKnown | detail::kSocket | detail::kStream | detail::kSeqPacket | detail::kLocal;
  facts |= detail::kMade;
  if ((flags & SOCK_NONBLOCK) != 0) facts |= detail::kNonBlocking;
  return facts;
}

// A blocking connect on a fiber, for a socket its program made through the hooks: the socket
// is made non-blocking for the connect(2) call alone (the one moment the hooks change a
// descriptor's flags; nothing else uses a socket while it connects), then the fiber waits.
template <typename Connect>
int connect_on_fiber(const detail::Use& use, int fd, Connect connect) {
  SPINDLE_REAL(fcntl);
  int flags = real_fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_NONBLOCK) != 0) return connect();
  if (real_fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return connect();
  int rc = connect();
  int error = errno;
  (void)real_fcntl(fd, F_SETFL, flags);
  // A connect already under way (a blocking one ended by SO_SNDTIMEO, retried): libc's waits
  // for it as for its own, and says EALREADY only if its timeout passes first.
  int timed_out = error == EALREADY ? EALREADY : EINPROGRESS;
  if (error == EALREADY) error = EINPROGRESS;
  if (rc == 0 || (error != EINPROGRESS && error != EAGAIN)) {
    errno = error;
    return rc;
  }
  Waiting waiting(fd, *use.state, use.generation, use.facts, Waiting::Timeout::kSend);
  while (error == EAGAIN) {
    // A Unix socket whose listener's backlog is full: no readiness says when it has room.
    if (WaitEnd end = waiting.pause(); end != WaitEnd::kReady) {
      errno = error_of(end, EAGAIN);  // Linux's answer when SO_SNDTIMEO passes
      return -1;
    }
    if (real_fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return connect();
    rc = connect();
    error = errno;
    (void)real_fcntl(fd, F_SETFL, flags);
    if (rc == 0) return 0;
  }
  if (error != EINPROGRESS) {
    errno = error;
    return -1;
  }
  for (;;) {
    WaitEnd end = waiting.wait(IoDirection::kWrite);
    if (end != WaitEnd::kReady) {
      errno = error_of(end, timed_out);  // Linux's answer when SO_SNDTIMEO passes
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    if (detail::real_poll(&p, 1, 0) == 0) continue;
    int result = 0;
    socklen_t size = sizeof result;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &result, &size) != 0) return -1;
    if (result == 0) return 0;
    errno = result;
    return -1;
  }
}

}  // namespace

extern "C" {

// ---- descriptors made -----------------------------------------------------------------------

int socket(int domain, int type, int protocol) {
  SPINDLE_REAL(socket);
  int fd = real_socket(domain, type, protocol);
  if (fd >= 0) FdTable::instance().made(fd, detail::socket_facts(domain, type) | detail::kMade);
  return fd;
}

int socketpair(int domain, int type, int protocol, int fds[2]) {
  SPINDLE_REAL(socketpair);
  int rc = real_socketpair(domain, type, protocol, fds);
  if (rc == 0) {
    for (int i : {0, 1}) {
      FdTable::instance().made(fds[i], detail::socket_facts(domain, type) | detail::kMade);
    }
  }
  return rc;
}

int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  SPINDLE_REAL(accept4);
  // What cannot accept (not listening: a datagram or connected socket) or flags it does not
  // know fail at once in the kernel: libc's call says so without waiting.
  constexpr int kFlags = SOCK_NONBLOCK | SOCK_CLOEXEC;
  auto use = (flags & ~kFlags) == 0 && listening(fd) ? detail::cooperative(fd, 0) : std::nullopt;
  int got;
  if (!use) {
    got = real_accept4(fd, address, length, flags);
  } else {
    // Waits until a connection is there, then takes it (a blocking accept: if another thread
    // or process took it first, this one waits in the kernel, as libc's does).
    Waiting waiting(fd, *use->state, use->generation, use->facts, Waiting::Timeout::kReceive);
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (detail::real_poll(&p, 1, 0) != 0 || !waiting.user_blocks()) break;
      WaitEnd end = waiting.wait(IoDirection::kRead);
      if (end != WaitEnd::kReady) {
        errno = error_of(end, EAGAIN);
        return -1;
      }
    }
    got = real_accept4(fd, address, length, flags);
  }
  if (got >= 0) FdTable::instance().made(got, accepted_facts(fd, flags));
  return got;
}

int accept(int fd, sockaddr* address, socklen_t* length) { return accept4(fd, address, length, 0); }

int connect(int fd, const sockaddr* address, socklen_t length) {
  SPINDLE_REAL(connect);
  auto call = [&] { return real_connect(fd, address, length); };
  auto use = detail::cooperative(fd, 0);
  if (!use || (use->facts & detail::kMade) == 0) return call();
  // A datagram socket's connect never waits: its flags are left alone (a blocking receive on
  // another thread would otherwise see O_NONBLOCK for that moment).
  if ((use->facts & (detail::kStream | detail::kSeqPacket)) == 0) return call();
  return connect_on_fiber(*use, fd, call);
}

int dup(int fd) {
  SPINDLE_REAL(dup);
  int copy = real_dup(fd);
  if (copy >= 0) FdTable::instance().copied(fd, copy);
  return copy;
}

int dup2(int fd, int target) {
  SPINDLE_REAL(dup2);
  int copy = real_dup2(fd, target);
  if (copy >= 0 && fd != target) FdTable::instance().copied(fd, copy);
  return copy;
}

int dup3(int fd, int target, int flags) {
  SPINDLE_REAL(dup3);
  int copy = real_dup3(fd, target, flags);
  if (copy >= 0) FdTable::instance().copied(fd, copy);
  return copy;
}

// ---- vfork ------------------------------------------------------------------------------------

// A vfork child shares its parent's memory (this table) but not its descriptors: the hooks
// leave the table alone in it (in_vforked_child). vfork is counted for that: the parent's
// count goes back down once it resumes, so that no other call pays for the question. In
// assembly, as libc's: the child returns on the parent's stack, so the return address is kept
// in a register, not on the stack. (Not under TSan, whose own vfork is a fork.)
int spindle_hook_vforks = 0;

#if defined(__SANITIZE_ADDRESS__)
extern "C" void __asan_handle_vfork(void* stack);  // (ASan's runtime)
#endif

extern "C" [[gnu::used, gnu::visibility("hidden")]] void spindle_hook_vfork_returned(void* stack) {
  __atomic_fetch_sub(&spindle_hook_vforks, 1, __ATOMIC_RELEASE);
  // (ASan's own vfork does this: the child's frames left their marks on the shared stack.)
#if defined(__SANITIZE_ADDRESS__)
  __asan_handle_vfork(stack);
#else
  (void)stack;
#endif
}

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
asm(R"(
  .text
  .globl vfork
  .type vfork, @function
vfork:
  .cfi_startproc
  lock incl spindle_hook_vforks(%rip)
  popq %rdi
  .cfi_adjust_cfa_offset -8
  .cfi_register %rip, %rdi
  movl $58, %eax
  syscall
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %rip, 0
  testq %rax, %rax
  je 1f
  pushq %rax
  .cfi_adjust_cfa_offset 8
  leaq 8(%rsp), %rdi
  call spindle_hook_vfork_returned
  popq %rax
  .cfi_adjust_cfa_offset -8
  cmpq $-4095, %rax
  jae 2f
1:
  ret
2:
  negl %eax
  pushq %rax
  .cfi_adjust_cfa_offset 8
  call __errno_location@PLT
  popq %rcx
  .cfi_adjust_cfa_offset -8
  movl %ecx, (%rax)
  movq $-1, %rax
  ret
  .cfi_endproc
  .size vfork, .-vfork
)");
#endif

// ---- descriptors closed ---------------------------------------------------------------------

int close(int fd) {
  SPINDLE_REAL(close);
  FdTable::instance().forget(fd);
  return real_close(fd);
}

int close_range(unsigned int first, unsigned int last, int flags) {
  SPINDLE_REAL(close_range);
  // What the kernel refuses (flags it does not know, a range backwards) closes nothing.
  constexpr int kKnown = CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC;
  bool closes = (flags & ~kKnown) == 0 && first <= last && (flags & CLOSE_RANGE_CLOEXEC) == 0;
  if (closes) FdTable::instance().forget_range(first, last);
  return real_close_range(first, last, flags);
}

void closefrom(int lowest) {
  SPINDLE_REAL(closefrom);
  FdTable::instance().forget_range(static_cast<unsigned>(std::max(lowest, 0)), ~0u);
  real_closefrom(lowest);
}

// A stream's close closes its descriptor inside libc, where no hook sees it.
int fclose(FILE* stream) {
  SPINDLE_REAL(fclose);
  if (stream != nullptr) FdTable::instance().forget(::fileno(stream));
  return real_fclose(stream);
}

FILE* freopen(const char* path, const char* mode, FILE* stream) {
  SPINDLE_REAL(freopen);
  if (stream != nullptr) FdTable::instance().forget(::fileno(stream));
  FILE* opened = real_freopen(path, mode, stream);
  if (opened != nullptr) FdTable::instance().made(::fileno(opened), 0);
  return opened;
}

// A socket shut down for writing wakes no writer parked on it (epoll sees no change of its
// own readiness), where a blocking send ends at once (EPIPE): the hooks wake it.
int shutdown(int fd, int how) {
  SPINDLE_REAL(shutdown);
  int rc = real_shutdown(fd, how);
  if (rc == 0 && how != SHUT_RD) FdTable::instance().wake(fd);
  return rc;
}

// ---- flags and options ----------------------------------------------------------------------

}  // extern "C"

namespace {

int hooked_fcntl(int fd, int command, long argument) {
  SPINDLE_REAL(fcntl);
  int rc = real_fcntl(fd, command, argument);
  if (rc < 0) return rc;
  if (command == F_SETFL) FdTable::instance().set_nonblocking(fd, (argument & O_NONBLOCK) != 0);
  if (command == F_DUPFD || command == F_DUPFD_CLOEXEC) FdTable::instance().copied(fd, rc);
  return rc;
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
  SPINDLE_REAL(ioctl);
  va_list args;
  va_start(args, request);
  void* argument = va_arg(args, void*);
  va_end(args);
  int rc = real_ioctl(fd, request, argument);
  if (rc == 0 && request == FIONBIO && argument != nullptr) {
    FdTable::instance().set_nonblocking(fd, *static_cast<int*>(argument) != 0);
  }
  return rc;
}

int setsockopt(int fd, int level, int name, const void* value, socklen_t length) {
  SPINDLE_REAL(setsockopt);
  int rc = real_setsockopt(fd, level, name, value, length);
  bool receive = name == SO_RCVTIMEO || name == SO_RCVTIMEO_NEW;
  bool timeout = receive || name == SO_SNDTIMEO || name == SO_SNDTIMEO_NEW;
  // (On 64-bit Linux a timeval and the _NEW options' __kernel_sock_timeval are one layout.)
  static_assert(sizeof(timeval) == sizeof(__kernel_sock_timeval));
  if (rc == 0 && level == SOL_SOCKET && name == SO_RCVLOWAT && length >= sizeof(int)) {
    int bytes = *static_cast<const int*>(value);
    FdTable::instance().set_low_water(fd, bytes < 0 ? INT_MAX : bytes);  // (Linux's reading)
  }
  if (rc == 0 && level == SOL_SOCKET && timeout && length >= sizeof(timeval)) {
    FdTable::instance().set_timeout(fd, receive, timeout_us(*static_cast<const timeval*>(value)));
  }
  return rc;
}

}  // extern "C"
