#pragma once
/// Socket: a non-blocking descriptor registered once with the calling worker's reactor; the
/// common part of TcpStream and TcpListener.
///
/// A socket belongs to the worker that created it: use and destroy it on that worker's fibers.

#include <sys/types.h>

#include <cerrno>

#include "spindle/base/error.h"
#include "spindle/fiber/io_wait.h"
#include "spindle/io/deadline.h"
#include "spindle/io/reactor.h"
#include "spindle/io/unique_fd.h"
#include "spindle/net/address.h"

namespace spindle {

class Worker;

/// An owned, reactor-registered, non-blocking socket. Move-only.
class Socket {
 public:
  Socket() = default;
  /// Registers `fd` (already non-blocking) with the calling worker's reactor and owns it.
  /// Fails with std::errc::operation_not_permitted outside a worker, or epoll_ctl's error.
  [[nodiscard]] static Result<Socket> adopt(UniqueFd fd);
  /// A new non-blocking, close-on-exec socket of `domain` and `type`, registered.
  [[nodiscard]] static Result<Socket> open(int domain, int type);

  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  ~Socket() { close(); }

  /// The descriptor, or -1.
  int fd() const { return fd_.get(); }
  /// True while open.
  bool is_open() const { return static_cast<bool>(fd_); }
  /// Unregisters and closes. A fiber parked on the socket wakes with
  /// std::errc::operation_canceled. Idempotent.
  void close();

  /// The local address (getsockname).
  [[nodiscard]] Result<Address> local_address() const;
  /// The peer address (getpeername).
  [[nodiscard]] Result<Address> peer_address() const;
  /// Sets (or with nullptr clears) the slot's readable callback (see TcpStream::on_readable).
  void on_readable(void (*callback)(IoSlot& slot), void* owner) {
    if (!slot_) return;
    slot_->on_readable = callback;
    slot_->owner = owner;
  }
  /// True if the last read found nothing more and nothing has arrived since (IoSlot::drained).
  bool drained() const { return slot_ && slot_->drained; }
  /// Notes that a read just found the socket empty.
  void note_drained() {
    if (slot_ && !slot_->hung_up) slot_->drained = true;
  }
  /// True while a readable callback is set and has not fired (nothing has arrived since).
  bool on_readable_armed() const { return slot_ && slot_->on_readable != nullptr; }
  /// Parks until the socket is ready in `direction` (after an operation reported EAGAIN).
  [[nodiscard]] std::error_code wait(IoDirection direction, Deadline deadline) {
    if (!slot_) return std::make_error_code(std::errc::bad_file_descriptor);
    return wait_ready(*slot_, direction, deadline);
  }
  /// Parks until the socket is readable, offering `ahead` to be read into as the worker wakes
  /// this fiber (after a read reported EAGAIN).
  [[nodiscard]] std::error_code wait_to_read(ReadAhead& ahead, Deadline deadline) {
    if (!slot_) return std::make_error_code(std::errc::bad_file_descriptor);
    return wait_ready(*slot_, IoDirection::kRead, deadline, &ahead);
  }
  /// Wakes the fibers parked on the socket: their wait returns std::errc::operation_canceled.
  void cancel_waits() {
    if (slot_) spindle::cancel_waits(*slot_);
  }
  /// setsockopt(level, name, int value).
  [[nodiscard]] Result<void> set_option(int level, int name, int value);

  /// Runs `op` (a syscall returning >= 0 or -1 with errno) until it succeeds or fails for a
  /// reason other than EINTR/EAGAIN; on EAGAIN parks until the socket is ready in `direction`.
  template <typename Op>
  [[nodiscard]] Result<ssize_t> retry(IoDirection direction, Deadline deadline, Op&& op);

 private:
  /// The descriptor.
  UniqueFd fd_;
  /// The reactor registration, or nullptr.
  IoSlot* slot_ = nullptr;
  /// The worker whose reactor holds the registration.
  Worker* worker_ = nullptr;
};

template <typename Op>
Result<ssize_t> Socket::retry(IoDirection direction, Deadline deadline, Op&& op) {
  if (!slot_) return fail(std::errc::bad_file_descriptor);
  for (;;) {
    ssize_t n = op();
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return fail_errno();
    if (direction == IoDirection::kRead) note_drained();
    if (auto ec = wait_ready(*slot_, direction, deadline)) return fail(ec);
  }
}

}  // namespace spindle
