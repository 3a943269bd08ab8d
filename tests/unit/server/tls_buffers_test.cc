// OpenSSL's record buffers on the server's TLS connections (about 34 KiB a connection): kept
// from record to record while a connection is busy, given back at the worker's trim once it
// has read and written nothing for a second or two, whether it is idle or a request of it
// waits in its handler; taken again by the next read or write. (With SSL_MODE_RELEASE_BUFFERS,
// OpenSSL's own giving back around every record, the connections hold nothing when the test
// first looks, and it fails as it does when the trim gives nothing back.)
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/net/tls.h"
#include "spindle/server/server.h"
#include "spindle/sync/event.h"
#include "spindle/sync/wait_group.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;

namespace {

std::shared_ptr<const TlsServerContext> server_context() {
  const std::string& d = spindle::testing::test_cert_dir();
  auto ctx = TlsServerContext::create(TlsServerOptions{
      .certificates = {{d + "/localhost.pem", d + "/localhost.key", {}}}, .alpn = {"http/1.1"}});
  EXPECT_TRUE(ctx.has_value()) << ctx.error();
  return *ctx;
}

std::shared_ptr<const TlsClientContext> client_context() {
  auto ctx = TlsClientContext::create(
      TlsClientOptions{.ca_file = spindle::testing::test_cert_dir() + "/ca.pem"});
  EXPECT_TRUE(ctx.has_value()) << ctx.error();
  return *ctx;
}

}  // namespace

TEST(TlsBuffers, AConnectionWhoseRequestWaitsGivesItsBuffersBackOnceQuiet) {
  // One worker: the server's connections, the clients and the test share it, so nothing runs
  // between two looks at the heap but what the test waits for.
  constexpr int kConnections = 20;
  Runtime runtime(RuntimeOptions{.workers = 1});
  Event go_on;
  WaitGroup waiting;
  Router router;
  router.get("/wait", [&](Request&) {
    waiting.done();
    (void)go_on.wait(Deadline::after(20s));
    return Response::text("after the wait");
  });
  ServerOptions options;
  options.tls = server_context();
  auto server = HttpServer::start(runtime, Address::loopback_v4(0), std::move(router), options);
  ASSERT_TRUE(server.has_value());
  const Address address = (*server)->address();
  runtime.block_on([&] {
    // Each connection's request reaches the handler and waits there: the connections are not
    // idle, and hold OpenSSL's buffers from their handshake and request.
    auto client = client_context();
    std::vector<TlsStream> clients;
    waiting.add(kConnections);
    for (int i = 0; i < kConnections; ++i) {
      auto tcp = TcpStream::connect(address, Deadline::after(5s));
      ASSERT_TRUE(tcp.has_value());
      auto tls = TlsStream::connect(std::move(*tcp), client, "localhost", Deadline::after(5s));
      ASSERT_TRUE(tls.has_value()) << tls.error().message();
      ASSERT_TRUE(tls->write_all(std::string_view("GET /wait HTTP/1.1\r\nHost: localhost\r\n\r\n"),
                                 Deadline::after(5s)));
      clients.push_back(std::move(*tls));
    }
    ASSERT_FALSE(waiting.wait(Deadline::after(10s)));
    const std::size_t busy = spindle::testing::heap_in_use();

    // Quiet for two of the worker's trims (a second apart): the first sees them quiet since
    // its look before, the second gives their buffers back.
    std::size_t freed = 0;
    for (int i = 0; i < 40 && freed < kConnections * 24 * 1024; ++i) {
      (void)this_fiber::sleep_for(100ms);
      const std::size_t now = spindle::testing::heap_in_use();
      freed = busy > now ? busy - now : 0;
    }
    EXPECT_GE(freed, kConnections * 24 * 1024)
        << "the heap went from " << busy << " to " << busy - freed << " bytes";

    // The buffers come back for the responses: every client gets its whole answer.
    go_on.set();
    for (TlsStream& tls : clients) {
      std::string got;
      char buffer[4096];
      while (got.find("after the wait") == std::string::npos) {
        auto n = tls.read(buffer, Deadline::after(5s));
        if (!n || *n == 0) break;
        got.append(buffer, *n);
      }
      EXPECT_TRUE(got.starts_with("HTTP/1.1 200 OK\r\n")) << got;
      EXPECT_NE(got.find("after the wait"), std::string::npos) << got;
    }
  });
  (*server)->stop();
}
