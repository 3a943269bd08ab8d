// The echo example over real sockets: 1,000 concurrent client fibers each send 1 MiB through it
// and check every byte that comes back.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <string>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/net/tcp_stream.h"
#include "spindle/sync/wait_group.h"
#include "testing/subprocess.h"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

constexpr int kClients = 1000;
constexpr std::size_t kBytesPerClient = 1 << 20;
constexpr std::size_t kChunk = 16 * 1024;

char pattern(int client, std::size_t offset) {
  return static_cast<char>((client * 131 + offset * 7 + offset / 4096) & 0xff);
}

// Writes the client's pattern; returns an empty string or what went wrong.
std::string send_pattern(TcpStream& stream, int client, Deadline deadline) {
  std::vector<char> chunk(kChunk);
  for (std::size_t sent = 0; sent < kBytesPerClient; sent += kChunk) {
    for (std::size_t i = 0; i < kChunk; ++i) chunk[i] = pattern(client, sent + i);
    if (auto r = stream.write_all(chunk, deadline); !r) return "write: " + r.error().message();
  }
  if (auto r = stream.shutdown(TcpStream::Shutdown::kWrite); !r)
    return "shutdown: " + r.error().message();
  return {};
}

// Reads the echo back and checks every byte; returns an empty string or the first mismatch.
std::string check_echo(TcpStream& stream, int client, Deadline deadline) {
  std::vector<char> buffer(kChunk);
  std::size_t received = 0;
  for (;;) {
    auto n = stream.read(buffer, deadline);
    if (!n) return "read: " + n.error().message();
    if (*n == 0) break;
    for (std::size_t i = 0; i < *n; ++i) {
      if (buffer[i] != pattern(client, received + i)) {
        return "byte " + std::to_string(received + i) + " differs";
      }
    }
    received += *n;
  }
  if (received != kBytesPerClient) return "got " + std::to_string(received) + " bytes";
  return {};
}

std::string run_client(const Address& server, int client, Deadline deadline) {
  auto stream = TcpStream::connect(server, deadline);
  if (!stream) return "connect: " + stream.error().message();
  std::string write_error;
  // Write and read at once: the echo cannot buffer 1 MiB, so one direction must not wait for
  // the other.
  auto writer = spawn([&] { write_error = send_pattern(*stream, client, deadline); });
  std::string read_error = check_echo(*stream, client, deadline);
  writer.join();
  return !write_error.empty() ? write_error : read_error;
}

}  // namespace

TEST(EchoIntegration, ThousandClientsEachSendOneMebibyteAndGetEveryByteBack) {
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < kClients + 100) {
    if (files.rlim_max < kClients + 100) {
      GTEST_SKIP() << "needs " << kClients + 100 << " open files; ulimit -n hard limit is "
                   << files.rlim_max;
    }
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  spindle::testing::Subprocess echo({SPINDLE_ECHO_BINARY, "127.0.0.1:0", "2"});
  ASSERT_TRUE(echo.started());
  auto banner = echo.read_line();
  ASSERT_TRUE(banner.has_value()) << "echo exited before listening";
  const std::string prefix = "echo: listening on ";
  ASSERT_TRUE(banner->starts_with(prefix)) << *banner;
  auto server = Address::parse(
      banner->substr(prefix.size(), banner->find(' ', prefix.size()) - prefix.size()));
  ASSERT_TRUE(server.has_value()) << *banner;

  Runtime runtime(RuntimeOptions{.workers = 2});
  std::vector<std::string> errors = runtime.block_on([&] {
    auto deadline = Deadline::after(120s);
    std::vector<std::string> failures(kClients);
    std::vector<JoinHandle<void>> clients;
    for (int c = 0; c < kClients; ++c) {
      auto& worker = runtime.worker(c % runtime.size());
      clients.push_back(
          spawn_on(worker, [&, c] { failures[c] = run_client(*server, c, deadline); }));
    }
    for (auto& c : clients) c.join();
    return failures;
  });

  int failed = 0;
  for (int c = 0; c < kClients; ++c) {
    if (!errors[c].empty() && failed++ < 5) ADD_FAILURE() << "client " << c << ": " << errors[c];
  }
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(echo.stop(SIGTERM, 10s), 0) << "echo did not stop cleanly on SIGTERM";
}

TEST(EchoIntegration, BadAddressIsReportedWithTheAcceptedForms) {
  spindle::testing::Subprocess echo({SPINDLE_ECHO_BINARY, "localhost:80"});
  ASSERT_TRUE(echo.started());
  EXPECT_FALSE(echo.read_line().has_value());  // nothing on stdout: it never listened
  EXPECT_EQ(echo.stop(0, 10s), 2);
}
