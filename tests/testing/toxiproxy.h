#pragma once
// Toxiproxy (Shopify's fault-injection TCP proxy) for the C++ fault tests, as
// tests/integration/toxiproxy.py is for the Python ones: a server of the test's own on a free
// loopback port (built by scripts/install-toxiproxy.sh when missing, stopped by its PID), proxies
// between a client and a real server, and toxics added and removed over its HTTP API while
// traffic flows. Plain blocking sockets, on a thread of their own when called on a fiber: usable
// from any thread, fiber or not, without holding a worker.
//
//   REQUIRE_TOXIPROXY(toxiproxy);
//   auto pg = toxiproxy->proxy("pg", "127.0.0.1:" + std::to_string(postgres->port()));
//   auto stall = toxiproxy->add(pg, "timeout", R"({"timeout": 0})");   // bytes swallowed
//   toxiproxy->remove(pg, stall);          // (which closes the connections it stalled)
//   toxiproxy->set_enabled(pg, false);     // connections refused, same port after
//
// Toxics: latency {latency, jitter}, bandwidth {rate} (KB/s), slow_close {delay}, timeout
// {timeout} (ms; 0: never closes), reset_peer {timeout}, slicer {average_size, size_variation,
// delay}, limit_data {bytes}; each on "downstream" (server to client) or "upstream".

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "spindle/fiber/worker.h"
#include "spindle/sync/event.h"
#include "testing/services.h"

namespace spindle::testing {

#ifdef SPINDLE_SOURCE_DIR
class TestToxiproxy {
 public:
  /// One proxy: 127.0.0.1:port forwards to its upstream.
  struct Proxy {
    std::string name;
    int port = 0;
  };

  /// A server of the caller's own, or nullptr: then skip() says whether that is because Go is
  /// not installed (the test skips) and why() what happened.
  static std::unique_ptr<TestToxiproxy> start() {
    std::string binary = std::string(SPINDLE_SOURCE_DIR) + "/build/tools/toxiproxy-server";
    if (::access(binary.c_str(), X_OK) != 0) {
      auto [out, status] =
          run_command(std::string(SPINDLE_SOURCE_DIR) + "/scripts/install-toxiproxy.sh 2>&1");
      if (status != 0) {
        skip_ = status == 3;  // install-toxiproxy.sh: Go is not installed
        why_ = "Toxiproxy could not be built: " + out;
        return nullptr;
      }
    }
    auto server = std::unique_ptr<TestToxiproxy>(new TestToxiproxy(binary));
    if (!server->up()) {
      why_ = "toxiproxy-server did not answer on port " + std::to_string(server->port_);
      return nullptr;
    }
    return server;
  }
  static bool skip() { return skip_; }
  static const std::string& why() { return why_; }

  ~TestToxiproxy() {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }

  /// A new proxy to `upstream` ("127.0.0.1:5432") on a free port (kept across set_enabled).
  Proxy proxy(const std::string& name, const std::string& upstream) {
    Proxy p{name, free_port()};
    expect_ok(call("POST", "/proxies",
                   R"({"name":")" + name + R"(","listen":"127.0.0.1:)" + std::to_string(p.port) +
                       R"(","upstream":")" + upstream + R"("})"));
    return p;
  }
  /// Adds a toxic of `type` with `attributes` (a JSON object); returns its name.
  std::string add(const Proxy& p, const std::string& type, const std::string& attributes,
                  const std::string& stream = "downstream", double toxicity = 1.0) {
    std::string name = type + "_" + stream + "_" + std::to_string(++toxics_);
    expect_ok(call("POST", "/proxies/" + p.name + "/toxics",
                   R"({"name":")" + name + R"(","type":")" + type + R"(","stream":")" + stream +
                       R"(","toxicity":)" + std::to_string(toxicity) + R"(,"attributes":)" +
                       attributes + "}"));
    return name;
  }
  void remove(const Proxy& p, const std::string& toxic) {
    expect_ok(call("DELETE", "/proxies/" + p.name + "/toxics/" + toxic));
  }
  /// Disabled: the listener is closed and every connection through it too (refused).
  void set_enabled(const Proxy& p, bool enabled) {
    expect_ok(call("PATCH", "/proxies/" + p.name,
                   std::string(R"({"enabled":)") + (enabled ? "true" : "false") + "}"));
  }
  /// Every proxy enabled, every toxic removed.
  void reset() { expect_ok(call("POST", "/reset")); }

  /// One API call: the HTTP status (0 if it could not be made) and the body. On a fiber it is
  /// made on a thread of its own while the fiber parks: Toxiproxy takes tens of milliseconds
  /// over some calls (a removal closes connections), which would show as the worker's.
  std::pair<int, std::string> call(const std::string& method, const std::string& path,
                                   const std::string& body = "") const {
    if (Worker::current() == nullptr) return exchange(method, path, body);
    std::pair<int, std::string> answer;
    Event done;
    std::thread helper([&] {
      answer = exchange(method, path, body);
      done.set();
    });
    (void)done.wait(Deadline::never(), kNotCancellable);
    helper.join();
    return answer;
  }

 private:
  std::pair<int, std::string> exchange(const std::string& method, const std::string& path,
                                       const std::string& body) const {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return {0, ""};
    }
    std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                          "Content-Type: application/json\r\nConnection: close\r\n" +
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    for (std::size_t at = 0; at < request.size();) {
      ssize_t n = ::send(fd, request.data() + at, request.size() - at, MSG_NOSIGNAL);
      if (n <= 0) break;
      at += static_cast<std::size_t>(n);
    }
    std::string answer;
    char buffer[4096];
    for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) answer.append(buffer, n);
    ::close(fd);
    if (answer.compare(0, 9, "HTTP/1.1 ") != 0) return {0, answer};
    std::size_t head_end = answer.find("\r\n\r\n");
    return {std::atoi(answer.c_str() + 9),
            head_end == std::string::npos ? "" : answer.substr(head_end + 4)};
  }
  explicit TestToxiproxy(const std::string& binary) : port_(free_port()) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      std::string port = std::to_string(port_);
      ::execl(binary.c_str(), "toxiproxy-server", "-host", "127.0.0.1", "-port", port.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  bool up() const {
    for (int i = 0; i < 500; ++i) {
      if (call("GET", "/version").first == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  static void expect_ok(const std::pair<int, std::string>& answer) {
    EXPECT_GE(answer.first, 200) << answer.second;
    EXPECT_LT(answer.first, 300) << answer.second;
  }

  int port_;
  pid_t pid_ = -1;
  int toxics_ = 0;
  static inline bool skip_ = false;
  static inline std::string why_;
};

/// A Toxiproxy of the test's own in `server`; the test skips, saying why, only when Go is not
/// installed, and fails when the server could not be built or started.
#define REQUIRE_TOXIPROXY(server)                             \
  auto server = ::spindle::testing::TestToxiproxy::start();   \
  if (!server && ::spindle::testing::TestToxiproxy::skip())   \
    GTEST_SKIP() << ::spindle::testing::TestToxiproxy::why(); \
  ASSERT_TRUE(server != nullptr) << ::spindle::testing::TestToxiproxy::why()
#endif

}  // namespace spindle::testing
