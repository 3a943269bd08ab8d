#include "spindle/net/tcp_listener.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace spindle {

Result<TcpListener> TcpListener::bind(const Address& address, ListenOptions options) {
  auto socket = Socket::open(address.domain(), SOCK_STREAM);
  if (!socket) return fail(socket.error());
  if (address.family() != Address::Family::kUnix) {
    if (options.reuse_address) {
      if (auto r = socket->set_option(SOL_SOCKET, SO_REUSEADDR, 1); !r) return fail(r.error());
    }
    if (options.reuse_port && !options.exclusive) {
      if (auto r = socket->set_option(SOL_SOCKET, SO_REUSEPORT, 1); !r) return fail(r.error());
    }
    if (options.nodelay) {
      if (auto r = socket->set_option(IPPROTO_TCP, TCP_NODELAY, 1); !r) return fail(r.error());
    }
    if (options.defer_accept_seconds > 0) {
      if (auto r = socket->set_option(IPPROTO_TCP, TCP_DEFER_ACCEPT, options.defer_accept_seconds);
          !r) {
        return fail(r.error());
      }
    }
  }
  if (::bind(socket->fd(), address.data(), address.size()) != 0) return fail_errno();
  // Bound alone: now others of ours may join (the group forms at listen()).
  if (options.reuse_port && options.exclusive && address.family() != Address::Family::kUnix) {
    if (auto r = socket->set_option(SOL_SOCKET, SO_REUSEPORT, 1); !r) return fail(r.error());
  }
  if (::listen(socket->fd(), options.backlog) != 0) return fail_errno();
  return TcpListener(std::move(*socket));
}

Result<TcpListener> TcpListener::adopt(UniqueFd fd) {
  // A socket from elsewhere (systemd's are blocking) must not block the worker in accept.
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || (!(flags & O_NONBLOCK) && ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) < 0)) {
    return fail_errno();
  }
  auto socket = Socket::adopt(std::move(fd));
  if (!socket) return fail(socket.error());
  return TcpListener(std::move(*socket));
}

Result<UniqueFd> TcpListener::accept_fd(Deadline deadline) {
  auto fd = socket_.retry(IoDirection::kRead, deadline, [&] {
    return static_cast<ssize_t>(
        ::accept4(socket_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  });
  if (!fd) return fail(fd.error());
  return UniqueFd(static_cast<int>(*fd));
}

Result<TcpStream> TcpListener::accept(Deadline deadline) {
  auto fd = accept_fd(deadline);
  if (!fd) return fail(fd.error());
  auto socket = Socket::adopt(std::move(*fd));
  if (!socket) return fail(socket.error());
  return TcpStream(std::move(*socket));
}

}  // namespace spindle
