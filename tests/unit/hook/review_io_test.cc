// Adversarial review of the hooks (3/3): what the data path gives. Ancillary data with whole
// (MSG_WAITALL) reads, errors the socket holds after a whole write, TCP Fast Open, datagram
// boundaries, ICMP errors, peeks, truncation, empty calls, sendfile and splice, and the one
// moment the hooks change a descriptor's flags (a blocking connect on a fiber).
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "review_testing.h"
#include "spindle/fiber/this_fiber.h"

namespace spindle::hook_review {
namespace {

// What one recvmsg gave: its count, its bytes, and the descriptors and credentials that came
// in its ancillary data.
struct Received {
  Outcome outcome;
  std::string bytes;
  int descriptors = 0;
  int credentials = 0;
};

// recvmsg(MSG_WAITALL) of `size` bytes from `fd`, with room for ancillary data (or none).
Received receive_all(int fd, std::size_t size, bool with_control) {
  Received r;
  r.bytes.assign(size, '\0');
  iovec part{r.bytes.data(), size};
  alignas(cmsghdr) char control[256] = {};
  msghdr m{};
  m.msg_iov = &part;
  m.msg_iovlen = 1;
  if (with_control) {
    m.msg_control = control;
    m.msg_controllen = sizeof control;
  }
  r.outcome = outcome_of([&] { return ::recvmsg(fd, &m, MSG_WAITALL); });
  r.bytes.resize(r.outcome.value > 0 ? static_cast<std::size_t>(r.outcome.value) : 0);
  if (!with_control || r.outcome.value < 0) return r;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_RIGHTS) {
      int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < count; ++i) {
        int received = -1;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
        ::close(received);
      }
      r.descriptors += count;
    }
    r.credentials += c->cmsg_type == SCM_CREDENTIALS;
  }
  return r;
}

// Sends `bytes` with descriptor `fd` attached.
void send_with_descriptor(int to, const std::string& bytes, int fd) {
  iovec part{const_cast<char*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &part;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  EXPECT_EQ(::sendmsg(to, &m, 0), static_cast<ssize_t>(bytes.size()));
}

template <typename Call>
auto made_on(bool fiber, Call call) {
  decltype(call()) result{};
  if (fiber) {
    EXPECT_FALSE(outstayed(5s, {[&] { result = call(); }}));
  } else {
    std::thread([&] { result = call(); }).join();
  }
  return result;
}

bool operator==(const Received& a, const Received& b) {
  return a.outcome == b.outcome && a.bytes == b.bytes && a.descriptors == b.descriptors &&
         a.credentials == b.credentials;
}

std::ostream& operator<<(std::ostream& out, const Received& r) {
  return out << r.outcome << " \"" << r.bytes << "\" descriptors " << r.descriptors
             << " credentials " << r.credentials;
}

}  // namespace

// Attack: a whole read (MSG_WAITALL) on a Unix stream socket whose program asked for
// credentials (SO_PASSCRED). libc's glues pieces of one writer into one read, with one
// SCM_CREDENTIALS: 6 bytes. (A read that stops at the first piece with ancillary data is
// short: 3.)
// fixed (was a defect): recvmsg(MSG_WAITALL) with SO_PASSCRED on a Unix stream: the fiber's whole
// read returns 3 bytes (stops at the first piece carrying ancillary data) where libc's returns all
// 6 with one SCM_CREDENTIALS
TEST(HookReview, AWholeReadWithCredentialsGetsEveryPieceOfOneWriter) {
  auto scenario = [](bool fiber) {
    Pair p;
    int on = 1;
    EXPECT_EQ(::setsockopt(p.a, SOL_SOCKET, SO_PASSCRED, &on, sizeof on), 0);
    EXPECT_EQ(::write(p.b, "abc", 3), 3);
    std::thread later([&] {
      std::this_thread::sleep_for(30ms);
      EXPECT_EQ(::write(p.b, "def", 3), 3);
    });
    Received r = made_on(fiber, [&] { return receive_all(p.a, 6, true); });
    later.join();
    return r;
  };
  Received libc = scenario(false);
  EXPECT_EQ(libc, (Received{{6, 0}, "abcdef", 0, 1}));
  EXPECT_EQ(scenario(true), libc);
}

// Attack: a whole read whose second piece carries a descriptor (SCM_RIGHTS). libc's read takes
// both pieces and the descriptor; none may be lost (the kernel drops descriptors that come to
// a read without room for them).
// fixed (was a defect): recvmsg(MSG_WAITALL) whose second piece carries SCM_RIGHTS: the hooks read
// later pieces without the control buffer, so the kernel drops (closes) the passed descriptor (0
// received vs libc's 1): data loss
TEST(HookReview, AWholeReadKeepsADescriptorThatCameInALaterPiece) {
  auto scenario = [](bool fiber) {
    Pair p, carried;
    EXPECT_EQ(::write(p.b, "abc", 3), 3);
    std::thread later([&] {
      std::this_thread::sleep_for(30ms);
      send_with_descriptor(p.b, "def", carried.a);
    });
    Received r = made_on(fiber, [&] { return receive_all(p.a, 6, true); });
    later.join();
    return r;
  };
  Received libc = scenario(false);
  EXPECT_EQ(libc, (Received{{6, 0}, "abcdef", 1, 0}));
  EXPECT_EQ(scenario(true), libc);
}

// Attack: a whole read on a socket that passes credentials, over bytes from two writers (a
// child shares the peer socket). libc never glues bytes of different credentials into one
// read: it returns the first writer's 3.
// fixed (was a defect): recvmsg(MSG_WAITALL) with SO_PASSCRED over bytes of two writers: the fiber
// glues them (6 'aaabbb') where libc stops at the credentials boundary (3 'aaa')
TEST(HookReview, AWholeReadNeverGluesTwoWritersBytes) {
  auto scenario = [](bool fiber) {
    Pair p;
    int on = 1;
    EXPECT_EQ(::setsockopt(p.a, SOL_SOCKET, SO_PASSCRED, &on, sizeof on), 0);
    EXPECT_EQ(::write(p.b, "aaa", 3), 3);
    pid_t child = ::fork();
    if (child == 0) ::_exit(::write(p.b, "bbb", 3) == 3 ? 0 : 1);
    int status = -1;
    EXPECT_EQ(::waitpid(child, &status, 0), child);
    Received r = made_on(fiber, [&] { return receive_all(p.a, 6, false); });
    return r;
  };
  Received libc = scenario(false);
  EXPECT_EQ(libc, (Received{{3, 0}, "aaa", 0, 0}));
  EXPECT_EQ(scenario(true), libc);
}

// Attack: the connection is reset under a whole write. libc's write returns its count and the
// reset stays on the socket: poll shows POLLERR, and getsockopt(SO_ERROR) says ECONNRESET, or
// a read through a duplicate does. The hooks' non-waiting sends took the error from the socket.
// fixed (was a defect): a reset under a fiber's whole write: the hooks' non-waiting send consumes
// the socket's error and keeps it privately: POLLERR is gone, SO_ERROR says 0 and a duplicate's
// read says 0 where libc leaves ECONNRESET on the socket
TEST(HookReview, AResetUnderAWholeWriteStaysOnTheSocket) {
  auto ignored = ::signal(SIGPIPE, SIG_IGN);
  // After the write: poll's POLLERR, then SO_ERROR (`by_duplicate`: a read of a duplicate).
  auto scenario = [](bool fiber, bool by_duplicate) {
    Tcp s;
    std::vector<char> big(8 * 1024 * 1024, 'r');
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
      ::close(std::exchange(s.b, ::socket(AF_INET, SOCK_STREAM, 0)));
    });
    ssize_t n = made_on(fiber, [&] { return ::write(s.a, big.data(), big.size()); });
    resetter.join();
    EXPECT_GT(n, 0);
    EXPECT_LT(n, static_cast<ssize_t>(big.size()));
    pollfd one{s.a, POLLIN, 0};
    (void)::poll(&one, 1, 0);
    bool pollerr = (one.revents & POLLERR) != 0;
    if (by_duplicate) {
      int copy = ::dup(s.a);
      Outcome read = outcome_of([&] { return read_one(copy); });
      ::close(copy);
      return std::pair{pollerr, read};
    }
    int error = 0;
    socklen_t size = sizeof error;
    EXPECT_EQ(::getsockopt(s.a, SOL_SOCKET, SO_ERROR, &error, &size), 0);
    return std::pair{pollerr, Outcome{error, 0}};
  };
  for (bool by_duplicate : {false, true}) {
    SCOPED_TRACE(by_duplicate ? "read of a duplicate" : "SO_ERROR");
    auto libc = scenario(false, by_duplicate);
    EXPECT_TRUE(libc.first);
    EXPECT_EQ(libc.second, by_duplicate ? (Outcome{-1, ECONNRESET}) : (Outcome{ECONNRESET, 0}));
    auto hooked = scenario(true, by_duplicate);
    EXPECT_EQ(hooked.first, libc.first) << "POLLERR";
    EXPECT_EQ(hooked.second, libc.second);
  }
  ::signal(SIGPIPE, ignored);
}

// Attack: the peer sends a few bytes, then resets the connection under a whole write. libc's
// next read returns those bytes first (they are in the socket's queue before the reset), and
// only the read after them says ECONNRESET.
// fixed (was a defect): after a reset under a whole write, the hooks' kept error
// (take_pending_error) is reported by the next read before the 5 bytes queued ahead of it: got {1,
// ECONNRESET, 5}, libc {1, 5, ECONNRESET}
TEST(HookReview, BytesThatCameBeforeAResetAreReadBeforeIt) {
  auto ignored = ::signal(SIGPIPE, SIG_IGN);
  auto scenario = [](bool fiber) {
    Tcp s;
    EXPECT_EQ(::write(s.b, "hello", 5), 5);
    std::vector<char> big(8 * 1024 * 1024, 'r');
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
      ::close(std::exchange(s.b, ::socket(AF_INET, SOCK_STREAM, 0)));
    });
    std::vector<Outcome> seen;
    made_on(fiber, [&] {
      seen.push_back(outcome_of([&] { return ::write(s.a, big.data(), big.size()) > 0; }));
      char buffer[16];
      seen.push_back(outcome_of([&] { return ::read(s.a, buffer, sizeof buffer); }));
      seen.push_back(outcome_of([&] { return ::read(s.a, buffer, sizeof buffer); }));
      return 0;
    });
    resetter.join();
    return seen;
  };
  std::vector<Outcome> libc = scenario(false);
  EXPECT_EQ(libc, (std::vector<Outcome>{{1, 0}, {5, 0}, {-1, ECONNRESET}}));
  EXPECT_EQ(scenario(true), libc);
  ::signal(SIGPIPE, ignored);
}

namespace {

// A fast-open send of "hello" on a new blocking socket to a listener, on a fiber or a thread:
// sendto(MSG_FASTOPEN), or (`connect_first`) TCP_FASTOPEN_CONNECT, connect, then write.
Outcome fast_open_send(bool fiber, bool connect_first) {
  Listener listener;
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  Outcome sent = made_on(fiber, [&] {
    if (!connect_first) {
      return outcome_of([&] {
        return ::sendto(client, "hello", 5, MSG_FASTOPEN, any_address(listener.address),
                        sizeof listener.address);
      });
    }
    int on = 1;
    EXPECT_EQ(::setsockopt(client, IPPROTO_TCP, TCP_FASTOPEN_CONNECT, &on, sizeof on), 0);
    EXPECT_EQ(::connect(client, any_address(listener.address), sizeof listener.address), 0);
    return outcome_of([&] { return ::write(client, "hello", 5); });
  });
  ::close(client);
  return sent;
}

}  // namespace

// Attack: TCP Fast Open on a blocking socket with sendto(MSG_FASTOPEN). libc's call connects,
// waiting, then sends: it returns the count. A non-waiting one says EINPROGRESS instead.
// fixed (was a defect): sendto(MSG_FASTOPEN) on a blocking socket on a fiber returns -1 EINPROGRESS
// (the non-waiting kernel answer leaks out) where libc's connects, sends and returns 5
TEST(HookReview, AFastOpenSendOnABlockingSocketConnectsAndSends) {
  EXPECT_EQ(fast_open_send(false, false), (Outcome{5, 0}));
  EXPECT_EQ(fast_open_send(true, false), (Outcome{5, 0}));
}

// Passes: TCP_FASTOPEN_CONNECT, then a blocking connect and write (what curl does with
// CURLOPT_TCP_FASTOPEN): the write returns its count on a fiber as on a thread.
TEST(HookReview, AFastOpenConnectThenWriteOnABlockingSocketSends) {
  EXPECT_EQ(fast_open_send(false, true), (Outcome{5, 0}));
  EXPECT_EQ(fast_open_send(true, true), (Outcome{5, 0}));
}

// Passes: datagrams keep their boundaries through a fiber's blocking writes, however small the
// send buffer (UDP), and records theirs (a SOCK_SEQPACKET writev of 64 iovecs is one record;
// a Unix datagram too).
TEST(HookReview, DatagramsAndRecordsAreNeverSplit) {
  Udp u;
  int small = 4096, large = 4 * 1024 * 1024;
  ASSERT_EQ(::setsockopt(u.a, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  ::setsockopt(u.b, SOL_SOCKET, SO_RCVBUF, &large, sizeof large);
  constexpr int kDatagrams = 20;
  constexpr std::size_t kSize = 60'000;
  std::vector<long> sizes;
  std::thread reader([&] {
    std::vector<char> buffer(65536);
    for (int i = 0; i < kDatagrams; ++i) sizes.push_back(::recv(u.b, buffer.data(), 65536, 0));
  });
  EXPECT_FALSE(outstayed(5s, {[&] {
                           std::vector<char> datagram(kSize, 'u');
                           for (int i = 0; i < kDatagrams; ++i) {
                             EXPECT_EQ(::write(u.a, datagram.data(), datagram.size()),
                                       static_cast<ssize_t>(kSize));
                           }
                         }}));
  reader.join();
  EXPECT_EQ(sizes, std::vector<long>(kDatagrams, static_cast<long>(kSize)));
  for (int type : {SOCK_SEQPACKET, SOCK_DGRAM}) {
    SCOPED_TRACE(type);
    Pair p(type);
    std::vector<char> record(64 * 700, 's');
    std::vector<iovec> parts;
    for (int i = 0; i < 64; ++i) parts.push_back({record.data() + i * 700, 700});
    Outcome written = on_fiber([&] { return ::writev(p.a, parts.data(), 64); });
    EXPECT_EQ(written, (Outcome{static_cast<long>(record.size()), 0}));
    std::vector<char> buffer(record.size() * 2);
    EXPECT_EQ(on_fiber([&] { return ::read(p.b, buffer.data(), buffer.size()); }), written);
  }
}

// Passes: on a fiber as on a thread: a connected UDP socket gets the ICMP port unreachable as
// ECONNREFUSED; MSG_TRUNC says a datagram's whole size; a peek leaves it; empty reads and
// writes (read of 0 bytes returns 0 at once; a datagram of 0 bytes is one datagram).
TEST(HookReview, DatagramCornersGiveWhatLibcGives) {
  auto scenario = [](bool fiber) {
    std::vector<Outcome> seen;
    sockaddr_in gone{};
    int closed = bound_socket(SOCK_DGRAM, gone);
    ::close(closed);
    int udp = ::socket(AF_INET, SOCK_DGRAM, 0);
    EXPECT_EQ(::connect(udp, any_address(gone), sizeof gone), 0);
    Udp u;
    made_on(fiber, [&] {
      char buffer[16];
      seen.push_back(outcome_of([&] { return ::send(udp, "x", 1, 0); }));
      seen.push_back(outcome_of([&] { return ::recv(udp, buffer, sizeof buffer, 0); }));
      std::string big(100, 'd');
      seen.push_back(outcome_of([&] { return ::send(u.a, big.data(), big.size(), 0); }));
      seen.push_back(outcome_of([&] { return ::recv(u.b, nullptr, 0, MSG_PEEK | MSG_TRUNC); }));
      seen.push_back(outcome_of([&] { return ::recv(u.b, buffer, 10, MSG_PEEK); }));
      seen.push_back(outcome_of([&] { return ::recv(u.b, buffer, 10, MSG_TRUNC); }));
      seen.push_back(outcome_of([&] { return ::read(u.b, buffer, 0); }));
      seen.push_back(outcome_of([&] { return ::write(u.a, buffer, 0); }));
      seen.push_back(outcome_of([&] { return ::send(u.a, "z", 1, 0); }));
      seen.push_back(outcome_of([&] { return ::recv(u.b, buffer, sizeof buffer, 0); }));
      seen.push_back(outcome_of([&] { return ::recv(u.b, buffer, sizeof buffer, 0); }));
      return 0;
    });
    ::close(udp);
    return seen;
  };
  std::vector<Outcome> libc = scenario(false);
  ASSERT_EQ(libc.size(), 11u);
  EXPECT_EQ(libc[1], (Outcome{-1, ECONNREFUSED}));
  EXPECT_EQ(libc[3], (Outcome{100, 0}));
  EXPECT_EQ(libc[9], (Outcome{0, 0}));
  EXPECT_EQ(scenario(true), libc);
}

// Passes: sendfile and splice (not hooked) on a fiber give libc's counts; a writev of 1024
// iovecs and a readv into 1024 are whole.
TEST(HookReview, SendfileSpliceAndManyIovecsOnAFiber) {
  FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  std::vector<char> data(1024 * 1024);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  ASSERT_EQ(std::fwrite(data.data(), 1, data.size(), file), data.size());
  std::fflush(file);
  Pair p;
  std::vector<char> got(data.size());
  std::thread reader([&] {
    std::size_t at = 0;
    while (at < got.size()) {
      ssize_t n = ::read(p.b, got.data() + at, got.size() - at);
      if (n <= 0) break;
      at += static_cast<std::size_t>(n);
    }
  });
  off_t offset = 0;
  Outcome sent =
      on_fiber([&] { return ::sendfile(p.a, ::fileno(file), &offset, data.size()); }, 5000ms);
  reader.join();
  EXPECT_EQ(sent, (Outcome{static_cast<long>(data.size()), 0}));
  EXPECT_TRUE(got == data);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ASSERT_EQ(::write(p.b, "splice", 6), 6);
  EXPECT_EQ(on_fiber([&] { return ::splice(p.a, nullptr, pipe_fds[1], nullptr, 6, 0); }),
            (Outcome{6, 0}));
  std::vector<char> one_each(1024);
  std::vector<iovec> parts;
  for (char& c : one_each) parts.push_back({&c, 1});
  std::vector<char> back(1024);
  std::vector<iovec> back_parts;
  for (char& c : back) back_parts.push_back({&c, 1});
  for (std::size_t i = 0; i < one_each.size(); ++i) one_each[i] = static_cast<char>(i);
  EXPECT_EQ(on_fiber([&] { return ::writev(p.a, parts.data(), 1024); }), (Outcome{1024, 0}));
  EXPECT_EQ(on_fiber([&] { return ::readv(p.b, back_parts.data(), 1024); }), (Outcome{1024, 0}));
  EXPECT_TRUE(back == one_each);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  std::fclose(file);
}

// Passes: a blocking connect with SO_SNDTIMEO to a listener whose queue is full (its SYNs are
// dropped) ends with EINPROGRESS after the timeout, on a fiber as on a thread; an accept with
// SO_RCVTIMEO and a receive on UDP with it end with EAGAIN.
TEST(HookReview, TimeoutsOnConnectAndOnUdp) {
  Listener full(0);
  std::vector<int> queued;
  timeval short_timeout{0, 200'000};
  auto connect_once = [&] {
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &short_timeout, sizeof short_timeout);
    queued.push_back(c);
    return ::connect(c, any_address(full.address), sizeof full.address);
  };
  for (int i = 0; i < 8 && connect_once() == 0; ++i) {
  }
  EXPECT_EQ(on_thread(connect_once), (Outcome{-1, EINPROGRESS}));
  EXPECT_EQ(on_fiber(connect_once), (Outcome{-1, EINPROGRESS}));
  for (int c : queued) ::close(c);
  Listener quiet;
  ASSERT_EQ(::setsockopt(quiet.fd, SOL_SOCKET, SO_RCVTIMEO, &short_timeout, sizeof short_timeout),
            0);
  auto accept = [&] { return ::accept(quiet.fd, nullptr, nullptr); };
  EXPECT_EQ(on_thread(accept), (Outcome{-1, EAGAIN}));
  EXPECT_EQ(on_fiber(accept), (Outcome{-1, EAGAIN}));
  Udp u;
  ASSERT_EQ(::setsockopt(u.a, SOL_SOCKET, SO_RCVTIMEO, &short_timeout, sizeof short_timeout), 0);
  char c;
  EXPECT_EQ(on_thread([&] { return ::recv(u.a, &c, 1, 0); }), (Outcome{-1, EAGAIN}));
  EXPECT_EQ(on_fiber([&] { return ::recv(u.a, &c, 1, 0); }), (Outcome{-1, EAGAIN}));
}

// Attack: connect called again, blocking, on a socket whose first connect ran out of time
// (SO_SNDTIMEO) while connecting: a listener with a full queue dropped its SYN; it makes room
// meanwhile. libc's second connect waits for the connection under way and returns 0 when the
// SYN is sent again (EALREADY only if its own timeout passes first).
// fixed (was a defect): a blocking connect retried on a socket still connecting (first ended by
// SO_SNDTIMEO, EINPROGRESS): the fiber's gets EALREADY from the O_NONBLOCK connect(2) and returns
// it where libc's waits and returns 0
TEST(HookReview, AConnectRetriedWhileConnectingWaitsForTheConnection) {
  auto scenario = [](bool fiber) {
    Listener full(0);
    int first = full.connected();  // backlog 0: the queue holds one, the next SYN is dropped
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval short_timeout{0, 200'000}, long_timeout{5, 0};
    EXPECT_EQ(::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &short_timeout, sizeof short_timeout), 0);
    std::thread accepter([&] {
      std::this_thread::sleep_for(300ms);
      ::close(::accept(full.fd, nullptr, nullptr));
    });
    auto outcomes = made_on(fiber, [&] {
      Outcome timed_out =
          outcome_of([&] { return ::connect(c, any_address(full.address), sizeof full.address); });
      ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &long_timeout, sizeof long_timeout);
      Outcome retried =
          outcome_of([&] { return ::connect(c, any_address(full.address), sizeof full.address); });
      return std::pair{timed_out, retried};
    });
    accepter.join();
    ::close(first);
    ::close(c);
    return outcomes;
  };
  auto libc = scenario(false);
  EXPECT_EQ(libc.first, (Outcome{-1, EINPROGRESS}));
  EXPECT_EQ(libc.second, (Outcome{0, 0}));
  auto hooked = scenario(true);
  EXPECT_EQ(hooked.first, libc.first);
  EXPECT_EQ(hooked.second, libc.second);
}

// Passes: stream corners on a fiber as on a thread: recvfrom's address length on a stream, an
// empty recv, a whole peek that waits for the rest, MSG_OOB with no urgent data, calls on a
// listener and on an unconnected socket.
TEST(HookReview, StreamCornersGiveWhatLibcGives) {
  auto ignored = ::signal(SIGPIPE, SIG_IGN);
  auto scenario = [](bool fiber) {
    Tcp s;
    Listener listener;
    int unconnected = ::socket(AF_INET, SOCK_STREAM, 0);
    std::vector<Outcome> seen;
    EXPECT_EQ(::write(s.b, "abc", 3), 3);
    std::thread later([&] {
      std::this_thread::sleep_for(30ms);
      EXPECT_EQ(::write(s.b, "def", 3), 3);
    });
    made_on(fiber, [&] {
      char buffer[16];
      sockaddr_in from{};
      socklen_t length = sizeof from;
      seen.push_back(outcome_of([&] { return ::recv(s.a, buffer, 0, 0); }));
      seen.push_back(outcome_of([&] { return ::recv(s.a, buffer, 6, MSG_PEEK | MSG_WAITALL); }));
      seen.push_back(outcome_of(
          [&] { return ::recvfrom(s.a, buffer, 6, MSG_WAITALL, any_address(from), &length); }));
      seen.push_back({static_cast<long>(length), 0});
      seen.push_back(outcome_of([&] { return ::recv(s.a, buffer, 1, MSG_OOB); }));
      seen.push_back(outcome_of([&] { return ::write(s.a, buffer, 0); }));
      seen.push_back(outcome_of([&] { return read_one(listener.fd); }));
      seen.push_back(outcome_of([&] { return ::write(listener.fd, "l", 1); }));
      seen.push_back(outcome_of([&] { return read_one(unconnected); }));
      seen.push_back(outcome_of([&] { return ::send(unconnected, "u", 1, 0); }));
      return 0;
    });
    later.join();
    ::close(unconnected);
    return seen;
  };
  std::vector<Outcome> libc = scenario(false);
  ASSERT_EQ(libc.size(), 10u);
  EXPECT_EQ(libc[1], (Outcome{6, 0}));
  EXPECT_EQ(libc[2], (Outcome{6, 0}));
  EXPECT_EQ(scenario(true), libc);
  ::signal(SIGPIPE, ignored);
}

// Attack: a fiber's blocking connect of a UDP socket (made through the hooks) while another
// thread receives on it. Connecting a UDP socket again is legal and common (a resolver's
// retries); the hooks make the socket non-blocking for each connect(2), and a blocking recv
// that starts in that moment says EAGAIN, which libc's never says on a blocking socket
// without a timeout.
// fixed (was a defect): (documented exception made visible) a fiber's connect() of a UDP socket
// sets O_NONBLOCK for the connect(2) call: a blocking recv on another thread at that moment says
// EAGAIN (thousands of times in 20k connects); a UDP connect never waits, so the toggle is needless
TEST(HookReview, ConnectingAUdpSocketOnAFiberLeavesItsReceiversBlocking) {
  Udp u;
  std::atomic<bool> done{false};
  std::atomic<int> eagain{0}, received{0};
  std::thread receiver([&] {
    char c;
    while (!done) {
      ssize_t n = ::recv(u.b, &c, 1, 0);
      if (n < 0 && errno == EAGAIN) ++eagain;
      if (n > 0) ++received;
    }
  });
  std::thread sender([&] {
    while (!done) {
      (void)::send(u.a, "s", 1, 0);
      std::this_thread::sleep_for(50us);
    }
    for (int i = 0; i < 100; ++i) (void)::send(u.a, "e", 1, 0);  // the receiver's last recv
  });
  EXPECT_FALSE(outstayed(10s, {[&] {
                           for (int i = 0; i < 20'000 && eagain == 0; ++i) {
                             EXPECT_EQ(::connect(u.b, any_address(u.address_a), sizeof u.address_a),
                                       0);
                           }
                           done = true;
                         }}));
  sender.join();
  receiver.join();
  EXPECT_GT(received.load(), 0);
  EXPECT_EQ(eagain.load(), 0) << "a blocking recv said EAGAIN while a fiber connected the socket";
}

}  // namespace spindle::hook_review
