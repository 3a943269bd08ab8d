// The fiber Redis client against a scripted server on loopback (a plain thread with blocking
// sockets): commands pipelined, replies handed out in order, timeouts and a lost connection
// failing the calls that wait, and the back-off that makes the next calls fail at once.
#include "spindle/proxy/redis.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::proxy;

namespace {

// A one-connection server: reads until it has seen `expect` bytes, then writes `reply` (or
// closes, if `close` is set) and waits for the client to go.
class ScriptedRedis {
 public:
  ScriptedRedis(std::size_t expect, std::string reply, bool close = false) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listener_, 8), 0);
    socklen_t length = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &length);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, expect, reply = std::move(reply), close] {
      int c = ::accept(listener_, nullptr, nullptr);
      ++accepted_;
      char buffer[4096];
      while (received_.size() < expect) {
        ssize_t n = ::read(c, buffer, sizeof buffer);
        if (n <= 0) break;
        received_.append(buffer, static_cast<std::size_t>(n));
      }
      if (!close) {
        (void)!::write(c, reply.data(), reply.size());
        while (::read(c, buffer, sizeof buffer) > 0) {
        }
      }
      ::close(c);
    });
  }
  ~ScriptedRedis() {
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
  }
  Address address() const { return *Address::parse("127.0.0.1:" + std::to_string(port_)); }
  const std::string& received() const { return received_; }

 private:
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::string received_;
  int accepted_ = 0;
};

RedisConfig config(std::chrono::milliseconds timeout = 500ms) {
  RedisConfig c;
  c.host = "127.0.0.1";
  c.timeout = timeout;
  c.backoff = 300ms;
  return c;
}

std::string command(std::initializer_list<std::string_view> args) {
  return redis_command(std::span(args.begin(), args.size()));
}

}  // namespace

TEST(RedisCommand, IsAnArrayOfBulkStrings) {
  EXPECT_EQ(command({"GET", "k"}), "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
  EXPECT_EQ(command({"SET", "", "a\r\nb"}), "*3\r\n$3\r\nSET\r\n$0\r\n\r\n$4\r\na\r\nb\r\n");
}

TEST(RedisClient, CallsFromSeveralFibersArePipelinedAndGetTheirOwnReplies) {
  // The server answers only once all three commands are in: a client that waited for each
  // reply before sending the next would never get one.
  std::string commands = command({"GET", "a"}) + command({"GET", "b"}) + command({"EVAL", "x"});
  ScriptedRedis server(commands.size(), ":1\r\n$2\r\nbb\r\n*3\r\n:7\r\n$-1\r\n-ERR no\r\n");
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.block_on([&] {
    RedisClient client(config(), server.address());
    std::vector<std::string_view> a{"GET", "a"}, b{"GET", "b"}, e{"EVAL", "x"};
    auto first = spawn([&] { return client.call(a, Deadline::after(2s)); });
    auto second = spawn([&] { return client.call(b, Deadline::after(2s)); });
    auto third = spawn([&] { return client.call(e, Deadline::after(2s)); });
    auto r1 = first.join();
    auto r2 = second.join();
    auto r3 = third.join();
    ASSERT_TRUE(r1 && r2 && r3);
    EXPECT_EQ(r1->type, RedisReply::Type::kInteger);
    EXPECT_EQ(r1->integer, 1);
    EXPECT_EQ(r2->type, RedisReply::Type::kString);
    EXPECT_EQ(r2->text, "bb");
    ASSERT_EQ(r3->type, RedisReply::Type::kArray);
    ASSERT_EQ(r3->elements.size(), 3u);
    EXPECT_EQ(r3->elements[0].integer, 7);
    EXPECT_EQ(r3->elements[1].type, RedisReply::Type::kNil);
    EXPECT_EQ(r3->elements[2].type, RedisReply::Type::kError);
    EXPECT_EQ(r3->elements[2].text, "ERR no");
    EXPECT_EQ(client.connects(), 1u);
  });
  EXPECT_EQ(server.received(), commands);
}

TEST(RedisClient, NoReplyInTimeFailsTheCallThenTheBackOffFailsAtOnce) {
  ScriptedRedis server(1 << 20, "");  // reads, never answers
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.block_on([&] {
    RedisClient client(config(100ms), server.address());
    std::vector<std::string_view> get{"GET", "k"};
    auto start = Clock::now();
    auto r = client.call(get, Deadline::never());
    auto waited = Clock::now() - start;
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), std::errc::timed_out);
    EXPECT_GE(waited, 95ms);
    EXPECT_LT(waited, 400ms);
    // Within the back-off: refused at once, no new connection.
    start = Clock::now();
    r = client.call(get, Deadline::never());
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), std::errc::connection_refused);
    EXPECT_LT(Clock::now() - start, 20ms);
    EXPECT_EQ(client.connects(), 1u);
  });
}

TEST(RedisClient, ALostConnectionFailsTheCallsWaitingOnIt) {
  std::string get = command({"GET", "k"});
  ScriptedRedis server(get.size(), "", /*close=*/true);
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.block_on([&] {
    RedisClient client(config(), server.address());
    std::vector<std::string_view> args{"GET", "k"};
    auto r = client.call(args, Deadline::never());
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), std::errc::connection_reset);
  });
}

TEST(RedisClient, NothingListeningIsRefusedAndTriedAgainOnlyAfterTheBackOff) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.block_on([&] {
    // A port nothing listens on: bind one, and close it.
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t length = sizeof addr;
    ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &length);
    ::close(s);
    auto address = *Address::parse("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
    RedisClient client(config(), address);
    std::vector<std::string_view> args{"PING"};
    EXPECT_EQ(client.call(args, Deadline::never()).error(), std::errc::connection_refused);
    EXPECT_EQ(client.call(args, Deadline::never()).error(), std::errc::connection_refused);
    EXPECT_EQ(client.connects(), 1u);
    this_fiber::sleep_for(350ms);
    EXPECT_FALSE(client.call(args, Deadline::never()));
    EXPECT_EQ(client.connects(), 2u);
  });
}

// A reply may announce no more than it takes to read: hiredis allocates an array's slots when
// its header arrives, so `*2147483647` would cost 16 GiB and seconds of the worker.
TEST(RedisClient, AReplyAnnouncingTooManyElementsBreaksTheConnection) {
  std::string nested = "*1000\r\n";
  for (int i = 0; i < 1000; ++i) nested += "*1\r\n:1\r\n";  // 1000 + 1000 announced
  for (const std::string& reply : {std::string("*2147483647\r\n"), std::string("*1025\r\n"),
                                   std::string("*2\r\n*1023\r\n"), nested}) {
    std::string get = command({"GET", "k"});
    ScriptedRedis server(get.size(), reply);
    Runtime runtime(RuntimeOptions{.workers = 1});
    runtime.block_on([&] {
      RedisClient client(config(2000ms), server.address());
      std::vector<std::string_view> args{"GET", "k"};
      auto r = client.call(args, Deadline::never());
      ASSERT_FALSE(r) << reply.substr(0, 20);
      // Refused as it was read, not left waiting for elements that never come.
      EXPECT_EQ(r.error(), std::errc::protocol_error) << reply.substr(0, 20);
    });
  }
}

TEST(RedisClient, AReplyOfTheMostElementsAllowedIsRead) {
  std::string reply = "*2\r\n*1\r\n:5\r\n*1021\r\n";
  for (int i = 0; i < 1021; ++i) reply += ":1\r\n";
  std::string get = command({"GET", "k"});
  ScriptedRedis server(get.size(), reply);
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.block_on([&] {
    RedisClient client(config(), server.address());
    std::vector<std::string_view> args{"GET", "k"};
    auto r = client.call(args, Deadline::never());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->elements.size(), 2u);
    EXPECT_EQ(r->elements[1].elements.size(), 1021u);
  });
}

TEST(RedisClient, AReplyLargerThanAMebibyteBreaksTheConnection) {
  std::string get = command({"GET", "k"});
  ScriptedRedis server(get.size(), "$2000000\r\n" + std::string(1100000, 'x'));
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.block_on([&] {
    RedisClient client(config(2000ms), server.address());
    std::vector<std::string_view> args{"GET", "k"};
    auto r = client.call(args, Deadline::never());
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), std::errc::protocol_error);
  });
}

// /metrics counts error replies by Redis's error code, the reply's first word exactly; any other
// code (or spelling) is "other", so that the series stay few whatever a server answers.
TEST(RedisErrorKind, IsTheRepliesFirstWord) {
  EXPECT_EQ(redis_error_kind("READONLY You can't write against a read only replica."),
            RedisErrorKind::kReadOnly);
  EXPECT_EQ(redis_error_kind("OOM command not allowed when used memory > 'maxmemory'."),
            RedisErrorKind::kOom);
  EXPECT_EQ(redis_error_kind("BUSY Redis is busy running a script."), RedisErrorKind::kBusy);
  EXPECT_EQ(redis_error_kind("LOADING Redis is loading the dataset in memory"),
            RedisErrorKind::kLoading);
  EXPECT_EQ(redis_error_kind("READONLY"), RedisErrorKind::kReadOnly);
  for (std::string_view other : {"", " READONLY", "readonly x", "READONLYX y", "BUSYKEY Target key",
                                 "ERR unknown command", "NOSCRIPT No matching script", "OOMx"}) {
    EXPECT_EQ(redis_error_kind(other), RedisErrorKind::kOther) << other;
  }
  EXPECT_EQ(kRedisErrorLabels[static_cast<std::size_t>(RedisErrorKind::kOther)], "other");
}

// READONLY after a failover, OOM, BUSY: Redis answers, but cannot do what was asked. Asking
// again at once would cost every request a round trip (and a log line): it backs off as a
// failed connection does, keeping the connection.
TEST(RedisClient, AnErrorReplyStartsTheBackOff) {
  std::string get = command({"GET", "k"});
  for (std::string error : {"READONLY You can't write against a read only replica.",
                            "OOM command not allowed", "BUSY Redis is busy running a script"}) {
    RedisErrorKind kind = redis_error_kind(error);
    std::uint64_t counted = redis_error_replies(kind);
    ScriptedRedis server(get.size() * 2, "-" + error + "\r\n-" + error + "\r\n");
    Runtime runtime(RuntimeOptions{.workers = 1});
    runtime.block_on([&] {
      RedisClient client(config(), server.address());
      std::vector<std::string_view> args{"GET", "k"};
      // Two calls pipelined: both get their error; one back-off.
      auto first = spawn([&] { return client.call(args, Deadline::never()); });
      auto second = spawn([&] { return client.call(args, Deadline::never()); });
      auto r1 = first.join();
      auto r2 = second.join();
      ASSERT_TRUE(r1 && r2);
      EXPECT_EQ(r1->type, RedisReply::Type::kError);
      EXPECT_EQ(r1->text, error);
      EXPECT_EQ(client.error_replies(), 2u);
      // Both counted for /metrics, under their kind.
      EXPECT_EQ(redis_error_replies(kind), counted + 2);
      // Within the back-off: refused at once, nothing sent.
      auto r3 = client.call(args, Deadline::never());
      ASSERT_FALSE(r3);
      EXPECT_EQ(r3.error(), std::errc::connection_refused);
      EXPECT_EQ(client.connects(), 1u);
    });
    EXPECT_EQ(server.received(), get + get);
  }
}
