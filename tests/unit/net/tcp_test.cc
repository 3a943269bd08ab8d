#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/net/resolver.h"
#include "spindle/net/tcp_listener.h"
#include "spindle/net/tcp_server.h"
#include "spindle/net/tcp_stream.h"
#include "spindle/sync/wait_group.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;

namespace {

// A connected client/server pair on loopback, both owned by the calling worker.
struct Connection {
  TcpStream client, server;
};

Connection connect_pair() {
  auto listener = TcpListener::bind(Address::loopback_v4(0));
  EXPECT_TRUE(listener.has_value());
  auto address = listener->local_address().value();
  auto client = TcpStream::connect(address, Deadline::after(5s));
  EXPECT_TRUE(client.has_value());
  auto server = listener->accept(Deadline::after(5s));
  EXPECT_TRUE(server.has_value());
  return {std::move(*client), std::move(*server)};
}

std::string text_of(std::span<const char> s) { return std::string(s.data(), s.size()); }

}  // namespace

FIBER_TEST(TcpStream, WriteAllThenReadExactMovesTheBytes) {
  auto [client, server] = connect_pair();
  std::string message = "hello, spindle";
  ASSERT_TRUE(client.write_all(message).has_value());
  std::vector<char> got(message.size());
  ASSERT_TRUE(server.read_exact(got, Deadline::after(5s)).has_value());
  EXPECT_EQ(text_of(got), message);
}

FIBER_TEST(TcpStream, ReadReturnsZeroWhenThePeerCloses) {
  auto [client, server] = connect_pair();
  client.close();
  char buffer[16];
  auto n = server.read(buffer, Deadline::after(5s));
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(*n, 0u);
}

FIBER_TEST(TcpStream, ReadExactReportsEndOfStreamWhenThePeerClosesEarly) {
  auto [client, server] = connect_pair();
  ASSERT_TRUE(client.write_all(std::string_view("abc")).has_value());
  client.close();
  char buffer[10];
  auto r = server.read_exact(buffer, Deadline::after(5s));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), make_error_code(Errc::kEndOfStream));
}

// A short read marks the stream drained, so the next read waits for the reactor instead of
// asking the kernel; the peer's next bytes clear it.
FIBER_TEST(TcpStream, AShortReadMarksTheStreamDrainedUntilMoreArrives) {
  auto [client, server] = connect_pair();
  ASSERT_TRUE(client.write_all(std::string_view("abc")).has_value());
  char buffer[16];
  auto n = server.read(buffer, Deadline::after(5s));
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(*n, 3u);
  EXPECT_TRUE(server.drained());
  ASSERT_TRUE(client.write_all(std::string_view("defg")).has_value());
  n = server.read(buffer, Deadline::after(5s));  // parks, then the reactor wakes it
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(text_of({buffer, *n}), "defg");
}

// The bytes and the FIN arrive together and the reactor reports them (no fiber waiting) before
// the read: no further edge will come, so the short read must not leave the stream waiting for
// one. The next read sees the end at once.
FIBER_TEST(TcpStream, BytesAndCloseSeenByTheReactorFirstStillEndTheStream) {
  auto [client, server] = connect_pair();
  ASSERT_TRUE(client.write_all(std::string_view("abc")).has_value());
  client.close();
  ASSERT_FALSE(this_fiber::sleep_for(50ms));  // the worker polls meanwhile
  char buffer[16];
  auto n = server.read(buffer, Deadline::after(5s));
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(*n, 3u);
  EXPECT_FALSE(server.drained());
  auto start = Clock::now();
  n = server.read(buffer, Deadline::after(2s));
  ASSERT_TRUE(n.has_value()) << n.error().message();
  EXPECT_EQ(*n, 0u);
  EXPECT_LT(Clock::now() - start, 1s);
}

// Readers parked on drained streams offer their buffers (ReadAhead): the worker reads each
// woken stream's bytes as it wakes its fiber, all of one poll's before any of those fibers
// runs. The first of them to run finds the others' bytes already out of the kernel.
FIBER_TEST(TcpStream, TheReadsOfTheFibersOnePollWakesAreMadeBeforeAnyRuns) {
  constexpr int kStreams = 3;
  std::vector<Connection> pairs;
  for (int i = 0; i < kStreams; ++i) pairs.push_back(connect_pair());
  std::vector<int> unread_seen_first(kStreams, -1);
  bool first = true;
  std::vector<JoinHandle<std::string>> readers;
  for (int i = 0; i < kStreams; ++i) {
    readers.push_back(spawn([&, i] {
      char buffer[16];
      auto n = pairs[i].server.read(buffer, Deadline::after(5s));
      if (!n) return std::string("error");
      if (std::exchange(first, false)) {
        for (int j = 0; j < kStreams; ++j) {
          int queued = -1;
          ::ioctl(pairs[j].server.fd(), FIONREAD, &queued);
          unread_seen_first[j] = queued;
        }
      }
      return std::string(buffer, *n);
    }));
  }
  ASSERT_FALSE(this_fiber::sleep_for(20ms));  // each parked, its stream marked drained
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(pairs[i].server.drained());
    ASSERT_TRUE(pairs[i].client.write_all("stream " + std::to_string(i)).has_value());
  }
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(readers[i].join(), "stream " + std::to_string(i));
  EXPECT_EQ(unread_seen_first, std::vector<int>(kStreams, 0)) << "bytes left in the kernel";
}

// A read the worker makes for a parked fiber reports the kernel's error as the fiber's would.
FIBER_TEST(TcpStream, AResetSeenByAParkedReadIsItsError) {
  auto [client, server] = connect_pair();
  auto reader = spawn([&] {
    char buffer[16];
    auto n = server.read(buffer, Deadline::after(5s));
    return n ? std::error_code() : n.error();
  });
  ASSERT_FALSE(this_fiber::sleep_for(20ms));
  ASSERT_TRUE(server.drained());
  linger abort{.l_onoff = 1, .l_linger = 0};
  ASSERT_EQ(::setsockopt(client.fd(), SOL_SOCKET, SO_LINGER, &abort, sizeof abort), 0);
  client.close();  // a reset, not a FIN
  EXPECT_EQ(reader.join(), std::errc::connection_reset);
}

FIBER_TEST(TcpStream, ReadTimesOutAtTheDeadline) {
  auto [client, server] = connect_pair();
  char buffer[16];
  auto start = Clock::now();
  auto n = server.read(buffer, Deadline::after(20ms));
  ASSERT_FALSE(n.has_value());
  EXPECT_EQ(n.error(), std::errc::timed_out);
  EXPECT_GE(Clock::now() - start, 20ms);
  // The stream is still usable after a timeout.
  ASSERT_TRUE(client.write_all(std::string_view("x")).has_value());
  EXPECT_EQ(server.read(buffer, Deadline::after(5s)).value(), 1u);
}

FIBER_TEST(TcpStream, CancellingABlockedReadReturnsOperationCanceled) {
  auto pair = connect_pair();
  auto reader = spawn([&] {
    char buffer[16];
    return pair.server.read(buffer).error();
  });
  (void)this_fiber::sleep_for(5ms);
  reader.request_stop();
  EXPECT_EQ(reader.join(), std::errc::operation_canceled);
}

FIBER_TEST(TcpStream, ReadAndWriteWaitAtOnceOnOneStream) {
  auto pair = connect_pair();
  // One fiber parks reading, another parks writing more than the socket buffers hold.
  auto reader = spawn([&] {
    char buffer[4];
    return pair.client.read(buffer, Deadline::after(10s));
  });
  std::vector<char> big(8 << 20, 'z');
  auto writer = spawn([&] { return pair.client.write_all(big, Deadline::after(10s)); });
  (void)this_fiber::sleep_for(10ms);
  ASSERT_TRUE(pair.server.write_all(std::string_view("ping")).has_value());
  EXPECT_EQ(reader.join().value(), 4u);
  std::vector<char> sink(64 * 1024);
  std::size_t drained = 0;
  while (drained < big.size()) drained += pair.server.read(sink, Deadline::after(10s)).value();
  EXPECT_TRUE(writer.join().has_value());
  EXPECT_EQ(drained, big.size());
}

FIBER_TEST(TcpStream, WritevSendsEveryBufferInOrderEvenWhenThePeerIsSlow) {
  auto pair = connect_pair();
  std::vector<std::string> parts = {std::string(3 << 20, 'a'), "middle", std::string(2 << 20, 'c')};
  std::vector<iovec> iov;
  for (auto& p : parts) iov.push_back({p.data(), p.size()});
  auto writer = spawn([&] { return pair.client.writev(iov, Deadline::after(10s)); });
  std::string expected = parts[0] + parts[1] + parts[2];
  std::string got;
  std::vector<char> buffer(32 * 1024);
  while (got.size() < expected.size()) {
    auto n = pair.server.read(buffer, Deadline::after(10s));
    ASSERT_TRUE(n.has_value() && *n > 0);
    got.append(buffer.data(), *n);
    if (got.size() % 7 == 0) this_fiber::yield();
  }
  EXPECT_EQ(writer.join().value(), expected.size());
  EXPECT_TRUE(got == expected);
}

FIBER_TEST(TcpStream, SendfileSendsTheFileRange) {
  auto pair = connect_pair();
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  std::string content(1 << 20, '\0');
  for (std::size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 31);
  ASSERT_EQ(std::fwrite(content.data(), 1, content.size(), file), content.size());
  std::fflush(file);
  auto sender =
      spawn([&] { return pair.client.sendfile(fileno(file), 100, content.size() - 200); });
  std::vector<char> got(content.size() - 200);
  ASSERT_TRUE(pair.server.read_exact(got, Deadline::after(10s)).has_value());
  EXPECT_EQ(sender.join().value(), content.size() - 200);
  EXPECT_TRUE(text_of(got) == content.substr(100, content.size() - 200));
  std::fclose(file);
}

FIBER_TEST(TcpStream, ShutdownWriteDeliversEndOfStreamButKeepsReading) {
  auto [client, server] = connect_pair();
  ASSERT_TRUE(client.shutdown(TcpStream::Shutdown::kWrite).has_value());
  char buffer[8];
  EXPECT_EQ(server.read(buffer, Deadline::after(5s)).value(), 0u);
  ASSERT_TRUE(server.write_all(std::string_view("ok")).has_value());
  EXPECT_EQ(client.read(buffer, Deadline::after(5s)).value(), 2u);
}

FIBER_TEST(TcpStream, ReportsLocalAndPeerAddresses) {
  auto [client, server] = connect_pair();
  EXPECT_EQ(client.peer_address().value(), server.local_address().value());
  EXPECT_EQ(client.local_address().value(), server.peer_address().value());
  EXPECT_TRUE(client.set_nodelay(true).has_value());
}

FIBER_TEST(TcpStream, ConnectToAClosedPortIsRefused) {
  Address address = Address::loopback_v4(0);
  {
    auto listener = TcpListener::bind(address);
    address = listener->local_address().value();
  }  // closed: nothing listens there now
  auto stream = TcpStream::connect(address, Deadline::after(5s));
  ASSERT_FALSE(stream.has_value());
  EXPECT_EQ(stream.error(), std::errc::connection_refused);
}

FIBER_TEST(TcpStream, ConnectTimesOutWhenTheBacklogIsFull) {
  // A listener that never accepts, with the smallest backlog: once its queue is full the kernel
  // drops further SYNs, so a connect can only end by its deadline. Loopback only.
  auto listener = TcpListener::bind(Address::loopback_v4(0), ListenOptions{.backlog = 0});
  ASSERT_TRUE(listener.has_value());
  auto address = listener->local_address().value();
  std::vector<TcpStream> queued;
  bool timed_out = false;
  for (int i = 0; i < 16 && !timed_out; ++i) {
    auto stream = TcpStream::connect(address, Deadline::after(200ms));
    if (stream) {
      queued.push_back(std::move(*stream));
    } else {
      EXPECT_EQ(stream.error(), std::errc::timed_out);
      timed_out = true;
    }
  }
  EXPECT_TRUE(timed_out);
}

FIBER_TEST(TcpListener, AcceptTimesOutAndCanBeCancelled) {
  auto listener = TcpListener::bind(Address::loopback_v4(0));
  ASSERT_TRUE(listener.has_value());
  EXPECT_EQ(listener->accept(Deadline::after(10ms)).error(), std::errc::timed_out);
  auto acceptor = spawn([&] { return listener->accept().error(); });
  (void)this_fiber::sleep_for(5ms);
  acceptor.request_stop();
  EXPECT_EQ(acceptor.join(), std::errc::operation_canceled);
}

FIBER_TEST(TcpListener, BindingABusyPortWithoutReusePortFails) {
  auto first = TcpListener::bind(Address::loopback_v4(0), ListenOptions{.reuse_port = false});
  ASSERT_TRUE(first.has_value());
  auto second =
      TcpListener::bind(first->local_address().value(), ListenOptions{.reuse_port = false});
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error(), std::errc::address_in_use);
}

FIBER_TEST(TcpListener, WorksOverUnixSockets) {
  std::string path = "/tmp/spindle-test-" + std::to_string(::getpid()) + ".sock";
  ::unlink(path.c_str());
  auto listener = TcpListener::bind(Address::parse("unix:" + path).value());
  ASSERT_TRUE(listener.has_value());
  auto client = TcpStream::connect(listener->local_address().value(), Deadline::after(5s));
  ASSERT_TRUE(client.has_value());
  auto server = listener->accept(Deadline::after(5s));
  ASSERT_TRUE(server.has_value());
  ASSERT_TRUE(client->write_all(std::string_view("unix")).has_value());
  char buffer[4];
  ASSERT_TRUE(server->read_exact(buffer, Deadline::after(5s)).has_value());
  EXPECT_EQ(text_of(buffer), "unix");
  ::unlink(path.c_str());
}

TEST(TcpServer, AcceptsOnEveryWorkerAndServesConcurrentClients) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  std::atomic<int> served_by[2] = {0, 0};
  auto server = TcpServer::start(runtime, Address::loopback_v4(0), [&](TcpStream stream) {
    ++served_by[Worker::current()->index()];
    char byte;
    while (stream.read({&byte, 1}).value_or(0) == 1) {
      if (!stream.write_all({&byte, 1})) return;
    }
  });
  ASSERT_TRUE(server.has_value());
  Address address = (*server)->address();
  EXPECT_NE(address.port(), 0);
  int ok = runtime.block_on([&] {
    std::atomic<int> good{0};
    WaitGroup group;
    for (int i = 0; i < 200; ++i) {
      group.add();
      spawn_on(runtime.worker(i % 2), [&, i] {
        auto stream = TcpStream::connect(address, Deadline::after(5s));
        char c = static_cast<char>('a' + i % 26), back = 0;
        if (stream && stream->write_all({&c, 1}) &&
            stream->read_exact({&back, 1}, Deadline::after(5s)) && back == c) {
          ++good;
        }
        group.done();
      }).detach();
    }
    (void)group.wait(Deadline::after(30s));
    return good.load();
  });
  EXPECT_EQ(ok, 200);
  EXPECT_EQ(served_by[0] + served_by[1], 200);
  // Each worker has its own listener (SO_REUSEPORT) and the kernel spreads connections over
  // them by their addresses: all 200 landing on one worker has a chance of 2^-199.
  EXPECT_GT(served_by[0].load(), 0);
  EXPECT_GT(served_by[1].load(), 0);
  (*server)->stop();
  // Stopped: new connections are refused.
  auto refused = runtime.block_on([&] { return TcpStream::connect(address, Deadline::after(5s)); });
  EXPECT_FALSE(refused.has_value());
}

TEST(TcpServer, AnOpenServerAcceptsNothingUntilToldAndStopsWhileWaiting) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  std::atomic<int> accepted{0};
  auto echo_one = [&](TcpStream stream) {
    ++accepted;
    char c = 0;
    if (stream.read_exact({&c, 1}, Deadline::after(5s))) {
      (void)stream.write_all(std::string_view(&c, 1));
    }
  };
  auto server = TcpServer::open(runtime, Address::loopback_v4(0), echo_one);
  ASSERT_TRUE(server.has_value()) << server.error().message();
  Address address = (*server)->address();
  // Bound and listening: the kernel completes the handshake and queues the byte, but nobody
  // takes the connection yet.
  int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(client, address.data(), address.size()), 0);
  ASSERT_EQ(::write(client, "y", 1), 1);
  timeval short_wait{.tv_sec = 0, .tv_usec = 300'000};
  ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &short_wait, sizeof short_wait);
  char c = 0;
  EXPECT_EQ(::read(client, &c, 1), -1);  // no answer within 300 ms
  EXPECT_EQ(accepted.load(), 0);
  (*server)->accept_connections();
  timeval long_wait{.tv_sec = 5, .tv_usec = 0};
  ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &long_wait, sizeof long_wait);
  EXPECT_EQ(::read(client, &c, 1), 1);  // the connection that waited is served
  EXPECT_EQ(c, 'y');
  EXPECT_EQ(accepted.load(), 1);
  ::close(client);

  // Another one never told to accept stops at once: its acceptors end while waiting.
  auto idle = TcpServer::open(runtime, Address::loopback_v4(0), echo_one);
  ASSERT_TRUE(idle.has_value());
  (*idle)->stop();
  EXPECT_TRUE((*idle)->listener_fds().empty());
  EXPECT_EQ(accepted.load(), 1);
}

TEST(TcpServer, StartFailsCleanlyWhenThePortIsTaken) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  auto first = TcpServer::start(
      runtime, Address::loopback_v4(0), [](TcpStream) {},
      TcpServerOptions{.listen = {.reuse_port = false}});
  ASSERT_TRUE(first.has_value());
  auto second = TcpServer::start(
      runtime, (*first)->address(), [](TcpStream) {},
      TcpServerOptions{.listen = {.reuse_port = false}});
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error(), std::errc::address_in_use);
}

TEST(TcpServer, AnotherServerOnTheAddressIsInUseEvenWithReusePort) {
  // Both with SO_REUSEPORT (the default): the second used to start and take half the
  // connections. Its workers may still join each other.
  Runtime runtime(RuntimeOptions{.workers = 2});
  auto first = TcpServer::start(runtime, Address::loopback_v4(0), [](TcpStream) {});
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ((*first)->listener_fds().size(), 2u);
  auto second = TcpServer::start(runtime, (*first)->address(), [](TcpStream) {});
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error(), std::errc::address_in_use);
  // A listener that asks to join (as a handed-over one's siblings do) still may.
  bool joined = runtime.block_on([&] {
    return TcpListener::bind((*first)->address(), ListenOptions{.exclusive = false}).has_value();
  });
  EXPECT_TRUE(joined);
}

FIBER_TEST(Resolver, AnswersNumericHostsWithoutALookup) {
  Resolver resolver(1);
  auto v4 = resolver.resolve("127.0.0.1", 80);
  ASSERT_TRUE(v4.has_value());
  ASSERT_EQ(v4->size(), 1u);
  EXPECT_EQ((*v4)[0].to_string(), "127.0.0.1:80");
  auto v6 = resolver.resolve("::1", 443);
  ASSERT_TRUE(v6.has_value());
  EXPECT_EQ((*v6)[0].to_string(), "[::1]:443");
}

FIBER_TEST(Resolver, ResolvesLocalhostFromTheHostsFileWithoutBlockingTheWorker) {
  // getaddrinfo, made slow enough that a lookup cannot be over before the asking fiber parks.
  Resolver resolver(1, [](const std::string& host, std::uint16_t port) {
    std::this_thread::sleep_for(20ms);
    return Resolver(1).resolve(host, port);
  });
  // A sibling fiber, ready before the lookup starts, runs while the lookup is in flight: it
  // has run by the time resolve() returns only if resolve() parked instead of blocking.
  std::atomic<bool> stop{false};
  int ticks = 0;
  auto ticker = spawn([&] {
    while (!stop) {
      ++ticks;
      this_fiber::yield();
    }
  });
  auto addresses = resolver.resolve("localhost", 8080, Deadline::after(10s));
  int ticks_during_lookup = ticks;
  stop = true;
  ticker.join();
  EXPECT_GT(ticks_during_lookup, 0);
  ASSERT_TRUE(addresses.has_value()) << addresses.error().message();
  ASSERT_FALSE(addresses->empty());
  for (const auto& a : *addresses) {
    EXPECT_EQ(a.port(), 8080);
    EXPECT_TRUE(a.to_string().starts_with("127.") || a.to_string().starts_with("[::1]"))
        << a.to_string();
  }
}

FIBER_TEST(Resolver, FailsForAnEmptyNameAndAnExpiredDeadline) {
  Resolver resolver(1);
  auto empty = resolver.resolve("", 80);
  ASSERT_FALSE(empty.has_value());
  EXPECT_EQ(&empty.error().category(), &resolver_category());
  auto late = resolver.resolve("localhost", 80, Deadline::after(0ms));
  ASSERT_FALSE(late.has_value());
  EXPECT_EQ(late.error(), std::errc::timed_out);
}

TEST(TcpServer, WithoutReusePortOneListenerFeedsEveryWorker) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  std::atomic<int> served_by[2] = {0, 0};
  auto server = TcpServer::start(
      runtime, Address::loopback_v4(0),
      [&](TcpStream stream) {
        ++served_by[Worker::current()->index()];
        (void)stream.write_all(std::string_view("k"));
      },
      TcpServerOptions{.listen = {.reuse_port = false}});
  ASSERT_TRUE(server.has_value());
  Address address = (*server)->address();
  int answered = runtime.block_on([&] {
    int n = 0;
    for (int i = 0; i < 20; ++i) {
      auto stream = TcpStream::connect(address, Deadline::after(5s));
      char c = 0;
      if (stream && stream->read_exact({&c, 1}, Deadline::after(5s)) && c == 'k') ++n;
    }
    return n;
  });
  EXPECT_EQ(answered, 20);
  EXPECT_EQ(served_by[0].load(), 10);
  EXPECT_EQ(served_by[1].load(), 10);
}

TEST(TcpServer, InheritedListenersServeTheConnectionsWaitingInTheirQueues) {
  // A listening socket made elsewhere (as by the process being replaced), with a client
  // already connected and its request sent before any server accepts.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  int on = 1;
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on), 0);  // as ours have
  Address loopback = Address::loopback_v4(0);
  ASSERT_EQ(::bind(fd, loopback.data(), loopback.size()), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length), 0);
  Address address = *Address::from_sockaddr(reinterpret_cast<sockaddr*>(&local), length);
  int early = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(early, address.data(), address.size()), 0);
  ASSERT_EQ(::write(early, "x", 1), 1);

  Runtime runtime(RuntimeOptions{.workers = 2});
  std::vector<UniqueFd> inherited;
  inherited.emplace_back(fd);
  auto server = TcpServer::start(
      runtime, address,
      [](TcpStream stream) {
        char c = 0;
        if (stream.read_exact({&c, 1}, Deadline::after(5s))) {
          (void)stream.write_all(std::string_view(&c, 1));
        }
      },
      TcpServerOptions{}, std::move(inherited));
  ASSERT_TRUE(server.has_value()) << server.error().message();
  EXPECT_EQ((*server)->address().port(), address.port());
  EXPECT_EQ((*server)->listener_fds().size(), 2u);  // the inherited one, and one bound
  EXPECT_EQ((*server)->listener_fds()[0], fd);
  // The connection that waited in the inherited queue is served.
  char c = 0;
  timeval timeout{.tv_sec = 5, .tv_usec = 0};
  ::setsockopt(early, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  EXPECT_EQ(::read(early, &c, 1), 1);
  EXPECT_EQ(c, 'x');
  ::close(early);
}

TEST(TcpServer, ABlockingInheritedListenerDoesNotBlockItsWorker) {
  // systemd passes blocking sockets, without SO_REUSEPORT: adopted, the socket is made
  // non-blocking, or the worker would sit in accept() while its connections wait.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  Address loopback = Address::loopback_v4(0);
  ASSERT_EQ(::bind(fd, loopback.data(), loopback.size()), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length), 0);
  Address address = *Address::from_sockaddr(reinterpret_cast<sockaddr*>(&local), length);

  Runtime runtime(RuntimeOptions{.workers = 1});
  std::vector<UniqueFd> inherited;
  inherited.emplace_back(fd);
  auto server = TcpServer::start(
      runtime, address,
      [](TcpStream stream) {
        char c = 0;
        while (stream.read_exact({&c, 1}, Deadline::after(5s))) {
          if (!stream.write_all(std::string_view(&c, 1))) break;
        }
      },
      TcpServerOptions{}, std::move(inherited));
  ASSERT_TRUE(server.has_value()) << server.error().message();
  for (char sent : {'a', 'b', 'c'}) {  // one connection after the other, each answered
    int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(::connect(client, address.data(), address.size()), 0);
    timeval timeout{.tv_sec = 5, .tv_usec = 0};
    ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ASSERT_EQ(::write(client, &sent, 1), 1);
    char got = 0;
    EXPECT_EQ(::read(client, &got, 1), 1);
    EXPECT_EQ(got, sent);
    ::close(client);
  }
  (*server)->stop();
}

FIBER_TEST(TcpStream, ClosingAStreamWakesAFiberParkedOnIt) {
  auto pair = connect_pair();
  auto reader = spawn([&] {
    char buffer[8];
    return pair.server.read(buffer, Deadline::after(10s)).error();
  });
  (void)this_fiber::sleep_for(5ms);
  pair.server.close();
  EXPECT_EQ(reader.join(), std::errc::operation_canceled);
  // The released slot is reusable: a new connection on this worker works normally.
  auto next = connect_pair();
  ASSERT_TRUE(next.client.write_all(std::string_view("ok")).has_value());
  char buffer[2];
  EXPECT_TRUE(next.server.read_exact(buffer, Deadline::after(5s)).has_value());
}
