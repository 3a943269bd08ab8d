#include "spindle/net/tcp_server.h"

#include "spindle/base/log.h"
#include "spindle/fiber/this_fiber.h"

namespace spindle {
namespace {

void accept_loop(TcpListener listener, std::shared_ptr<const TcpServer::Handler> handler,
                 TcpServerOptions options) {
  auto last_warning = Clock::time_point{};
  for (;;) {
    auto stream = listener.accept();
    if (!stream) {
      std::error_code ec = stream.error();
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
    if (options.nodelay) (void)stream->set_nodelay(true);
    spawn([handler, s = std::move(*stream)]() mutable { (*handler)(std::move(s)); },
          SpawnOptions{.stack_size = options.stack_size})
        .detach();
  }
}

}  // namespace

Result<std::unique_ptr<TcpServer>> TcpServer::start(Runtime& runtime, const Address& address,
                                                    Handler handler, TcpServerOptions options) {
  if (Worker::current() == nullptr) runtime.start();
  Address bound = address;
  std::unique_ptr<TcpServer> server;
  for (std::size_t i = 0; i < runtime.size(); ++i) {
    // Each worker binds its own socket, so it is registered with that worker's reactor.
    auto listener = spawn_on(runtime.worker(i), [&]() -> Result<TcpListener> {
                      auto l = TcpListener::bind(bound, options.listen);
                      if (!l) return l;
                      // Port 0 resolved here: the other workers bind the same port.
                      auto local = l->local_address();
                      if (!local) return fail(local.error());
                      bound = *local;
                      return l;
                    }).join();
    if (!listener) {
      if (server) server->stop();
      return fail(listener.error());
    }
    if (i == 0) server.reset(new TcpServer(bound));
    // Per-worker copy: connection fibers share it without cross-core reference counting.
    auto worker_handler = std::make_shared<const Handler>(handler);
    server->acceptors_.push_back(spawn_on(
        runtime.worker(i),
        [l = std::move(*listener), worker_handler, options]() mutable {
          accept_loop(std::move(l), std::move(worker_handler), options);
        }));
  }
  return server;
}

void TcpServer::stop() {
  for (auto& acceptor : acceptors_) acceptor.request_stop();
  for (auto& acceptor : acceptors_) acceptor.join();
  acceptors_.clear();
}

}  // namespace spindle
