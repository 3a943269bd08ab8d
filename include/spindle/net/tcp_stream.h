#pragma once
/// TcpStream: a connected stream socket (TCP, or Unix-domain) for fibers. Every call tries the
/// syscall first and parks the fiber only on EAGAIN; every call takes a deadline and is
/// cancellable (std::errc::operation_canceled).

#include <sys/uio.h>

#include <cstddef>
#include <span>

#include "spindle/base/error.h"
#include "spindle/io/deadline.h"
#include "spindle/net/address.h"
#include "spindle/net/socket.h"

namespace spindle {

/// A connected stream. Move-only; closes on destruction. Owned by one worker.
class TcpStream {
 public:
  TcpStream() = default;
  /// Wraps an accepted or connected socket.
  explicit TcpStream(Socket socket) : socket_(std::move(socket)) {}

  /// Connects to `address`, giving up at `deadline` (std::errc::timed_out). Errors are the
  /// kernel's (std::errc::connection_refused, ...).
  [[nodiscard]] static Result<TcpStream> connect(const Address& address,
                                                 Deadline deadline = Deadline::never());

  /// Reads some bytes into `buffer`; 0 means the peer closed its side.
  [[nodiscard]] Result<std::size_t> read(std::span<char> buffer,
                                         Deadline deadline = Deadline::never());
  /// Reads exactly buffer.size() bytes; Errc::kEndOfStream if the peer closes first.
  [[nodiscard]] Result<void> read_exact(std::span<char> buffer,
                                        Deadline deadline = Deadline::never());
  /// Writes some (at least one) of `data`; returns how many bytes.
  [[nodiscard]] Result<std::size_t> write(std::span<const char> data,
                                          Deadline deadline = Deadline::never());
  /// Writes what the socket takes of `data` now, without waiting (outside a fiber too): how
  /// many bytes. Fewer than asked: the socket is full, or the write failed (the next says why).
  std::size_t write_now(std::span<const char> data);
  /// Writes all of `data`.
  [[nodiscard]] Result<void> write_all(std::span<const char> data,
                                       Deadline deadline = Deadline::never());
  /// Writes all of the buffers, in order, with as few sendmsg calls as the kernel allows (a
  /// single buffer goes by send). Returns the total written.
  [[nodiscard]] Result<std::size_t> writev(std::span<const iovec> buffers,
                                           Deadline deadline = Deadline::never());
  /// Sends `count` bytes of `file_fd` from `offset` with sendfile(2); stops early only at the
  /// end of the file. Returns the bytes sent.
  [[nodiscard]] Result<std::size_t> sendfile(int file_fd, off_t offset, std::size_t count,
                                             Deadline deadline = Deadline::never());

  /// Which direction shutdown() closes.
  enum class Shutdown { kRead = 0, kWrite = 1, kBoth = 2 };
  /// Half-closes the connection (kWrite sends FIN after the queued data).
  [[nodiscard]] Result<void> shutdown(Shutdown how);
  /// Turns Nagle's algorithm off (true) or on. A no-op success on Unix sockets.
  [[nodiscard]] Result<void> set_nodelay(bool on);

  /// The local address.
  [[nodiscard]] Result<Address> local_address() const { return socket_.local_address(); }
  /// The peer's address.
  [[nodiscard]] Result<Address> peer_address() const { return socket_.peer_address(); }
  /// The descriptor (for options spindle has no call for).
  int fd() const { return socket_.fd(); }
  /// True while open.
  bool is_open() const { return socket_.is_open(); }
  /// Closes the connection. Idempotent.
  void close() { socket_.close(); }
  /// Asks for `callback(slot)` to run once, on this worker's loop (not in a fiber), when the
  /// stream becomes readable while no fiber waits on it; `owner` is kept in slot.owner. Call
  /// only after a read returned EAGAIN (readiness is edge-triggered). Lets an idle
  /// connection wait without a fiber.
  void on_readable(void (*callback)(IoSlot& slot), void* owner) {
    socket_.on_readable(callback, owner);
  }
  /// Parks until the socket is ready in `direction`, for a layer above (TLS) whose own calls
  /// met EAGAIN.
  [[nodiscard]] std::error_code wait(IoDirection direction, Deadline deadline) {
    return socket_.wait(direction, deadline);
  }
  /// Wakes a fiber parked on the stream (its call fails with std::errc::operation_canceled):
  /// for work done on the stream's behalf outside that fiber whose outcome it must see.
  void cancel_waits() { socket_.cancel_waits(); }
  /// Cancels on_readable.
  void cancel_on_readable() { socket_.on_readable(nullptr, nullptr); }
  /// True if the last read found the socket empty and nothing has arrived since: a read would
  /// park (read() then waits without the system call), and an idle connection may be left to
  /// the reactor.
  bool drained() const { return socket_.drained(); }
  /// Waits until bytes (or the peer's close) arrive, without reading them: at once unless the
  /// last read found the socket empty (drained). A connection waits so when it holds no read
  /// buffer while idle.
  [[nodiscard]] Result<void> wait_readable(Deadline deadline) {
    if (!socket_.drained()) return {};
    if (auto ec = socket_.wait(IoDirection::kRead, deadline)) return fail(ec);
    return {};
  }
  /// For a layer above that reads the socket itself (OpenSSL): its read found it empty.
  void note_drained() { socket_.note_drained(); }
  /// True while on_readable is set and has not fired.
  bool on_readable_armed() const { return socket_.on_readable_armed(); }
  /// Bytes the kernel has taken for sending on this stream so far (whatever a later write
  /// did): a client that must know whether anything of a request can have reached its peer
  /// compares it before and after.
  std::uint64_t bytes_sent() const { return sent_; }
  /// For a layer above that writes the socket itself (OpenSSL): it wrote `n` bytes.
  void note_sent(std::size_t n) { sent_ += n; }

 private:
  /// The registered socket.
  Socket socket_;
  /// See bytes_sent().
  std::uint64_t sent_ = 0;
};

}  // namespace spindle
