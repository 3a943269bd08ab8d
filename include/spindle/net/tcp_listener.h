#pragma once
/// TcpListener: a listening stream socket whose accept() parks the fiber.

#include "spindle/base/error.h"
#include "spindle/io/deadline.h"
#include "spindle/net/address.h"
#include "spindle/net/socket.h"
#include "spindle/net/tcp_stream.h"

namespace spindle {

/// How a listener is set up.
struct ListenOptions {
  /// listen(2) backlog (the kernel caps it at net.core.somaxconn).
  int backlog = 4096;
  /// SO_REUSEPORT, so that every worker can bind its own socket to the same port and the kernel
  /// spreads connections between them. Ignored for Unix sockets.
  bool reuse_port = true;
  /// With reuse_port: SO_REUSEPORT is set only after bind(), so that a socket another process
  /// holds on the address makes this bind fail with address_in_use instead of silently
  /// sharing its connections; sockets bound later with `exclusive` off (this process's other
  /// workers) join this one. Off: SO_REUSEPORT before bind, joining whatever is there.
  bool exclusive = true;
  /// SO_REUSEADDR, so that a restart can bind while old connections are in TIME_WAIT.
  bool reuse_address = true;
  /// TCP_NODELAY on the listener, which accepted connections inherit (no setsockopt each).
  bool nodelay = false;
  /// TCP_DEFER_ACCEPT: hand over a connection only once its first bytes arrived (or this many
  /// seconds passed), so the first read finds data. 0: off.
  int defer_accept_seconds = 0;
};

/// A bound, listening socket owned by one worker.
class TcpListener {
 public:
  TcpListener() = default;

  /// Binds and listens on `address` (port 0: the kernel picks one; see local_address()).
  /// Errors: std::errc::address_in_use, std::errc::permission_denied, ...
  [[nodiscard]] static Result<TcpListener> bind(const Address& address, ListenOptions options = {});
  /// A socket that is listening already (handed over by another process), registered with the
  /// calling worker.
  [[nodiscard]] static Result<TcpListener> adopt(UniqueFd fd);

  /// Waits for and returns the next connection (non-blocking, close-on-exec).
  /// Fails with std::errc::timed_out, std::errc::operation_canceled, or the kernel's error
  /// (std::errc::too_many_files_open when out of descriptors).
  [[nodiscard]] Result<TcpStream> accept(Deadline deadline = Deadline::never());
  /// Like accept(), but returns the bare descriptor, unregistered, so that another worker can
  /// adopt it (Socket::adopt); used when one listener feeds every worker.
  [[nodiscard]] Result<UniqueFd> accept_fd(Deadline deadline = Deadline::never());

  /// The bound address (with the real port).
  [[nodiscard]] Result<Address> local_address() const { return socket_.local_address(); }
  /// The descriptor.
  int fd() const { return socket_.fd(); }
  /// Stops listening. Idempotent.
  void close() { socket_.close(); }

 private:
  explicit TcpListener(Socket socket) : socket_(std::move(socket)) {}

  /// The registered socket.
  Socket socket_;
};

}  // namespace spindle
