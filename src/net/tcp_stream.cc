#include "spindle/net/tcp_stream.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

#include "spindle/io/bare_recv.h"

namespace spindle {
namespace {

// The socket writes of the request path, made as bare system calls for the reason reads are
// (bare_recv): glibc's send and sendmsg are pthread cancellation points (~60 instructions a
// request).
ssize_t sys_send(int fd, const void* data, std::size_t size) {
  return ::syscall(SYS_sendto, fd, data, size, MSG_NOSIGNAL, nullptr, 0);
}
ssize_t sys_sendmsg(int fd, const msghdr* message) {
  return ::syscall(SYS_sendmsg, fd, message, MSG_NOSIGNAL);
}

}  // namespace

Result<TcpStream> TcpStream::connect(const Address& address, Deadline deadline) {
  auto socket = Socket::open(address.domain(), SOCK_STREAM);
  if (!socket) return fail(socket.error());
  if (::connect(socket->fd(), address.data(), address.size()) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) return fail_errno();
    // Writable once the handshake is over, either way; SO_ERROR tells which way.
    auto done = socket->retry(IoDirection::kWrite, deadline, [&]() -> ssize_t {
      int error = 0;
      socklen_t length = sizeof error;
      if (::getsockopt(socket->fd(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) return -1;
      if (error == 0) {
        // Still connecting reports no error either: a zero-byte probe tells us which.
        sockaddr_storage peer{};
        socklen_t peer_length = sizeof peer;
        if (::getpeername(socket->fd(), reinterpret_cast<sockaddr*>(&peer), &peer_length) == 0) {
          return 0;
        }
        errno = EAGAIN;
        return -1;
      }
      errno = error;
      return -1;
    });
    if (!done) return fail(done.error());
  }
  return TcpStream(std::move(*socket));
}

Result<std::size_t> TcpStream::read(std::span<char> buffer, Deadline deadline) {
  // Drained by the last read and nothing arrived since: wait without a recv that would only
  // say EAGAIN (as nginx keeps its `ready` flag). A proxy saves one such call per exchange on
  // each side. The wait offers the buffer to the worker, which reads into it as it wakes this
  // fiber (ReadAhead); a read that finds nothing after all waits again.
  ssize_t n;
  for (;;) {
    if (socket_.drained() && !buffer.empty()) {
      ReadAhead ahead{.buffer = buffer};
      auto ec = socket_.wait_to_read(ahead, deadline);
      if (!ahead.done && ec) return fail(ec);
      if (ahead.done) {
        n = ahead.result;
        errno = ahead.error;
      } else {
        n = bare_recv(socket_.fd(), buffer.data(), buffer.size());
      }
    } else {
      n = bare_recv(socket_.fd(), buffer.data(), buffer.size());
    }
    if (n >= 0) break;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return fail_errno();
    socket_.note_drained();
    if (!socket_.drained()) {  // (hung up: no edge will come; never seen to say EAGAIN)
      if (auto ec = socket_.wait(IoDirection::kRead, deadline)) return fail(ec);
    }
  }
  // Short means the receive queue is empty now; anything arriving later raises a new edge.
  if (n > 0 && static_cast<std::size_t>(n) < buffer.size()) socket_.note_drained();
  return static_cast<std::size_t>(n);
}

Result<void> TcpStream::read_exact(std::span<char> buffer, Deadline deadline) {
  while (!buffer.empty()) {
    auto n = read(buffer, deadline);
    if (!n) return fail(n.error());
    if (*n == 0) return fail(make_error_code(Errc::kEndOfStream));
    buffer = buffer.subspan(*n);
  }
  return {};
}

Result<std::size_t> TcpStream::write(std::span<const char> data, Deadline deadline) {
  auto n = socket_.retry(IoDirection::kWrite, deadline,
                         [&] { return sys_send(socket_.fd(), data.data(), data.size()); });
  if (!n) return fail(n.error());
  sent_ += static_cast<std::size_t>(*n);
  return static_cast<std::size_t>(*n);
}

std::size_t TcpStream::write_now(std::span<const char> data) {
  std::size_t written = 0;
  while (written < data.size()) {
    auto n = write(data.subspan(written), Deadline::no_wait());
    if (!n) break;
    written += *n;
  }
  return written;
}

Result<void> TcpStream::write_all(std::span<const char> data, Deadline deadline) {
  while (!data.empty()) {
    auto n = write(data, deadline);
    if (!n) return fail(n.error());
    data = data.subspan(*n);
  }
  return {};
}

Result<std::size_t> TcpStream::writev(std::span<const iovec> buffers, Deadline deadline) {
  // One buffer (a batch of responses, most often): send(2), which the kernel handles with less
  // work than sendmsg's message header and vector.
  if (buffers.size() == 1) {
    std::span<const char> data(static_cast<const char*>(buffers[0].iov_base), buffers[0].iov_len);
    if (auto written = write_all(data, deadline); !written) return fail(written.error());
    return data.size();
  }
  std::size_t total = 0;
  for (const iovec& b : buffers) total += b.iov_len;
  // The common case: one sendmsg writes everything and nothing is copied.
  std::vector<iovec> rest;
  std::span<const iovec> pending = buffers;
  std::size_t written = 0;
  while (written < total) {
    msghdr message{};
    message.msg_iov = const_cast<iovec*>(pending.data());
    message.msg_iovlen = std::min<std::size_t>(pending.size(), IOV_MAX);
    auto n = socket_.retry(IoDirection::kWrite, deadline,
                           [&] { return sys_sendmsg(socket_.fd(), &message); });
    if (!n) return fail(n.error());
    written += static_cast<std::size_t>(*n);
    sent_ += static_cast<std::size_t>(*n);
    if (written == total) break;
    // Partial write: drop what was sent and go on with a copy of the rest.
    rest.assign(pending.begin(), pending.end());
    std::size_t skip = static_cast<std::size_t>(*n);
    std::size_t first = 0;
    while (skip >= rest[first].iov_len) skip -= rest[first++].iov_len;
    rest[first].iov_base = static_cast<char*>(rest[first].iov_base) + skip;
    rest[first].iov_len -= skip;
    rest.erase(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(first));
    pending = rest;
  }
  return total;
}

Result<std::size_t> TcpStream::sendfile(int file_fd, off_t offset, std::size_t count,
                                        Deadline deadline) {
  std::size_t sent = 0;
  while (sent < count) {
    auto n = socket_.retry(IoDirection::kWrite, deadline, [&] {
      return ::sendfile(socket_.fd(), file_fd, &offset, count - sent);
    });
    if (!n) return fail(n.error());
    if (*n == 0) break;  // end of file
    sent += static_cast<std::size_t>(*n);
    sent_ += static_cast<std::size_t>(*n);
  }
  return sent;
}

Result<void> TcpStream::shutdown(Shutdown how) {
  if (::shutdown(socket_.fd(), static_cast<int>(how)) != 0) return fail_errno();
  return {};
}

Result<void> TcpStream::set_nodelay(bool on) {
  auto r = socket_.set_option(IPPROTO_TCP, TCP_NODELAY, on ? 1 : 0);
  // Unix sockets have no Nagle to turn off; asking costs less than checking the family first.
  if (!r && (r.error() == std::errc::operation_not_supported ||
             r.error() == std::errc::no_protocol_option)) {
    return {};
  }
  return r;
}

}  // namespace spindle
