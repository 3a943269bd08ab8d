// A socket its program believes blocking gives what a blocking socket gives (issue 69 item 15):
// a write returns once all of it is sent, a recv(MSG_WAITALL) once all of it came (or the peer
// ended), on a fiber and on a plain thread alike, and whether or not a fiber used the socket
// before. Over a Unix stream pair and over TCP.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hook_testing.h"
#include "spindle/fiber/this_fiber.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::hook_testing;

namespace {

constexpr std::size_t kBig = 8 * 1024 * 1024;

// A connected TCP pair on the loopback (blocking), closed when it goes.
struct TcpPair {
  int a = -1, b = -1;
  TcpPair() {
    int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(listener, 1), 0);
    socklen_t size = sizeof address;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size);
    a = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(::connect(a, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    b = ::accept(listener, nullptr, nullptr);
    ::close(listener);
  }
  TcpPair(const TcpPair&) = delete;
  TcpPair& operator=(const TcpPair&) = delete;
  ~TcpPair() {
    ::close(a);
    ::close(b);
  }
};

std::vector<char> pattern(std::size_t size) {
  std::vector<char> data(size);
  for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 31 + i / 4096);
  return data;
}

// Reads everything from `fd` until `size` bytes came, in small reads with pauses (a slow
// reader); returns them.
std::vector<char> read_slowly(int fd, std::size_t size) {
  std::vector<char> got(size);
  std::size_t at = 0;
  int reads = 0;
  while (at < size) {
    ssize_t n = ::read(fd, got.data() + at, std::min<std::size_t>(size - at, 256 * 1024));
    if (n <= 0) break;
    at += static_cast<std::size_t>(n);
    if (++reads % 8 == 0) std::this_thread::sleep_for(1ms);
  }
  got.resize(at);
  return got;
}

// Sends `data` in small pieces with pauses (a slow writer).
void write_slowly(int fd, const std::vector<char>& data) {
  for (std::size_t at = 0; at < data.size();) {
    std::size_t piece = std::min<std::size_t>(data.size() - at, 1000);
    ssize_t n = ::send(fd, data.data() + at, piece, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<std::size_t>(n);
    if (at % 16000 < 1000) std::this_thread::sleep_for(1ms);
  }
  ::shutdown(fd, SHUT_WR);
}

// How the write is made.
enum class Write { kWrite, kSend, kWritev, kSendmsg };

ssize_t write_all_at_once(Write how, int fd, const std::vector<char>& data) {
  std::size_t half = data.size() / 2;
  iovec parts[2] = {{const_cast<char*>(data.data()), half},
                    {const_cast<char*>(data.data()) + half, data.size() - half}};
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = 2;
  switch (how) {
    case Write::kWrite:
      return ::write(fd, data.data(), data.size());
    case Write::kSend:
      return ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    case Write::kWritev:
      return ::writev(fd, parts, 2);
    case Write::kSendmsg:
      return ::sendmsg(fd, &message, MSG_NOSIGNAL);
  }
  return -1;
}

// One big write on `writer`, read slowly from `reader`: all of it, in order.
template <typename Sockets>
void big_write(Write how, bool on_fiber, bool used_before) {
  Sockets s;
  auto data = pattern(kBig);
  if (used_before) {
    // A fiber's cooperative read first: what the hooks keep about the socket is in place.
    (void)on_one_worker({[&] {
                           char c;
                           EXPECT_EQ(::read(s.a, &c, 1), 1);
                         },
                         [&] {
                           (void)this_fiber::sleep_for(10ms);
                           EXPECT_EQ(::write(s.b, "u", 1), 1);
                         }});
  }
  std::vector<char> got;
  std::thread reader([&] { got = read_slowly(s.b, kBig); });
  ssize_t n = -1;
  if (on_fiber) {
    (void)on_one_worker({[&] { n = write_all_at_once(how, s.a, data); }});
  } else {
    n = write_all_at_once(how, s.a, data);
  }
  ::shutdown(s.a, SHUT_WR);  // a short write would leave the reader waiting
  reader.join();
  EXPECT_EQ(n, static_cast<ssize_t>(kBig)) << "a short write on a blocking socket";
  EXPECT_TRUE(got == data);
}

// recv(MSG_WAITALL) of `size` while the peer sends in small pieces.
template <typename Sockets>
void wait_all(bool on_fiber, bool use_recvmsg) {
  Sockets s;
  constexpr std::size_t kSize = 1024 * 1024;
  auto data = pattern(kSize);
  std::thread writer([&] { write_slowly(s.b, data); });
  std::vector<char> got(kSize);
  ssize_t n = -1;
  auto receive = [&] {
    if (!use_recvmsg) {
      n = ::recv(s.a, got.data(), kSize, MSG_WAITALL);
      return;
    }
    iovec parts[2] = {{got.data(), 100}, {got.data() + 100, kSize - 100}};
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = 2;
    n = ::recvmsg(s.a, &message, MSG_WAITALL);
  };
  if (on_fiber) {
    (void)on_one_worker({receive});
  } else {
    receive();
  }
  // What a short read left behind, so that the writer ends.
  auto rest = read_slowly(s.a, kSize);
  writer.join();
  EXPECT_EQ(n, static_cast<ssize_t>(kSize)) << "a short MSG_WAITALL read";
  EXPECT_TRUE(rest.empty());
  EXPECT_TRUE(got == data);
}

}  // namespace

TEST(HookShortIo, BigWritesOnAFiberAreWhole) {
  for (Write how : {Write::kWrite, Write::kSend, Write::kWritev, Write::kSendmsg}) {
    SCOPED_TRACE(static_cast<int>(how));
    big_write<Pair>(how, true, false);
    big_write<TcpPair>(how, true, false);
  }
}

TEST(HookShortIo, BigWritesOnAPlainThreadAreWholeAfterAFiberUsedTheSocket) {
  for (Write how : {Write::kWrite, Write::kWritev}) {
    SCOPED_TRACE(static_cast<int>(how));
    big_write<Pair>(how, false, true);
    big_write<TcpPair>(how, false, true);
    big_write<TcpPair>(how, true, true);
  }
}

TEST(HookShortIo, WaitallReadsAreWhole) {
  for (bool on_fiber : {true, false}) {
    for (bool use_recvmsg : {false, true}) {
      SCOPED_TRACE(on_fiber * 2 + use_recvmsg);
      wait_all<Pair>(on_fiber, use_recvmsg);
      wait_all<TcpPair>(on_fiber, use_recvmsg);
    }
  }
}

// Ended early, a whole read or write returns what it did, as a blocking one does: the bytes
// that came before the peer shut down; the bytes sent before a send timeout (SO_SNDTIMEO).
TEST(HookShortIo, WaitallReturnsWhatCameBeforeTheEnd) {
  Pair p;
  std::vector<char> got(1000);
  ssize_t n = -1;
  (void)on_one_worker({[&] { n = ::recv(p.a, got.data(), got.size(), MSG_WAITALL); },
                       [&] {
                         (void)this_fiber::sleep_for(10ms);
                         EXPECT_EQ(::write(p.b, "abc", 3), 3);
                         (void)this_fiber::sleep_for(10ms);
                         EXPECT_EQ(::write(p.b, "de", 2), 2);
                         ::shutdown(p.b, SHUT_WR);
                       }});
  EXPECT_EQ(n, 5);
  EXPECT_EQ(std::string(got.data(), 5), "abcde");
}

TEST(HookShortIo, ASendTimeoutReturnsWhatWasSent) {
  auto data = pattern(kBig);
  ssize_t on_thread = -1, on_fiber = -1;
  {
    Pair p;
    timeval timeout{0, 100'000};
    ASSERT_EQ(::setsockopt(p.a, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout), 0);
    on_thread = ::write(p.a, data.data(), data.size());
  }
  {
    Pair p;
    timeval timeout{0, 100'000};
    ASSERT_EQ(::setsockopt(p.a, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout), 0);
    (void)on_one_worker({[&] { on_fiber = ::write(p.a, data.data(), data.size()); }});
  }
  EXPECT_GT(on_thread, 0);
  EXPECT_LT(on_thread, static_cast<ssize_t>(kBig));
  EXPECT_EQ(on_fiber, on_thread) << "libc's blocking write sends as much as fits, then times out";
}

// The connection is reset under a whole write: libc's write returns the count sent, and the
// reset is the next call's error (ECONNRESET, no SIGPIPE), then EPIPE. The same on a fiber,
// whose write was many non-waiting sends (one of which took the reset from the socket).
TEST(HookShortIo, AWriteCutByAResetReturnsItsCountThenTheReset) {
  auto before = ::signal(SIGPIPE, SIG_IGN);
  auto data = pattern(kBig);
  for (bool on_fiber : {false, true}) {
    SCOPED_TRACE(on_fiber ? "fiber" : "thread");
    TcpPair s;
    std::thread resetter([&] {
      std::vector<char> some(100'000);
      std::size_t got = 0;
      while (got < some.size()) {
        ssize_t n = ::read(s.b, some.data() + got, some.size() - got);
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      std::this_thread::sleep_for(20ms);
      linger abort{1, 0};
      ::setsockopt(s.b, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
      ::close(std::exchange(s.b, ::socket(AF_INET, SOCK_STREAM, 0)));  // sends a reset
    });
    ssize_t first = -1;
    int second = 0, third = 0;
    auto writes = [&] {
      first = ::write(s.a, data.data(), data.size());
      errno = 0;
      EXPECT_EQ(::write(s.a, "x", 1), -1);
      second = errno;
      errno = 0;
      EXPECT_EQ(::write(s.a, "x", 1), -1);
      third = errno;
    };
    if (on_fiber) {
      (void)on_one_worker({writes});
    } else {
      writes();
    }
    resetter.join();
    EXPECT_GT(first, 0);
    EXPECT_LT(first, static_cast<ssize_t>(kBig));
    EXPECT_EQ(second, ECONNRESET);
    EXPECT_EQ(third, EPIPE);
  }
  ::signal(SIGPIPE, before);
}
