#include "spindle/net/tls.h"

#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/net/tcp_listener.h"
#include "spindle/sync/event.h"
#include "spindle/sync/wait_group.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;

namespace {

const std::string& cert_dir() { return spindle::testing::test_cert_dir(); }

std::shared_ptr<const TlsServerContext> server_context(std::vector<std::string> alpn = {
                                                           "h2", "http/1.1"}) {
  const std::string& d = cert_dir();
  auto ctx = TlsServerContext::create(
      TlsServerOptions{.certificates = {{d + "/localhost.pem", d + "/localhost.key", {}},
                                        {d + "/other.pem", d + "/other.key", {}}},
                       .alpn = std::move(alpn)});
  EXPECT_TRUE(ctx.has_value()) << ctx.error();
  return *ctx;
}

std::shared_ptr<const TlsClientContext> client_context(TlsClientOptions options = {}) {
  if (options.ca_file.empty() && !options.insecure) options.ca_file = cert_dir() + "/ca.pem";
  auto ctx = TlsClientContext::create(std::move(options));
  EXPECT_TRUE(ctx.has_value()) << ctx.error();
  return *ctx;
}

// A listener whose accepted connections run `serve` on their own fibers. Its destructor
// stops accepting and waits for those fibers, so a test's locals declared before the server
// (which `serve` may touch) outlive them even when an assertion ends the test early.
struct TlsTestServer {
  TcpListener listener;
  Address address;
  WaitGroup serving;
  JoinHandle<void> acceptor;

  template <typename Fn>
  explicit TlsTestServer(Fn serve, int connections = 1)
      : listener(TcpListener::bind(Address::loopback_v4(0)).value()),
        address(listener.local_address().value()) {
    acceptor = spawn([this, serve, connections] {
      for (int i = 0; i < connections; ++i) {
        auto stream = listener.accept(Deadline::after(10s));
        if (!stream) return;
        serving.add();
        spawn([this, serve, s = std::move(*stream)]() mutable {
          serve(std::move(s));
          serving.done();
        }).detach();
      }
    });
  }
  ~TlsTestServer() {
    acceptor.request_stop();
    acceptor.join();
    (void)serving.wait(Deadline::never(), kNotCancellable);
  }
};

// Accepts TLS and echoes what it reads until the peer closes. One context for all, as a
// server has (tickets are sealed with its keys).
void echo(TcpStream tcp) {
  static const auto context = server_context();
  auto tls = TlsStream::accept(std::move(tcp), context, Deadline::after(5s));
  if (!tls) return;
  char buffer[4096];
  for (;;) {
    auto n = tls->read(buffer, Deadline::after(5s));
    if (!n || *n == 0) return;
    if (!tls->write_all(std::span<const char>(buffer, *n), Deadline::after(5s))) return;
  }
}

Result<TlsStream> connect_to(const Address& address, std::string_view name,
                             std::shared_ptr<const TlsClientContext> client) {
  auto tcp = TcpStream::connect(address, Deadline::after(5s));
  if (!tcp) return fail(tcp.error());
  return TlsStream::connect(std::move(*tcp), std::move(client), name, Deadline::after(5s));
}

std::string read_n(TlsStream& tls, std::size_t n) {
  std::string out;
  char buffer[8192];
  while (out.size() < n) {
    auto got = tls.read(buffer, Deadline::after(5s));
    if (!got || *got == 0) break;
    out.append(buffer, *got);
  }
  return out;
}

}  // namespace

FIBER_TEST(Tls, HandshakesVerifiesAndCarriesBytesBothWays) {
  TlsTestServer server(echo);
  auto client =
      connect_to(server.address, "localhost", client_context({.alpn = {"h2", "http/1.1"}}));
  ASSERT_TRUE(client.has_value()) << client.error().message();
  EXPECT_EQ(client->alpn(), "h2");
  EXPECT_EQ(client->version(), "TLSv1.3");
  // Many small pieces gathered into records, then a large one.
  std::vector<std::string> pieces;
  std::vector<iovec> iov;
  for (int i = 0; i < 100; ++i) pieces.push_back("piece " + std::to_string(i) + ";");
  pieces.push_back(std::string(100'000, 'z'));
  std::string all;
  for (auto& p : pieces) {
    iov.push_back({p.data(), p.size()});
    all += p;
  }
  auto written = client->writev(iov, Deadline::after(5s));
  ASSERT_TRUE(written.has_value());
  EXPECT_EQ(*written, all.size());
  EXPECT_EQ(read_n(*client, all.size()), all);
}

FIBER_TEST(Tls, SniPicksTheCertificateForTheName) {
  TlsTestServer server(echo, 3);
  // *.other.test is only on the second certificate: verification passes only if SNI chose it.
  auto other = connect_to(server.address, "www.other.test", client_context());
  ASSERT_TRUE(other.has_value()) << other.error().message();
  auto local = connect_to(server.address, "localhost", client_context());
  ASSERT_TRUE(local.has_value()) << local.error().message();
  // An unknown name gets the first certificate, which does not match it.
  auto unknown = connect_to(server.address, "unknown.test", client_context());
  EXPECT_FALSE(unknown.has_value());
}

FIBER_TEST(Tls, ClientsRefuseUntrustedServersUnlessInsecure) {
  TlsTestServer server(echo, 2);
  // The system store does not know the test CA.
  auto refused = connect_to(server.address, "localhost",
                            client_context({.ca_file = "/etc/ssl/certs/ca-certificates.crt"}));
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().category(), tls_category());
  auto insecure = connect_to(server.address, "localhost", client_context({.insecure = true}));
  EXPECT_TRUE(insecure.has_value());
}

FIBER_TEST(Tls, AlpnWithNoCommonProtocolIsRefused) {
  TlsTestServer server(echo);
  auto client = connect_to(server.address, "localhost", client_context({.alpn = {"spdy/3"}}));
  EXPECT_FALSE(client.has_value());
}

FIBER_TEST(Tls, ASecondConnectionResumesTheSession) {
  TlsTestServer server(echo, 2);
  auto client_ctx = client_context();
  for (int i = 0; i < 2; ++i) {
    auto client = connect_to(server.address, "localhost", client_ctx);
    ASSERT_TRUE(client.has_value()) << client.error().message();
    EXPECT_EQ(client->session_reused(), i == 1);
    // A round trip, so that the TLS 1.3 ticket (sent after the handshake) arrives.
    ASSERT_TRUE(client->write_all(std::string_view("ping"), Deadline::after(5s)));
    EXPECT_EQ(read_n(*client, 4), "ping");
  }
}

// drained() lets the HTTP/1 driver wait for the next request without a read that would only
// say EAGAIN; it must never claim a drained socket that still holds bytes (the wait would hang).
FIBER_TEST(Tls, DrainedOnlyWhenTheSocketHoldsNothing) {
  constexpr std::size_t kSize = 60'000;  // several records, more than one socket read takes
  struct Seen {
    bool after_first = true;
    int drained_with_bytes_left = 0;
    bool after_would_block = false;
    std::size_t total = 0;
    Event done;
  } seen;
  TlsTestServer server([&seen](TcpStream tcp) {
    auto tls = TlsStream::accept(std::move(tcp), server_context(), Deadline::after(5s));
    if (tls) {
      this_fiber::sleep_for(200ms);  // the whole upload waits in the socket
      char buffer[1024];
      while (seen.total < kSize) {
        auto n = tls->read(buffer, Deadline::after(5s));
        if (!n || *n == 0) break;
        if (seen.total == 0) seen.after_first = tls->drained();
        seen.total += *n;
        char peek;
        if (tls->drained() && ::recv(tls->fd(), &peek, 1, MSG_PEEK | MSG_DONTWAIT) > 0) {
          ++seen.drained_with_bytes_left;
        }
      }
      // Everything read: one more read would block, which proves the socket drained.
      auto more = tls->read(buffer, Deadline::after(50ms));
      seen.after_would_block = !more && more.error() == std::errc::timed_out && tls->drained();
    }
    seen.done.set();
  });
  auto client = connect_to(server.address, "localhost", client_context());
  ASSERT_TRUE(client.has_value()) << client.error().message();
  ASSERT_TRUE(client->write_all(std::string(kSize, 'd'), Deadline::after(5s)));
  ASSERT_FALSE(seen.done.wait(Deadline::after(10s)));
  EXPECT_EQ(seen.total, kSize);
  EXPECT_FALSE(seen.after_first);  // the first socket read filled OpenSSL's buffer
  EXPECT_EQ(seen.drained_with_bytes_left, 0);
  EXPECT_TRUE(seen.after_would_block);
}

// A client reads through its own read-ahead (tls.cc, ReadAheadBio): many small records sent
// at once arrive whole and in order, held bytes count as pending, and the stream says drained
// only once the socket and the held bytes are both empty.
FIBER_TEST(Tls, AClientReadsManySmallRecordsAheadAndInOrder) {
  constexpr int kRecords = 600;
  constexpr std::size_t kRecord = 100;
  auto record = [](int i) {
    std::string r = std::to_string(i);
    r.resize(kRecord, static_cast<char>('a' + i % 26));
    return r;
  };
  Event sent;
  TlsTestServer server([&](TcpStream tcp) {
    auto tls = TlsStream::accept(std::move(tcp), server_context(), Deadline::after(5s));
    if (!tls) return;
    for (int i = 0; i < kRecords; ++i) {  // one TLS record each
      if (!tls->write_all(record(i), Deadline::after(5s))) return;
    }
    sent.set();
    char byte;
    (void)tls->read({&byte, 1}, Deadline::after(5s));  // until the client closes
  });
  auto client = connect_to(server.address, "localhost", client_context());
  ASSERT_TRUE(client.has_value()) << client.error().message();
  ASSERT_FALSE(sent.wait(Deadline::after(10s)));
  this_fiber::sleep_for(100ms);  // all of it waits in the socket
  // The first record, whole: OpenSSL holds nothing more, the rest is held ahead.
  std::string got(kRecord, '\0');
  auto first = client->read(got, Deadline::after(5s));
  ASSERT_TRUE(first.has_value()) << first.error().message();
  ASSERT_EQ(*first, kRecord);
  EXPECT_TRUE(client->has_pending());
  EXPECT_FALSE(client->drained());
  int drained_with_bytes_left = 0;
  char buffer[kRecord / 3 + 1];  // reads smaller than a record, never aligned with one
  while (got.size() < kRecords * kRecord) {
    auto n = client->read(buffer, Deadline::after(5s));
    ASSERT_TRUE(n.has_value()) << n.error().message();
    ASSERT_GT(*n, 0u);
    got.append(buffer, *n);
    char peek;
    if (client->drained() && ::recv(client->fd(), &peek, 1, MSG_PEEK | MSG_DONTWAIT) > 0) {
      ++drained_with_bytes_left;
    }
  }
  std::string expected;
  for (int i = 0; i < kRecords; ++i) expected += record(i);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(drained_with_bytes_left, 0);
  auto more = client->read(buffer, Deadline::after(50ms));
  EXPECT_TRUE(!more && more.error() == std::errc::timed_out);
  EXPECT_TRUE(client->drained());
  EXPECT_FALSE(client->has_pending());
}

FIBER_TEST(Tls, PlainTextAndStalledHandshakesFail) {
  bool plain_failed = false, stalled_timed_out = false;
  auto context = server_context();
  TlsTestServer server(
      [&](TcpStream tcp) {
        auto start = Clock::now();
        auto tls = TlsStream::accept(std::move(tcp), context, Deadline::after(300ms));
        if (tls) return;
        if (tls.error() == std::errc::timed_out) {
          stalled_timed_out = Clock::now() - start >= 250ms;
        } else {
          plain_failed = Clock::now() - start < 250ms;  // at once, not at the deadline
        }
      },
      2);
  auto plain = TcpStream::connect(server.address, Deadline::after(5s));
  ASSERT_TRUE(plain.has_value());
  ASSERT_TRUE(plain->write_all(std::string_view("GET / HTTP/1.1\r\nHost: x\r\n\r\n")));
  auto stalled = TcpStream::connect(server.address, Deadline::after(5s));
  ASSERT_TRUE(stalled.has_value());
  (void)this_fiber::sleep_for(600ms);
  EXPECT_TRUE(plain_failed);
  EXPECT_TRUE(stalled_timed_out);
}

TEST(Tls, ConfigurationErrorsNameTheFile) {
  auto missing = TlsServerContext::create(
      TlsServerOptions{.certificates = {{"/nonexistent/cert.pem", "/nonexistent/key.pem", {}}}});
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().find("/nonexistent/cert.pem"), std::string::npos) << missing.error();
  const std::string& d = cert_dir();
  auto mismatch = TlsServerContext::create(
      TlsServerOptions{.certificates = {{d + "/localhost.pem", d + "/other.key", {}}}});
  ASSERT_FALSE(mismatch.has_value());
  EXPECT_NE(mismatch.error().find("other.key"), std::string::npos) << mismatch.error();
  EXPECT_NE(mismatch.error().find("mismatch"), std::string::npos) << mismatch.error();
  EXPECT_FALSE(TlsServerContext::create(TlsServerOptions{}).has_value());
}

// Whether the kernel has the "tls" upper-layer protocol loaded, as it lists them.
bool kernel_lists_tls() {
  std::ifstream ulps("/proc/sys/net/ipv4/tcp_available_ulp");
  std::string ulp;
  bool listed = false;
  while (ulps >> ulp) listed = listed || ulp == "tls";
  return listed;
}

FIBER_TEST(Tls, KtlsEngagesOnlyWhereTheKernelOffersIt) {
  TlsTestServer server(echo);
  auto client = connect_to(server.address, "localhost", client_context());
  ASSERT_TRUE(client.has_value());
  // Asked after the contexts were made: asking may have loaded the module.
  bool kernel_tls = kernel_lists_tls();
  EXPECT_EQ(kernel_offers_ktls(), kernel_tls);
  std::printf("kTLS: kernel %s the tls ULP; this connection's sends are %s\n",
              kernel_tls ? "offers" : "does not offer",
              client->ktls_send() ? "kernel-encrypted" : "encrypted by OpenSSL");
  // OpenSSL engages kTLS for this connection's cipher (TLS 1.3, AES-GCM) on every kernel with
  // the tls module; without the module it cannot.
  EXPECT_EQ(client->ktls_send(), kernel_tls);
  // Either way the bytes get through.
  ASSERT_TRUE(client->write_all(std::string_view("via ktls?"), Deadline::after(5s)));
  EXPECT_EQ(read_n(*client, 9), "via ktls?");
}

TEST(Tls, ContextsAskOpenSslForKtlsOnlyWhereTheKernelOffersIt) {
  // Else every handshake ends with a system call the kernel refuses (ENOENT), on both sides.
  const std::uint64_t wanted = kernel_offers_ktls() ? SSL_OP_ENABLE_KTLS : 0;
  const std::string& d = cert_dir();
  auto server = TlsServerContext::create(
      TlsServerOptions{.certificates = {{d + "/localhost.pem", d + "/localhost.key", {}}}});
  ASSERT_TRUE(server.has_value()) << server.error();
  EXPECT_EQ(SSL_CTX_get_options((*server)->default_context()) & SSL_OP_ENABLE_KTLS, wanted);
  auto off = TlsServerContext::create(TlsServerOptions{
      .certificates = {{d + "/localhost.pem", d + "/localhost.key", {}}}, .ktls = false});
  ASSERT_TRUE(off.has_value()) << off.error();
  EXPECT_EQ(SSL_CTX_get_options((*off)->default_context()) & SSL_OP_ENABLE_KTLS, 0u);
  auto client = TlsClientContext::create();
  ASSERT_TRUE(client.has_value()) << client.error();
  EXPECT_EQ(SSL_CTX_get_options((*client)->native()) & SSL_OP_ENABLE_KTLS, wanted);
}

FIBER_TEST(Tls, TwoWritersParkedOnOneWorkerEachSendOnlyTheirOwnBytes) {
  // Small records, so that one gathered write is many records and a full socket stops it
  // midway; small socket buffers, so that both writers park. While one waits, the other
  // gathers its own pieces: each peer must receive exactly its writer's bytes.
  const std::string& d = cert_dir();
  auto context = TlsServerContext::create(TlsServerOptions{
      .certificates = {{d + "/localhost.pem", d + "/localhost.key", {}}}, .max_record_size = 512});
  ASSERT_TRUE(context.has_value()) << context.error();
  auto listener = TcpListener::bind(Address::loopback_v4(0));
  ASSERT_TRUE(listener.has_value());
  Address address = listener->local_address().value();
  constexpr std::size_t kPiece = 100, kPieces = 4000;  // 400 KB per writer
  auto pattern = [](int writer, std::size_t i) {
    return static_cast<char>((writer == 0 ? 'a' : 'A') + (i / kPiece + i) % 26);
  };
  std::vector<TlsStream> clients, servers;
  for (int i = 0; i < 2; ++i) {
    auto client = spawn([&] { return connect_to(address, "localhost", client_context()); });
    auto tcp = listener->accept(Deadline::after(5s));
    ASSERT_TRUE(tcp.has_value());
    int small = 16384;
    ASSERT_EQ(::setsockopt(tcp->fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
    auto server = TlsStream::accept(std::move(*tcp), *context, Deadline::after(5s));
    ASSERT_TRUE(server.has_value());
    auto c = client.join();
    ASSERT_TRUE(c.has_value());
    ASSERT_EQ(::setsockopt(c->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
    clients.push_back(std::move(*c));
    servers.push_back(std::move(*server));
  }
  std::vector<std::string> data(2);
  std::vector<std::vector<iovec>> pieces(2);
  for (int w = 0; w < 2; ++w) {
    data[w].resize(kPiece * kPieces);
    for (std::size_t i = 0; i < data[w].size(); ++i) data[w][i] = pattern(w, i);
    for (std::size_t p = 0; p < kPieces; ++p) pieces[w].push_back({&data[w][p * kPiece], kPiece});
  }
  std::vector<JoinHandle<Result<std::size_t>>> writers;
  for (int w = 0; w < 2; ++w) {
    writers.push_back(spawn([&, w] { return servers[w].writev(pieces[w], Deadline::after(20s)); }));
  }
  (void)this_fiber::sleep_for(50ms);  // both writers are parked on full sockets by now
  std::vector<JoinHandle<std::string>> readers;
  for (int w = 0; w < 2; ++w) {
    readers.push_back(spawn([&, w] { return read_n(clients[w], data[w].size()); }));
  }
  for (int w = 0; w < 2; ++w) {
    auto written = writers[w].join();
    ASSERT_TRUE(written.has_value()) << written.error().message();
    std::string got = readers[w].join();
    ASSERT_EQ(got.size(), data[w].size());
    std::size_t first_bad = 0;
    while (first_bad < got.size() && got[first_bad] == data[w][first_bad]) ++first_bad;
    EXPECT_EQ(first_bad, got.size()) << "writer " << w << ": first wrong byte at " << first_bad;
  }
}

// OpenSSL's record buffers: a client's context gives them back after records (the write
// buffer after each write); keep_buffers() keeps them from record to record, so that
// release_buffers() then has the write buffer (~17 KiB) more to free; the stream goes on
// either way.
TEST(Tls, AStreamKeepsItsBuffersBetweenRecordsOnlyWhenAsked) {
  spindle::testing::run_in_fiber(
      [] {
        TlsTestServer server(echo);
        auto client = connect_to(server.address, "localhost", client_context());
        ASSERT_TRUE(client.has_value()) << client.error().message();
        auto exchange = [&](std::string_view text) {
          ASSERT_TRUE(client->write_all(text, Deadline::after(5s)));
          EXPECT_EQ(read_n(*client, text.size()), text);
        };
        // What release_buffers() frees after an exchange.
        auto held_after = [&](std::string_view text) {
          exchange(text);
          const std::size_t before = spindle::testing::heap_in_use();
          EXPECT_TRUE(client->release_buffers());
          return before - spindle::testing::heap_in_use();
        };
        const std::size_t given_back = held_after("given back after records");
        client->keep_buffers();
        const std::size_t kept = held_after("kept from record to record");
        EXPECT_GE(kept, given_back + 12 * 1024) << given_back << " and " << kept << " bytes";
        exchange("taken again");
      },
      1);
}
