#include "spindle/net/socket.h"

#include <sys/socket.h>

#include <cassert>

#include "spindle/fiber/worker.h"

namespace spindle {

Result<Socket> Socket::adopt(UniqueFd fd) {
  Worker* worker = Worker::current();
  if (!worker) return fail(std::errc::operation_not_permitted);
  auto slot = worker->reactor().add(fd.get());
  if (!slot) return fail(slot.error());
  Socket socket;
  socket.fd_ = std::move(fd);
  socket.slot_ = *slot;
  socket.worker_ = worker;
  return socket;
}

Result<Socket> Socket::open(int domain, int type) {
  UniqueFd fd(::socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return fail_errno();
  return adopt(std::move(fd));
}

Socket::Socket(Socket&& other) noexcept
    : fd_(std::move(other.fd_)),
      slot_(std::exchange(other.slot_, nullptr)),
      worker_(std::exchange(other.worker_, nullptr)) {}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::move(other.fd_);
    slot_ = std::exchange(other.slot_, nullptr);
    worker_ = std::exchange(other.worker_, nullptr);
  }
  return *this;
}

void Socket::close() {
  if (slot_) {
    assert(Worker::current() == worker_ && "a socket must be closed on its own worker");
    // A fiber still parked on it gets operation_canceled instead of waiting forever.
    spindle::cancel_waits(*slot_);
    worker_->reactor().release(slot_);
    slot_ = nullptr;
  }
  fd_.reset();
}

namespace {

// getsockname or getpeername into an Address.
Result<Address> socket_name(int fd, int (*call)(int, sockaddr*, socklen_t*)) {
  sockaddr_storage storage{};
  socklen_t length = sizeof storage;
  if (call(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) return fail_errno();
  return Address::from_sockaddr(reinterpret_cast<sockaddr*>(&storage), length);
}

}  // namespace

Result<Address> Socket::local_address() const { return socket_name(fd_.get(), ::getsockname); }

Result<Address> Socket::peer_address() const { return socket_name(fd_.get(), ::getpeername); }

Result<void> Socket::set_option(int level, int name, int value) {
  if (::setsockopt(fd_.get(), level, name, &value, sizeof value) != 0) return fail_errno();
  return {};
}

}  // namespace spindle
