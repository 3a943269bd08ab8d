// Load generator for echo servers: N connections, each a fiber that sends a message and waits
// for its echo, over and over, for a fixed time. Prints one JSON line with messages per second,
// and, given the server's PID, the server's CPU time per message (from /proc/PID/stat).
//
//   echo_load ADDRESS CONNECTIONS MESSAGE_BYTES SECONDS [SERVER_PID]
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/net/tcp_stream.h"

using namespace spindle;

namespace {

// utime + stime of a process, in seconds.
double cpu_seconds(long pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  auto close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close_paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
    if (i == 15) break;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    fmt::print(stderr, "usage: echo_load ADDRESS CONNECTIONS MESSAGE_BYTES SECONDS [SERVER_PID]\n");
    return 2;
  }
  auto address = Address::parse(argv[1]);
  if (!address) {
    fmt::print(stderr, "echo_load: bad address '{}'\n", argv[1]);
    return 2;
  }
  int connections = std::atoi(argv[2]);
  std::size_t size = std::strtoul(argv[3], nullptr, 10);
  double seconds = std::atof(argv[4]);
  long server_pid = argc > 5 ? std::atol(argv[5]) : 0;

  Runtime runtime(RuntimeOptions{.workers = 1});
  std::atomic<bool> measuring{false}, stop{false};
  std::atomic<long> messages{0}, errors{0};
  double cpu_before = 0, cpu_after = 0;
  auto elapsed = runtime.block_on([&] {
    std::vector<JoinHandle<void>> clients;
    for (int c = 0; c < connections; ++c) {
      clients.push_back(spawn([&] {
        auto stream = TcpStream::connect(*address, Deadline::after(std::chrono::seconds(10)));
        if (!stream) {
          ++errors;
          return;
        }
        std::vector<char> out(size, 'x'), in(size);
        long mine = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          auto deadline = Deadline::after(std::chrono::seconds(10));
          if (!stream->write_all(out, deadline) || !stream->read_exact(in, deadline)) {
            ++errors;
            return;
          }
          if (measuring.load(std::memory_order_relaxed)) ++mine;
        }
        messages += mine;
      }));
    }
    (void)this_fiber::sleep_for(std::chrono::milliseconds(500));  // warm-up
    cpu_before = cpu_seconds(server_pid);
    auto start = Clock::now();
    measuring = true;
    (void)this_fiber::sleep_for(std::chrono::duration<double>(seconds));
    measuring = false;
    auto took = std::chrono::duration<double>(Clock::now() - start).count();
    cpu_after = cpu_seconds(server_pid);
    stop = true;
    for (auto& c : clients) c.join();
    return took;
  });
  double rate = messages.load() / elapsed;
  double cpu_us = messages.load() > 0 ? (cpu_after - cpu_before) * 1e6 / messages.load() : 0;
  fmt::print(
      "{{\"connections\": {}, \"bytes\": {}, \"seconds\": {:.2f}, \"messages\": {}, "
      "\"messages_per_second\": {:.0f}, \"server_cpu_us_per_message\": {:.3f}, \"errors\": {}}}\n",
      connections, size, elapsed, messages.load(), rate, cpu_us, errors.load());
  return errors.load() == 0 ? 0 : 1;
}
