#pragma once
/// TcpServer: one SO_REUSEPORT listener and one acceptor fiber per worker, and a fiber per
/// connection running the handler. It knows nothing of the protocol spoken.

#include <functional>
#include <memory>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/net/address.h"
#include "spindle/net/tcp_listener.h"
#include "spindle/net/tcp_stream.h"
#include "spindle/sync/event.h"

namespace spindle {

/// How a TcpServer accepts.
struct TcpServerOptions {
  /// Listener settings. With listen.reuse_port (the default) every worker has its own listener
  /// and the kernel spreads connections; without it, worker 0 accepts for all and hands the
  /// connections out round-robin.
  ListenOptions listen;
  /// TCP_NODELAY on every accepted connection (set once on the listeners, inherited).
  bool nodelay = true;
  /// Stack size of connection fibers (0: the runtime's default).
  std::size_t stack_size = 0;
};

/// Serves connections on every worker of a runtime.
class TcpServer {
 public:
  /// Runs once per connection, in its own fiber on the worker that accepted it. Copied once per
  /// worker; it must be safe to call from several workers at once.
  using Handler = std::function<void(TcpStream)>;

  /// Binds `address` on every worker of `runtime` (started if needed) and starts accepting.
  /// With port 0 the first worker's port is reused by the others. Call from outside the
  /// runtime's workers or from one of its fibers. Fails with the first bind error.
  ///
  /// `inherited`: sockets listening on `address` already (handed over by the process this one
  /// replaces, with the connections waiting in their queues): worker i accepts from the i-th
  /// instead of binding one; more of them than workers are spread over the workers.
  [[nodiscard]] static Result<std::unique_ptr<TcpServer>> start(
      Runtime& runtime, const Address& address, Handler handler, TcpServerOptions options = {},
      std::vector<UniqueFd> inherited = {});
  /// As start(), but nothing is accepted until accept_connections(): clients that connect
  /// meanwhile wait in the listeners' queues (as do those already in inherited ones). For a
  /// caller that must put in force what the handler reads before the first connection.
  [[nodiscard]] static Result<std::unique_ptr<TcpServer>> open(
      Runtime& runtime, const Address& address, Handler handler, TcpServerOptions options = {},
      std::vector<UniqueFd> inherited = {});
  /// Starts accepting on a server open() made (idempotent). Safe from any thread.
  void accept_connections() { accepting_->set(); }

  /// Stops accepting (waits for the acceptor fibers to end). Connections already accepted run
  /// on. Idempotent.
  void stop();
  /// stop().
  ~TcpServer() { stop(); }

  /// The bound address, with the real port.
  const Address& address() const { return address_; }
  /// The listening sockets (one per worker), to hand over to a process that replaces this
  /// one. Valid until stop().
  const std::vector<int>& listener_fds() const { return listener_fds_; }

 private:
  explicit TcpServer(Address address) : address_(std::move(address)) {}

  /// The bound address.
  Address address_;
  /// One acceptor per worker.
  std::vector<JoinHandle<void>> acceptors_;
  /// Set when the acceptors may accept (they wait for it first).
  std::shared_ptr<Event> accepting_ = std::make_shared<Event>();
  std::vector<int> listener_fds_;
};

}  // namespace spindle
