// The interposed reads and writes (include/spindle/hook/hook.h). On a fiber, a call on a socket
// its program has not made non-blocking is made with MSG_DONTWAIT, and the fiber parks while
// the socket is not ready; as libc's blocking calls do, a stream write returns once all of it
// is sent and a MSG_WAITALL read once all of it came (or the peer ended, the timeout passed).
// read(2) and write(2) on a socket are recvmsg and sendmsg for the kernel, so they are made so
// here. Anywhere else each is libc's call. The descriptor's flags are never touched.
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>
#include <vector>

#include "cooperative.h"
#include "fd_table.h"
#include "real.h"
#include "wait.h"

namespace spindle::hook::detail {

std::optional<Use> cooperative(int fd, int flags) {
  // (The error queue is read without waiting, whatever the socket's flags.)
  if ((flags & (MSG_DONTWAIT | MSG_ERRQUEUE)) != 0 || !on_fiber()) return std::nullopt;
  FdTable& table = FdTable::instance();
  FdState* s = table.entry(fd);
  if (s == nullptr) return std::nullopt;
  std::uint32_t generation = s->generation.load(std::memory_order_acquire);
  std::uint32_t facts = table.facts(fd, *s);
  if ((facts & kSocket) == 0) return std::nullopt;
  if ((facts & kNonBlocking) != 0 && (facts & kShared) == 0) return std::nullopt;
  // What the program last set is not all: a copy the hooks never see as one (sent away with
  // SCM_RIGHTS, a posix_spawn child's) shares the flags. So the kernel is asked, once, as the
  // call starts: that is when libc's call reads them too (a change mid-wait does not end it).
  long flags_now = ::syscall(SYS_fcntl, fd, F_GETFL);
  if (flags_now < 0 || (flags_now & O_NONBLOCK) != 0) return std::nullopt;
  return Use{s, generation, facts};
}

}  // namespace spindle::hook::detail

namespace {

using spindle::IoDirection;
using spindle::hook::detail::cooperative;
using spindle::hook::detail::FdState;
using spindle::hook::detail::FdTable;
using spindle::hook::detail::Use;
using spindle::hook::detail::WaitEnd;
using spindle::hook::detail::Waiting;
namespace detail = spindle::hook::detail;

ssize_t fail(int error) {
  errno = error;
  return -1;
}

int error_of(WaitEnd end) {
  return end == WaitEnd::kClosed ? EBADF : end == WaitEnd::kInterrupted ? EINTR : EAGAIN;
}

std::size_t total_of(const msghdr& m) {
  std::size_t total = 0;
  for (std::size_t i = 0; i < m.msg_iovlen; ++i) total += m.msg_iov[i].iov_len;
  return total;
}

// Moves `m`'s buffers (a copy the caller owns) past `n` bytes.
void advance(msghdr& m, std::size_t n) {
  while (n > 0 && m.msg_iovlen > 0) {
    iovec& first = m.msg_iov[0];
    if (n < first.iov_len) {
      first.iov_base = static_cast<char*>(first.iov_base) + n;
      first.iov_len -= n;
      return;
    }
    n -= first.iov_len;
    ++m.msg_iov;
    --m.msg_iovlen;
  }
}

// The rest of `message`'s buffers past `done` bytes, in `parts`, without the address and the
// ancillary data (they go with the first part only).
msghdr rest_of(const msghdr& message, std::size_t done, std::vector<iovec>& parts) {
  parts.assign(message.msg_iov, message.msg_iov + message.msg_iovlen);
  msghdr rest{};
  rest.msg_iov = parts.data();
  rest.msg_iovlen = parts.size();
  advance(rest, done);
  return rest;
}

// An error a call took from the socket after it had moved bytes: libc's blocking call returns
// the count and leaves the error on the socket for the next call, so the hooks keep it for the
// next call. EPIPE stays on a socket by itself (its next send says it again, with SIGPIPE);
// EAGAIN and EINTR are nothing the socket holds.
void keep_for_next_call(FdState& s, int error) {
  if (error != EPIPE && error != EAGAIN && error != EWOULDBLOCK && error != EINTR) {
    s.pending_error.store(error, std::memory_order_relaxed);
  }
}

// How many bytes the socket has queued for reading (0 if it cannot say).
int queued(int fd) {
  int n = 0;
  return ::ioctl(fd, FIONREAD, &n) == 0 ? n : 0;
}

// True if the socket holds an error (poll's POLLERR: looking does not take it, as a call would).
bool holds_error(int fd) {
  pollfd p{fd, 0, 0};
  return detail::real_poll(&p, 1, 0) > 0 && (p.revents & POLLERR) != 0;
}

// True if a cooperative call left an error for the next call on `fd`.
bool holds_pending_error(int fd) {
  FdState* s = FdTable::instance().find(fd);
  return s != nullptr && s->pending_error.load(std::memory_order_relaxed) != 0;
}

// The error a cooperative call left for this one (0: none), taken. A read (`reading`) takes it
// only once the bytes that came before it are read, as the kernel orders them.
int take_pending_error(int fd, bool reading = false) {
  FdState* s = FdTable::instance().find(fd);
  if (s == nullptr || s->pending_error.load(std::memory_order_relaxed) == 0) return 0;
  if (reading && queued(fd) > 0) return 0;
  return s->pending_error.exchange(0, std::memory_order_acq_rel);
}

// Descriptors that came in a message (SCM_RIGHTS) are new at their numbers.
void note_received_descriptors(const msghdr* message) {
  if (message == nullptr || message->msg_control == nullptr) return;
  for (cmsghdr* c = CMSG_FIRSTHDR(const_cast<msghdr*>(message)); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(message), c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const int* fds = reinterpret_cast<const int*>(CMSG_DATA(c));
    for (std::size_t i = 0; i < count; ++i) FdTable::instance().made(fds[i], 0);
  }
}

// The descriptor is not the socket the hooks took it for (closed and made again where no
// hook saw it): forget what was known; the call goes to libc.
std::optional<ssize_t> not_a_socket(const Use& use) {
  use.state->facts.store(0, std::memory_order_release);
  return std::nullopt;
}

// True if the socket's peer shut down its side (or the connection failed): what was peeked
// is all there will be.
bool peer_ended(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return detail::real_poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// True if a whole read on the Unix stream socket `fd` into `message` has the kernel's rules for
// ancillary data to keep: it never glues bytes of two writers when credentials are passed
// (SO_PASSCRED), and ends after a piece that carries descriptors (into a control buffer).
bool carries_ancillary(int fd, const msghdr& message) {
  int on = 0;
  socklen_t size = sizeof on;
  return message.msg_controllen > 0 ||
         (::getsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, &size) == 0 && on != 0);
}

// A whole read (MSG_WAITALL) on a Unix stream socket with ancillary data: pieces read one by
// one cannot keep the kernel's rules (carries_ancillary), so the kernel reads it. The fiber
// waits until something is there; if all of it is (or the peer ended), the read does not wait;
// otherwise it is the kernel's blocking read, and the worker waits with it for the rest.
std::optional<ssize_t> whole_local_receive(int fd, const Use& use, msghdr* message, int flags) {
  SPINDLE_REAL(recvmsg);
  const std::size_t total = total_of(*message);
  Waiting waiting(fd, *use.state, use.generation, use.facts, Waiting::Timeout::kReceive);
  for (;;) {
    int there = queued(fd);
    if (there > 0 || peer_ended(fd) || holds_error(fd)) {
      bool all = static_cast<std::size_t>(there) >= total || peer_ended(fd);
      ssize_t n = real_recvmsg(fd, message, flags | (all ? MSG_DONTWAIT : 0));
      if (n < 0 && errno == ENOTSOCK) return not_a_socket(use);
      return n;
    }
    WaitEnd end = waiting.wait(IoDirection::kRead);
    if (end == WaitEnd::kTimedOut) return fail(EAGAIN);
    if (end != WaitEnd::kReady) return fail(error_of(end));
  }
}

// True if a blocking read of `total` bytes on the stream socket `fd` would wait for its
// SO_RCVLOWAT still: fewer bytes are queued than the mark (or `total`), and the peer has not
// ended nor the socket an error.
bool below_low_water(int fd, const Use& use, std::size_t total) {
  int mark = use.state->receive_low_water.load(std::memory_order_relaxed);
  if (mark <= 1 || (use.facts & detail::kStream) == 0) return false;
  std::size_t wanted = std::min(static_cast<std::size_t>(mark), total);
  return static_cast<std::size_t>(queued(fd)) < wanted && !peer_ended(fd) && !holds_error(fd);
}

// A receive its program expects to wait, on a fiber, into `message` (the caller's own msghdr
// for the first try, so that what recvmsg reports lands there). Nothing if the descriptor
// turned out not to be a socket.
std::optional<ssize_t> cooperative_receive(int fd, const Use& use, msghdr* message, int flags) {
  SPINDLE_REAL(recvmsg);
  const std::size_t total = total_of(*message);
  const bool peek = (flags & MSG_PEEK) != 0;
  // MSG_WAITALL: a stream's read waits for all (a peek too, except on a Unix socket).
  const bool whole = (flags & MSG_WAITALL) != 0 && (use.facts & detail::kStream) != 0 &&
                     !(peek && (use.facts & detail::kLocal) != 0);
  if (whole && !peek && (use.facts & detail::kLocal) != 0 && carries_ancillary(fd, *message)) {
    return whole_local_receive(fd, use, message, flags);
  }
  Waiting waiting(fd, *use.state, use.generation, use.facts, Waiting::Timeout::kReceive);
  std::vector<iovec> parts;
  msghdr rest{};
  msghdr* m = message;
  std::size_t got = 0, peeked = 0;
  // SO_RCVLOWAT: libc's blocking read waits for the mark, then (or once its time is out, or
  // it is interrupted) returns what is there; a non-waiting read would not wait for it.
  bool marked = !whole && !peek && below_low_water(fd, use, total);
  while (marked) {
    WaitEnd end = waiting.wait(IoDirection::kRead);
    if (end == WaitEnd::kClosed) return fail(EBADF);
    marked = end == WaitEnd::kReady && below_low_water(fd, use, total);
  }
  for (;;) {
    // Once some came, the kernel's read returns the count and leaves an error on the socket
    // for the next call once the queued bytes are read: so does this one.
    if (got > 0 && queued(fd) == 0 && holds_error(fd)) return got;
    ssize_t n = real_recvmsg(fd, m, flags | MSG_DONTWAIT);
    int error = errno;
    if (n == 0) return whole && !peek ? got : 0;
    if (n > 0) {
      if (!whole || static_cast<std::size_t>(n) == total) return n;
      if (peek) {
        // Not all there yet: wait for more, unless no more can come.
        if (peer_ended(fd)) return n;
        peeked = static_cast<std::size_t>(n);
      } else {
        got += static_cast<std::size_t>(n);
        // Ancillary data (a TCP socket's) comes with the first piece only: the read ends there.
        if (got == total || (m == message && message->msg_controllen > 0)) return got;
        rest = rest_of(*message, got, parts);
        m = &rest;
        continue;
      }
    } else if (error == ENOTSOCK && got == 0) {
      return not_a_socket(use);
    } else if (error != EAGAIN && error != EWOULDBLOCK) {
      if (got == 0) return fail(error);
      keep_for_next_call(*use.state, error);
      return got;
    }
    if (!waiting.user_blocks()) return got + peeked > 0 ? got + peeked : fail(EAGAIN);
    WaitEnd end = waiting.wait(IoDirection::kRead);
    if (end == WaitEnd::kReady) continue;
    if (got + peeked > 0) return got + peeked;
    return fail(error_of(end));
  }
}

// Waits (on a fiber) until the connection under way on `fd` is made: 0, or why not (its
// SO_ERROR, or the wait's end).
int wait_connected(int fd, Waiting& waiting) {
  for (;;) {
    pollfd p{fd, POLLOUT, 0};
    if (detail::real_poll(&p, 1, 0) != 0) break;
    if (WaitEnd end = waiting.wait(IoDirection::kWrite); end != WaitEnd::kReady) {
      return error_of(end);
    }
  }
  int result = 0;
  socklen_t size = sizeof result;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &result, &size) != 0) return errno;
  return result;
}

// A send its program expects to wait, on a fiber: a stream's is whole (unless its time runs
// out or the connection fails after some of it went: then the count, as libc's).
std::optional<ssize_t> cooperative_send(int fd, const Use& use, const msghdr* message, int flags) {
  SPINDLE_REAL(sendmsg);
  const std::size_t total = total_of(*message);
  const bool whole = (use.facts & detail::kStream) != 0;
  Waiting waiting(fd, *use.state, use.generation, use.facts, Waiting::Timeout::kSend);
  std::vector<iovec> parts;
  msghdr rest{};
  const msghdr* m = message;
  std::size_t sent = 0;
  for (;;) {
    // Once some went, the kernel's write returns the count and leaves an error on the socket
    // (poll's POLLERR, SO_ERROR, the next call): a send now would take it, so none is made.
    if (sent > 0 && holds_error(fd)) return sent;
    // (Should the error come between the look and the send: see keep_for_next_call.)
    ssize_t n = real_sendmsg(fd, m, flags | MSG_DONTWAIT | (sent > 0 ? MSG_NOSIGNAL : 0));
    int error = errno;
    if (n >= 0) {
      sent += static_cast<std::size_t>(n);
      if (!whole || sent >= total) return sent;
      rest = rest_of(*message, sent, parts);
      m = &rest;
      continue;
    }
    if (error == ENOTSOCK && sent == 0) return not_a_socket(use);
    if (error == EINPROGRESS && (flags & MSG_FASTOPEN) != 0 && sent == 0) {
      // TCP Fast Open without a cookie: the SYN went without the data. libc's blocking call
      // waits for the connection, then sends: so does this one, on the connected socket.
      if (int failed = wait_connected(fd, waiting)) return fail(failed);
      flags &= ~MSG_FASTOPEN;
      rest = *message;
      rest.msg_name = nullptr;
      rest.msg_namelen = 0;
      m = &rest;
      continue;
    }
    if (error != EAGAIN && error != EWOULDBLOCK) {
      if (sent == 0) return fail(error);
      keep_for_next_call(*use.state, error);
      return sent;
    }
    if (!waiting.user_blocks()) return sent > 0 ? sent : fail(EAGAIN);
    WaitEnd end = waiting.wait(IoDirection::kWrite);
    if (end == WaitEnd::kReady) continue;
    if (sent > 0) return sent;
    return fail(error_of(end));
  }
}

msghdr message_of(void* buffer, std::size_t size, iovec& part) {
  part = {buffer, size};
  msghdr m{};
  m.msg_iov = &part;
  m.msg_iovlen = 1;
  return m;
}

msghdr message_of(const iovec* parts, int count) {
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(parts);
  m.msg_iovlen = count > 0 ? static_cast<std::size_t>(count) : 0;
  return m;
}

// write(2) on a SOCK_SEQPACKET socket ends a record.
int write_flags(const Use& use) { return (use.facts & detail::kSeqPacket) != 0 ? MSG_EOR : 0; }

}  // namespace

extern "C" {

ssize_t read(int fd, void* buffer, size_t size) {
  SPINDLE_REAL(read);
  // A read of nothing reads nothing (a receive of nothing would take a datagram, or an error).
  if (size == 0) return real_read(fd, buffer, size);
  if (int error = take_pending_error(fd, true)) return fail(error);
  if (auto use = cooperative(fd, 0)) {
    iovec part;
    msghdr m = message_of(buffer, size, part);
    if (auto n = cooperative_receive(fd, *use, &m, 0)) return *n;
  }
  return real_read(fd, buffer, size);
}

ssize_t readv(int fd, const iovec* parts, int count) {
  SPINDLE_REAL(readv);
  // (More parts than IOV_MAX: readv's EINVAL, not recvmsg's EMSGSIZE.)
  if (count <= 0 || count > IOV_MAX) return real_readv(fd, parts, count);
  // The array is read only where the hooks have something to do: a plain thread's readv with
  // no error kept for it is libc's (whose bad array is the kernel's EFAULT).
  auto use = cooperative(fd, 0);
  if (!use && !holds_pending_error(fd)) return real_readv(fd, parts, count);
  msghdr m = message_of(parts, count);
  if (total_of(m) == 0) return real_readv(fd, parts, count);  // (as read's)
  if (int error = take_pending_error(fd, true)) return fail(error);
  if (use) {
    if (auto n = cooperative_receive(fd, *use, &m, 0)) return *n;
  }
  return real_readv(fd, parts, count);
}

ssize_t recv(int fd, void* buffer, size_t size, int flags) {
  SPINDLE_REAL(recv);
  if (int error = take_pending_error(fd, true)) return fail(error);
  if (auto use = cooperative(fd, flags)) {
    iovec part;
    msghdr m = message_of(buffer, size, part);
    if (auto n = cooperative_receive(fd, *use, &m, flags)) return *n;
  }
  return real_recv(fd, buffer, size, flags);
}

ssize_t recvfrom(int fd, void* buffer, size_t size, int flags, sockaddr* from, socklen_t* length) {
  SPINDLE_REAL(recvfrom);
  if (int error = take_pending_error(fd, true)) return fail(error);
  if (auto use = cooperative(fd, flags)) {
    iovec part;
    msghdr m = message_of(buffer, size, part);
    if (from != nullptr && length != nullptr) {
      m.msg_name = from;
      m.msg_namelen = *length;
    }
    if (auto n = cooperative_receive(fd, *use, &m, flags)) {
      if (*n >= 0 && from != nullptr && length != nullptr) *length = m.msg_namelen;
      return *n;
    }
  }
  return real_recvfrom(fd, buffer, size, flags, from, length);
}

ssize_t recvmsg(int fd, msghdr* message, int flags) {
  SPINDLE_REAL(recvmsg);
  if (int error = take_pending_error(fd, true)) return fail(error);
  std::optional<ssize_t> n;
  if (auto use = message != nullptr ? cooperative(fd, flags) : std::nullopt) {
    n = cooperative_receive(fd, *use, message, flags);
  }
  if (!n) n = real_recvmsg(fd, message, flags);
  if (*n >= 0) note_received_descriptors(message);
  return *n;
}

ssize_t write(int fd, const void* data, size_t size) {
  SPINDLE_REAL(write);
  if (int error = take_pending_error(fd)) return fail(error);
  if (auto use = cooperative(fd, 0)) {
    iovec part;
    msghdr m = message_of(const_cast<void*>(data), size, part);
    if (auto n = cooperative_send(fd, *use, &m, write_flags(*use))) return *n;
  }
  return real_write(fd, data, size);
}

ssize_t writev(int fd, const iovec* parts, int count) {
  SPINDLE_REAL(writev);
  if (int error = take_pending_error(fd)) return fail(error);
  // (More parts than IOV_MAX: writev's EINVAL, not sendmsg's EMSGSIZE.)
  if (auto use = count > 0 && count <= IOV_MAX ? cooperative(fd, 0) : std::nullopt) {
    msghdr m = message_of(parts, count);
    if (auto n = cooperative_send(fd, *use, &m, write_flags(*use))) return *n;
  }
  return real_writev(fd, parts, count);
}

ssize_t send(int fd, const void* data, size_t size, int flags) {
  SPINDLE_REAL(send);
  if (int error = take_pending_error(fd)) return fail(error);
  if (auto use = cooperative(fd, flags)) {
    iovec part;
    msghdr m = message_of(const_cast<void*>(data), size, part);
    if (auto n = cooperative_send(fd, *use, &m, flags)) return *n;
  }
  return real_send(fd, data, size, flags);
}

ssize_t sendto(int fd, const void* data, size_t size, int flags, const sockaddr* to,
               socklen_t length) {
  SPINDLE_REAL(sendto);
  if (int error = take_pending_error(fd)) return fail(error);
  if (auto use = cooperative(fd, flags)) {
    iovec part;
    msghdr m = message_of(const_cast<void*>(data), size, part);
    m.msg_name = const_cast<sockaddr*>(to);
    m.msg_namelen = to != nullptr ? length : 0;
    if (auto n = cooperative_send(fd, *use, &m, flags)) return *n;
  }
  return real_sendto(fd, data, size, flags, to, length);
}

ssize_t sendmsg(int fd, const msghdr* message, int flags) {
  SPINDLE_REAL(sendmsg);
  if (int error = take_pending_error(fd)) return fail(error);
  if (auto use = message != nullptr ? cooperative(fd, flags) : std::nullopt) {
    if (auto n = cooperative_send(fd, *use, message, flags)) return *n;
  }
  return real_sendmsg(fd, message, flags);
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

}  // extern "C"
