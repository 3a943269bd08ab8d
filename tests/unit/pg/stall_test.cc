// A backend that stops answering (SIGSTOP here; a dead network path in faults_test.cc) does not
// keep its connection: once a call on it gave up and the server stays silent for
// Options::cancel_grace, the connection is closed and the next call is served on another. TCP
// connections carry keepalives and a user timeout for what no call watches. (Issue 69, item 5.)
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "pg_testing.h"
#include "spindle/fiber/runtime.h"

using namespace std::chrono_literals;
using namespace spindle;
using spindle::testing::kDeadlineSlack;
using spindle::testing::pg_options;
using spindle::testing::pg_run;
using spindle::testing::WorkerProbe;

namespace {

using Clock = std::chrono::steady_clock;

// The options of this process's TCP sockets connected to 127.0.0.1:`port`: keepalive on,
// idle seconds, user timeout in ms; {-1, -1, -1} if there is none.
struct TcpOptions {
  int keepalive = -1, idle = -1, user_timeout = -1;
};

TcpOptions tcp_options_to(int port) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = std::stoi(entry.path().filename());
    sockaddr_in peer{};
    socklen_t n = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &n) != 0) continue;
    if (peer.sin_family != AF_INET || ntohs(peer.sin_port) != port) continue;
    TcpOptions o;
    socklen_t len = sizeof(int);
    ::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &o.keepalive, &len);
    ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &o.idle, &len);
    ::getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &o.user_timeout, &len);
    return o;
  }
  return {};
}

}  // namespace

TEST(PgStall, AStoppedBackendsConnectionIsClosedAfterTheGraceAndTheNextCallIsServed) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto options = pg_options(*postgres, 1);
  options.cancel_grace = 300ms;
  pg::Database db(runtime, options);
  int stopped = 0;
  runtime.block_on([&] {
    WorkerProbe probe;
    auto pid = db.query("SELECT pg_backend_pid()", {}, Deadline::after(5s));
    ASSERT_TRUE(pid.has_value()) << pid.error().message;
    stopped = *pid->get<int>(0, 0);
    ASSERT_EQ(::kill(stopped, SIGSTOP), 0);
    auto started = Clock::now();
    auto r = db.query("SELECT 1", {}, Deadline::after(200ms));
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, pg::Errc::kTimedOut);
    EXPECT_LT(Clock::now() - started, 200ms + kDeadlineSlack);
    // Calls meanwhile wait for a connection rather than pile onto the silent one; once the
    // grace is over it is closed and a new one serves them.
    auto next = db.query("SELECT 'served'", {}, Deadline::after(3s));
    ASSERT_TRUE(next.has_value()) << next.error().message;
    EXPECT_EQ(*next->get<std::string>(0, 0), "served");
    EXPECT_LT(Clock::now() - started, 200ms + 300ms + 1s);
    auto s = db.stats();
    EXPECT_EQ(s.evicted, 1u);
    EXPECT_EQ(s.opened, 2u);
    EXPECT_LT(probe.worst_ms(), 100);
  });
  ::kill(stopped, SIGCONT);
  pg_run(postgres->conninfo(), "SELECT pg_terminate_backend(" + std::to_string(stopped) + ")");
}

TEST(PgStall, AStatementWhoseCallerStillWaitsIsNeverCutShortForTheCallsBehindItThatGaveUp) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto options = pg_options(*postgres, 1);
  options.cancel_grace = 200ms;
  pg::Database db(runtime, options);
  runtime.block_on([&] {
    // A slow statement the server is busy with (as silent as a stopped one), calls behind it
    // that give up long before it ends: it is answered, and the connection stays.
    auto slow = db.start("SELECT pg_sleep(0.8), 'slow'");
    std::vector<pg::Query> behind;
    for (int i = 0; i < 3; ++i) behind.push_back(db.start("SELECT 1"));
    for (auto& q : behind)
      EXPECT_EQ(q.result(Deadline::after(50ms)).error().code, pg::Errc::kTimedOut);
    auto r = slow.result(Deadline::after(5s));
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(*r->get<std::string>(0, 1), "slow");
    ASSERT_TRUE(db.query("SELECT 2", {}, Deadline::after(5s)).has_value());
    EXPECT_EQ(db.stats().evicted, 0u);
    EXPECT_EQ(db.stats().opened, 1u);
  });
}

TEST(PgStall, TcpConnectionsKeepAliveAndBoundUnacknowledgedBytesUnlessTheConninfoSaysOtherwise) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::string tcp = "host=127.0.0.1 port=" + std::to_string(postgres->port()) +
                    " user=postgres dbname=postgres sslmode=disable";
  {
    pg::Database db(runtime, pg::Options{.conninfo = tcp, .connections = 1});
    runtime.block_on(
        [&] { ASSERT_TRUE(db.query("SELECT 1", {}, Deadline::after(5s)).has_value()); });
    TcpOptions o = tcp_options_to(postgres->port());
    EXPECT_EQ(o.keepalive, 1);
    EXPECT_EQ(o.idle, 30);
    EXPECT_EQ(o.user_timeout, 60000);
    runtime.block_on([&] { db.close(); });
  }
  pg::Database own(
      runtime,
      pg::Options{.conninfo = tcp + " keepalives_idle=7 tcp_user_timeout=9000", .connections = 1});
  runtime.block_on(
      [&] { ASSERT_TRUE(own.query("SELECT 1", {}, Deadline::after(5s)).has_value()); });
  TcpOptions o = tcp_options_to(postgres->port());
  EXPECT_EQ(o.idle, 7);
  EXPECT_EQ(o.user_timeout, 9000);
  runtime.block_on([&] { own.close(); });
}
