#include "spindle/net/tcp_server.h"

#include <algorithm>

#include "spindle/base/log.h"
#include "spindle/fiber/this_fiber.h"

namespace spindle {
namespace {

// Starts the handler for one connection in a fiber on `worker`.
void serve_connection(Worker& worker, UniqueFd fd,
                      std::shared_ptr<const TcpServer::Handler> handler,
                      const TcpServerOptions& options) {
  auto fiber = spawn_on(
      worker,
      [handler = std::move(handler), fd = std::move(fd)]() mutable {
        auto socket = Socket::adopt(std::move(fd));
        if (!socket) {
          log_warn("cannot register an accepted connection: {}", socket.error().message());
          return;
        }
        (*handler)(TcpStream(std::move(*socket)));
      },
      SpawnOptions{.stack_size = options.stack_size});
  // Without a stack the connection is closed unserved (its descriptor went with the fiber's
  // callable); the worker has logged why, once for all of them.
  if (fiber.finished()) {
    try {
      fiber.join();
    } catch (...) {
    }
  }
}

// Accepts once `accepting` is set, until cancelled. Connections go to `workers` round-robin
// (just this worker when each worker has its own listener).
void accept_loop(TcpListener listener, std::shared_ptr<const TcpServer::Handler> handler,
                 TcpServerOptions options, std::vector<Worker*> workers,
                 const std::shared_ptr<Event>& accepting) {
  if (accepting->wait()) return;  // cancelled before it was told to accept
  auto last_warning = Clock::time_point{};
  std::size_t next = 0;
  for (;;) {
    auto fd = listener.accept_fd();
    if (!fd) {
      std::error_code ec = fd.error();
      if (ec == std::errc::operation_canceled) return;
      if (ec == std::errc::connection_aborted || ec == std::errc::interrupted) continue;
      auto now = Clock::now();
      if (now - last_warning > std::chrono::seconds(1)) {
        last_warning = now;
        auto local = listener.local_address();
        log_warn("accept on {}: {}; pausing accepts for 10 ms",
                 local ? local->to_string() : std::string("?"), ec.message());
      }
      // Out of descriptors or memory: that clears as connections close. Anything else is
      // unexpected, but must not become a busy loop either.
      if (this_fiber::sleep_for(std::chrono::milliseconds(10))) return;
      continue;
    }
    serve_connection(*workers[next++ % workers.size()], std::move(*fd), handler, options);
  }
}

}  // namespace

Result<std::unique_ptr<TcpServer>> TcpServer::start(Runtime& runtime, const Address& address,
                                                    Handler handler, TcpServerOptions options,
                                                    std::vector<UniqueFd> inherited) {
  auto server =
      open(runtime, address, std::move(handler), std::move(options), std::move(inherited));
  if (server) (*server)->accept_connections();
  return server;
}

Result<std::unique_ptr<TcpServer>> TcpServer::open(Runtime& runtime, const Address& address,
                                                   Handler handler, TcpServerOptions options,
                                                   std::vector<UniqueFd> inherited) {
  if (Worker::current() == nullptr) runtime.start();
  options.listen.nodelay = options.listen.nodelay || options.nodelay;
  Address bound = address;
  std::unique_ptr<TcpServer> server;
  // Without SO_REUSEPORT only one socket can bind the port: worker 0 accepts for everyone.
  const bool per_worker = options.listen.reuse_port;
  std::vector<Worker*> all_workers;
  for (std::size_t i = 0; i < runtime.size(); ++i) all_workers.push_back(&runtime.worker(i));
  const std::size_t listeners = std::max(per_worker ? runtime.size() : 1, inherited.size());
  for (std::size_t i = 0; i < listeners; ++i) {
    Worker& worker = runtime.worker(i % runtime.size());
    // Each worker binds (or adopts) its own socket, so it is registered with that worker's
    // reactor.
    // The first socket binds alone, so that another process on the address is "in use";
    // the other workers' sockets join it (and inherited ones, handed over by our
    // predecessor, are joined the same way).
    ListenOptions listen = options.listen;
    listen.exclusive = i == 0 && inherited.empty();
    auto listener = spawn_on(worker, [&]() -> Result<TcpListener> {
                      auto l = i < inherited.size() ? TcpListener::adopt(std::move(inherited[i]))
                                                    : TcpListener::bind(bound, listen);
                      if (!l) return l;
                      // Port 0 resolved here: the other workers bind the same port.
                      auto local = l->local_address();
                      if (!local) return fail(local.error());
                      bound = *local;
                      return l;
                    }).join();
    if (!listener) {
      // An inherited socket without SO_REUSEPORT leaves no room for more: the inherited ones
      // accept for every worker they reach.
      if (!inherited.empty() && i >= inherited.size()) {
        log_warn("{}: only the {} inherited listener(s) accept ({})", bound.to_string(),
                 inherited.size(), listener.error().message());
        break;
      }
      if (server) server->stop();
      return fail(listener.error());
    }
    if (i == 0) server.reset(new TcpServer(bound));
    server->listener_fds_.push_back(listener->fd());
    // Per-worker copy: connection fibers share it without cross-core reference counting.
    auto worker_handler = std::make_shared<const Handler>(handler);
    std::vector<Worker*> targets = per_worker ? std::vector<Worker*>{&worker} : all_workers;
    server->acceptors_.push_back(spawn_on(worker, [l = std::move(*listener), worker_handler,
                                                   options, targets,
                                                   accepting = server->accepting_]() mutable {
      accept_loop(std::move(l), std::move(worker_handler), options, std::move(targets), accepting);
    }));
  }
  return server;
}

void TcpServer::stop() {
  for (auto& acceptor : acceptors_) acceptor.request_stop();
  for (auto& acceptor : acceptors_) acceptor.join();
  acceptors_.clear();
  listener_fds_.clear();
}

}  // namespace spindle
