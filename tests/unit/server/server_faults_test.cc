// The server when things go wrong inside it: a fiber that cannot start (no stack), handlers
// and body producers that throw what is not a std::exception. Each ends only what it must, and
// the server keeps serving, counting its connections right and draining promptly.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

#include "spindle/client/client.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/server/server.h"
#include "testing/http_testing.h"
#include "testing/raw_h2.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;
using spindle::testing::read_response;
using namespace std::string_view_literals;

namespace {

constexpr std::string_view kGet = "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n";

Router fault_router() {
  Router router;
  router.get("/ok", [](Request&) { return Response::text("ok"); });
  router.get("/slow", [](Request&) {
    (void)this_fiber::sleep_for(200ms);
    return Response::text("slow");
  });
  router.get("/text16k", [](Request&) { return Response::text(std::string(16000, 't')); });
  // Its answer made, the next fiber its worker starts fails to get a stack.
  router.get("/fail-next-spawn", [](Request&) {
    Worker::current()->stacks().fail_next_allocations(1);
    return Response::text("armed");
  });
  router.get("/throw-int", [](Request&) -> Response { throw 42; });
  router.get("/producer-throws", [](Request&) {
    Response r(200);
    r.stream = [](BodyWriter& body) {
      (void)body.write("first part\n");
      throw 42;  // not a std::exception
    };
    return r;
  });
  return router;
}

int port_of(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t size = sizeof a;
  int got = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &size)
                 : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size);
  return got == 0 && a.sin_family == AF_INET ? ntohs(a.sin_port) : -1;
}

// The server's end of `client` (same process): the descriptor whose peer is the client's port.
int server_end_of(const TcpStream& client) {
  int client_port = port_of(client.fd(), false);
  DIR* dir = ::opendir("/proc/self/fd");
  int found = -1;
  while (dirent* entry = ::readdir(dir)) {
    int fd = std::atoi(entry->d_name);
    if (fd != client.fd() && port_of(fd, true) == client_port) found = fd;
  }
  ::closedir(dir);
  return found;
}

// A connection to `address` whose receive buffer (and so the window it offers) is 4 KiB,
// set before it connects.
TcpStream connect_with_small_window(const Address& address) {
  int fd = ::socket(address.domain(), SOCK_STREAM, 0);
  int small = 4096;
  EXPECT_EQ(::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  EXPECT_EQ(::connect(fd, address.data(), address.size()), 0);  // loopback: at once
  EXPECT_EQ(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
  auto socket = Socket::adopt(UniqueFd(fd));
  EXPECT_TRUE(socket.has_value());
  return TcpStream(std::move(*socket));
}

// Waits up to a second for the server's connection count to reach `n`.
bool connections_become(const HttpServer& server, std::size_t n) {
  for (int i = 0; i < 100 && server.connections() != n; ++i) {
    (void)this_fiber::sleep_for(10ms);
  }
  return server.connections() == n;
}

}  // namespace

TEST(ServerFaults, AFailedRunnerSpawnAnswers503AndTheWorkerKeepsServingKeepAlive) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = spindle::testing::start_http_server(runtime, fault_router());
  runtime.block_on([&] {
    auto a = TcpStream::connect(server->address(), Deadline::after(5s));
    ASSERT_TRUE(a.has_value());
    ASSERT_TRUE(a->write_all(kGet).has_value());
    ASSERT_TRUE(read_response(*a).starts_with("HTTP/1.1 200"));
    // `a` is idle now. Its next request wakes it, and the fiber that would serve it cannot
    // get a stack.
    Worker::current()->stacks().fail_next_allocations(1);
    ASSERT_TRUE(a->write_all(kGet).has_value());
    std::string refused = read_response(*a, 2s);
    EXPECT_TRUE(refused.starts_with("HTTP/1.1 503")) << refused;
    EXPECT_TRUE(connections_become(*server, 0));
    // The worker goes on: a new connection, then its keep-alive requests, which need a
    // runner fiber again.
    auto b = TcpStream::connect(server->address(), Deadline::after(5s));
    ASSERT_TRUE(b.has_value());
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(b->write_all(kGet).has_value());
      std::string got = read_response(*b, 2s);
      EXPECT_TRUE(got.starts_with("HTTP/1.1 200")) << "request " << i << ": " << got;
    }
  });
  EXPECT_TRUE(server->drain(Deadline::after(1s)));
}

TEST(ServerFaults, AConnectionWokenToWriteTheRestOfAnAnswerClosesWhenNoFiberStarts) {
  // A woken connection's answers are written after its runner's batch; one its socket does
  // not take whole wakes the connection to write the rest. Should no fiber start for that, the
  // connection is refused as others are: the client sees a prefix of its answers and nothing
  // else (no 503 inside the answer's body), then the close, and the server uncounts it.
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = spindle::testing::start_http_server(runtime, fault_router());
  runtime.block_on([&] {
    TcpStream a = connect_with_small_window(server->address());
    int small = 4096;
    ASSERT_TRUE(a.write_all(kGet).has_value());
    ASSERT_TRUE(read_response(a).starts_with("HTTP/1.1 200"));
    // `a` is idle now. Its server end takes a few KiB at most, so the 16,000-byte answer is
    // written in part after the batch; the next request arms the failure of the fiber that
    // would write the rest.
    int end = server_end_of(a);
    ASSERT_GE(end, 0);
    ASSERT_EQ(::setsockopt(end, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
    ASSERT_TRUE(a.write_all("GET /text16k HTTP/1.1\r\nHost: x\r\n\r\n"
                            "GET /fail-next-spawn HTTP/1.1\r\nHost: x\r\n\r\n"sv)
                    .has_value());
    std::string got;
    char buffer[4096];
    for (;;) {
      auto n = a.read(buffer, Deadline::after(2s));
      ASSERT_TRUE(n.has_value()) << n.error().message() << " after " << got.size() << " bytes";
      if (*n == 0) break;
      got.append(buffer, *n);
    }
    EXPECT_TRUE(got.starts_with("HTTP/1.1 200")) << got.substr(0, 200);
    EXPECT_EQ(got.find("503"), std::string::npos);
    EXPECT_LT(got.size(), 16000u) << "the answer went whole: the test proves nothing";
    EXPECT_TRUE(connections_become(*server, 0));
  });
  EXPECT_TRUE(server->drain(Deadline::after(1s)));
}

TEST(ServerFaults, AFailedHandlerSpawnRefusesOnlyThatHttp2Stream) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server =
      spindle::testing::start_http_server(runtime, fault_router(), ServerOptions{.http2 = true});
  runtime.block_on([&] {
    auto c = spindle::testing::RawH2::connect(server->address());
    ASSERT_TRUE(c.has_value());
    // A slow stream keeps the connection busy (not idle: its reader and writer run), so the
    // next request's only spawn is its handler's.
    c->get(1, "/slow");
    (void)this_fiber::sleep_for(50ms);
    Worker::current()->stacks().fail_next_allocations(1);
    c->get(3, "/ok");
    auto refused = c->response(3);
    ASSERT_TRUE(refused.reset.has_value());
    EXPECT_EQ(*refused.reset, h2::ErrorCode::kRefusedStream);  // the client may send it again
    c->get(5, "/ok");
    EXPECT_EQ(c->response(5).body, "ok");
    EXPECT_EQ(c->response(1).body, "slow");
    EXPECT_EQ(server->connections(), 1u);
  });
  EXPECT_TRUE(server->drain(Deadline::after(1s)));
}

TEST(ServerFaults, NonStdExceptionsEndOnlyTheirRequestOnHttp1) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = spindle::testing::start_http_server(runtime, fault_router());
  runtime.block_on([&] {
    auto c = TcpStream::connect(server->address(), Deadline::after(5s));
    ASSERT_TRUE(c.has_value());
    ASSERT_TRUE(c->write_all("GET /throw-int HTTP/1.1\r\nHost: x\r\n\r\n"sv).has_value());
    EXPECT_TRUE(read_response(*c).starts_with("HTTP/1.1 500"));
    // The same connection goes on; then a producer throws mid-body: the head is gone, so the
    // connection ends without the last chunk (a truncation the client can see).
    ASSERT_TRUE(c->write_all("GET /producer-throws HTTP/1.1\r\nHost: x\r\n\r\n"sv).has_value());
    std::string got;
    char buffer[4096];
    while (auto n = c->read(buffer, Deadline::after(2s))) {
      if (*n == 0) break;
      got.append(buffer, *n);
    }
    EXPECT_NE(got.find("first part"), std::string::npos) << got;
    EXPECT_EQ(got.find("0\r\n\r\n"), std::string::npos) << got;
    EXPECT_TRUE(connections_become(*server, 0));
    EXPECT_TRUE(spindle::testing::exchange_raw(
                    server->address(), "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .starts_with("HTTP/1.1 200"));
  });
  auto start = Clock::now();
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
  EXPECT_LT(Clock::now() - start, 500ms);
}

TEST(ServerFaults, NonStdExceptionsEndOnlyTheirStreamOnHttp2) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server =
      spindle::testing::start_http_server(runtime, fault_router(), ServerOptions{.http2 = true});
  {
    HttpClient client(runtime, ClientOptions{.h2c_prior_knowledge = true, .request_timeout = 2s});
    std::string base = "http://127.0.0.1:" + std::to_string(server->address().port());
    runtime.block_on([&] {
      auto thrown = client.send({.url = base + "/throw-int"});
      ASSERT_TRUE(thrown.has_value());
      EXPECT_EQ(thrown->status, 500);
      auto cut = client.send({.url = base + "/producer-throws"});
      EXPECT_FALSE(cut.has_value());  // reset, never presented as a complete body
      auto ok = client.send({.url = base + "/ok"});
      ASSERT_TRUE(ok.has_value()) << ok.error().message();
      EXPECT_EQ(ok->body, "ok");
      EXPECT_EQ(server->connections(), 1u);  // all on one connection, which goes on
    });
  }
  runtime.block_on([&] { EXPECT_TRUE(connections_become(*server, 0)); });
  auto start = Clock::now();
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
  EXPECT_LT(Clock::now() - start, 500ms);
}
