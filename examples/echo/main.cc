// A TCP echo server on spindle: one acceptor per worker, one fiber per connection.
//
//   echo [ADDRESS] [WORKERS]     e.g.  echo 127.0.0.1:7000 2
//
// Prints "echo: listening on ADDRESS" once ready; SIGINT or SIGTERM stop it (exit code 0).
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "spindle/fiber/runtime.h"
#include "spindle/net/signal_set.h"
#include "spindle/net/tcp_server.h"

using namespace spindle;

static void echo(TcpStream stream) {
  char buffer[16 * 1024];
  for (;;) {
    auto n = stream.read(buffer);
    if (!n || *n == 0) return;  // error, peer closed, or the runtime is stopping
    if (!stream.write_all({buffer, *n})) return;
  }
}

int main(int argc, char** argv) {
  std::string_view text = argc > 1 ? argv[1] : "127.0.0.1:7000";
  auto address = Address::parse(text);
  if (!address) {
    fmt::print(stderr, "echo: bad address '{}': expected IPv4:PORT, [IPv6]:PORT or unix:PATH\n",
               text);
    return 2;
  }
  std::size_t workers = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 0;

  SignalSet signals{SIGINT, SIGTERM};  // before the runtime, so its threads inherit the mask
  Runtime runtime(RuntimeOptions{.workers = workers});
  auto server = TcpServer::start(runtime, *address, echo);
  if (!server) {
    fmt::print(stderr, "echo: cannot listen on {}: {}\n", text, server.error().message());
    return 1;
  }
  fmt::print("echo: listening on {} with {} workers\n", (*server)->address().to_string(),
             runtime.size());
  std::fflush(stdout);

  auto signal = runtime.block_on([&] { return signals.wait(); });
  fmt::print("echo: {}, stopping\n", signal ? strsignal(*signal) : signal.error().message());
  (*server)->stop();
  return 0;  // ~Runtime cancels the connection fibers and joins the workers
}
