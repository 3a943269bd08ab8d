#pragma once
// Real services for tests, started by the test and stopped by PID: a throwaway PostgreSQL
// (tests/tools/postgres.sh: initdb into a temporary folder; a Unix socket, and 127.0.0.1 with
// TLS offered) and a Redis on a free loopback port. A machine without them makes the tests that
// need them skip, saying so.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "testing/testing.h"

namespace spindle::testing {

/// The first port of the kernel's ephemeral range: what it picks for an outgoing connection or
/// a bind to port 0 comes from there up.
inline int ephemeral_port_low() {
  int low = 32768, high = 0;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return low;
}

/// Binds a TCP socket to 127.0.0.1:`port` and closes it: the port bound (the kernel's pick for
/// port 0), or -1 if the bind failed.
inline int bind_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  socklen_t n = sizeof a;
  if (ok) ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ok ? int{ntohs(a.sin_port)} : -1;
}

/// A port on 127.0.0.1 that nothing holds now, for a service the test starts next. It is taken
/// below the kernel's ephemeral range: a port found free inside it can go to the next outgoing
/// connection or bind to port 0 before the service binds it ("Address already in use").
/// bench/ports.py is the same rule for the Python tests and the benchmarks.
inline int free_port() {
  constexpr int kFirst = 10000;
  const int low = ephemeral_port_low();
  if (low - kFirst < 2000) return bind_loopback(0);  // no room below the range: the kernel's pick
  std::mt19937 pick{std::random_device{}()};
  std::uniform_int_distribution<int> in_range{kFirst, low - 1};
  for (int tries = 0; tries < 1000; ++tries)
    if (int port = bind_loopback(in_range(pick)); port > 0) return port;
  ADD_FAILURE() << "no free port on 127.0.0.1 between " << kFirst << " and " << low;
  return bind_loopback(0);
}

/// Runs a shell command; its standard output (without the last newline) and exit status.
inline std::pair<std::string, int> run_command(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return {"", -1};
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, p) != nullptr) out += buffer;
  int status = ::pclose(p);
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

#ifdef SPINDLE_SOURCE_DIR
/// A PostgreSQL for tests: the one a ctest run shares (tests/CMakeLists.txt starts it as a
/// fixture and names its folder in SPINDLE_TEST_POSTGRES), else one of the test binary's own
/// (started on first use); or one of a test's own with server settings of its choosing.
class TestPostgres {
 public:
  /// The server, or nullptr if PostgreSQL is not installed (why() says so).
  static TestPostgres* get() {
    static std::unique_ptr<TestPostgres> server = [] {
      const char* shared = std::getenv("SPINDLE_TEST_POSTGRES");
      auto s = shared != nullptr ? adopt(shared) : start_own();
      if (s && s->conninfo_.empty()) {
        why_ = s->why_own_;
        return std::unique_ptr<TestPostgres>();
      }
      return s;
    }();
    return server.get();
  }
  /// A server of the caller's own, with more server settings ("-c max_connections=8"); stopped
  /// when it goes. Its conninfo() is empty if it did not start (why_not() says why).
  static std::unique_ptr<TestPostgres> start_own(const std::string& settings = "") {
    auto s = std::unique_ptr<TestPostgres>(new TestPostgres(make_temp_dir("spindle-pg")));
    s->port_ = static_cast<std::uint16_t>(free_port());
    auto [out, status] = run_command(script() + " start " + s->dir_ + " " +
                                     std::to_string(s->port_) + " '" + settings + "' 2>&1");
    if (status == 0) {
      s->conninfo_ = out.substr(out.rfind('\n') + 1);
    } else {
      s->why_own_ = status == 3 ? "PostgreSQL is not installed (apt-get install postgresql)"
                                : "PostgreSQL did not start: " + out;
    }
    return s;
  }
  /// Why get() is nullptr.
  static const std::string& why() { return why_; }
  /// Why a server of start_own() did not start.
  const std::string& why_not() const { return why_own_; }
  ~TestPostgres() {
    if (owned_) run_command(script() + " stop " + dir_);
  }
  /// "host=DIR port=PORT user=postgres dbname=postgres".
  const std::string& conninfo() const { return conninfo_; }
  /// Its TCP port on 127.0.0.1 (TLS offered, not required).
  int port() const { return port_; }
  /// The same server over TCP with TLS required (a throwaway self-signed certificate).
  std::string tls_conninfo() const {
    return "host=127.0.0.1 port=" + std::to_string(port_) +
           " user=postgres dbname=postgres sslmode=require";
  }

 private:
  explicit TestPostgres(std::string dir, bool owned = true) : dir_(std::move(dir)), owned_(owned) {}
  // The ctest run's server: its folder holds the conninfo and port, or why there is none.
  static std::unique_ptr<TestPostgres> adopt(const std::string& dir) {
    auto s = std::unique_ptr<TestPostgres>(new TestPostgres(dir, /*owned=*/false));
    auto read = [&](const char* name) { return run_command("cat " + dir + "/" + name).first; };
    s->conninfo_ = read("conninfo");
    s->port_ = static_cast<std::uint16_t>(std::atoi(read("port").c_str()));
    if (s->conninfo_.empty()) s->why_own_ = "no shared PostgreSQL: " + read("why");
    return s;
  }
  static std::string script() {
    return std::string(SPINDLE_SOURCE_DIR) + "/tests/tools/postgres.sh";
  }

  std::string dir_;
  bool owned_ = true;
  std::uint16_t port_ = 0;
  std::string conninfo_;
  std::string why_own_;
  static inline std::string why_;
};

/// Skips the test when there is no PostgreSQL, saying why; else the server.
#define REQUIRE_POSTGRES(server)                                                      \
  ::spindle::testing::TestPostgres* server = ::spindle::testing::TestPostgres::get(); \
  if (server == nullptr) GTEST_SKIP() << ::spindle::testing::TestPostgres::why()
#endif

/// A Redis on a free loopback port, for one test; stopped by PID when it goes.
class TestRedis {
 public:
  TestRedis() : port_(free_port()) {
    if (::access("/usr/bin/redis-server", X_OK) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      std::string port = std::to_string(port_);
      ::execl("/usr/bin/redis-server", "redis-server", "--port", port.c_str(), "--bind",
              "127.0.0.1", "--save", "", "--appendonly", "no", "--logfile", "/dev/null",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Ready once it accepts a connection.
    for (int i = 0; i < 200; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(port_));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      if (up) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~TestRedis() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  /// False if redis-server is not installed.
  bool running() const { return pid_ > 0; }
  int port() const { return port_; }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace spindle::testing
