// The hooks keep the program's view of each descriptor's flags, and the kernel's flags are the
// program's: MSG_DONTWAIT asks for one call not to wait (issue 69 item 11); a copy made by
// fcntl(F_DUPFD) is a duplicate like dup's (item 12); a fiber's write to a socket the hooks
// did not make (stderr on a journal stream) leaves its open file description's flags alone, so
// that plain code sharing it (stdio) still blocks (item 14).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
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

// Fills `fd`'s send path until a non-waiting send says EAGAIN; the bytes it took.
std::size_t fill(int fd) {
  std::vector<char> chunk(64 * 1024, 'f');
  std::size_t sent = 0;
  for (;;) {
    ssize_t n = ::send(fd, chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      EXPECT_EQ(errno, EAGAIN);
      return sent;
    }
    sent += static_cast<std::size_t>(n);
  }
}

// Reads `count` bytes of `fd` on a plain thread.
void drain(int fd, std::size_t count) {
  std::vector<char> buffer(64 * 1024);
  while (count > 0) {
    ssize_t n = ::read(fd, buffer.data(), std::min(buffer.size(), count));
    if (n <= 0) {
      ADD_FAILURE() << "drain: " << n << " errno " << errno;
      return;
    }
    count -= static_cast<std::size_t>(n);
  }
}

}  // namespace

TEST(HookFlags, MsgDontwaitOnABlockingSocketSaysEagainAtOnce) {
  Pair p;
  Watchdog hung(3s, [&] { (void)::send(p.b, "x", 1, MSG_NOSIGNAL); });
  auto took = on_one_worker({[&] {
    char c;
    errno = 0;
    EXPECT_EQ(::recv(p.a, &c, 1, MSG_DONTWAIT), -1);
    EXPECT_EQ(errno, EAGAIN);
    msghdr message{};
    iovec part{&c, 1};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    errno = 0;
    EXPECT_EQ(::recvmsg(p.a, &message, MSG_DONTWAIT), -1);
    EXPECT_EQ(errno, EAGAIN);
    // And a send that cannot go out now: EAGAIN, not a wait for the peer to read.
    std::size_t filled = fill(p.a);
    EXPECT_GT(filled, 0u);
    errno = 0;
    EXPECT_EQ(::send(p.a, "y", 1, MSG_DONTWAIT | MSG_NOSIGNAL), -1);
    EXPECT_EQ(errno, EAGAIN);
    // The socket itself still blocks: a plain recv waits for the peer's byte.
    std::thread later([&] {
      std::this_thread::sleep_for(30ms);
      (void)::send(p.b, "z", 1, MSG_NOSIGNAL);
    });
    EXPECT_EQ(::recv(p.a, &c, 1, 0), 1);
    EXPECT_EQ(c, 'z');
    later.join();
  }});
  EXPECT_FALSE(hung.dismiss()) << "a MSG_DONTWAIT call waited";
  EXPECT_LT(took, 2s);
}

TEST(HookFlags, ACopyMadeByFcntlDupfdIsADuplicate) {
  for (int command : {F_DUPFD, F_DUPFD_CLOEXEC}) {
    Pair p;
    int copy = -1;
    auto took = on_one_worker({[&] {
      // A cooperative read first: whatever the hooks keep about the descriptor is in place.
      std::thread later([&] {
        std::this_thread::sleep_for(20ms);
        (void)::send(p.b, "1", 1, MSG_NOSIGNAL);
      });
      char c;
      EXPECT_EQ(::read(p.a, &c, 1), 1);
      later.join();
      copy = ::fcntl(p.a, command, 100);
      ASSERT_GE(copy, 100);
      EXPECT_EQ(::fcntl(copy, F_GETFL) & O_NONBLOCK, 0) << "the copy shows O_NONBLOCK";
      EXPECT_EQ(raw_flags(copy) & O_NONBLOCK, 0);
      EXPECT_EQ(::fcntl(copy, F_GETFD) & FD_CLOEXEC, command == F_DUPFD_CLOEXEC ? FD_CLOEXEC : 0);
      // The copy reads blocking, on the fiber.
      std::thread again([&] {
        std::this_thread::sleep_for(20ms);
        (void)::send(p.b, "2", 1, MSG_NOSIGNAL);
      });
      errno = 0;
      EXPECT_EQ(::read(copy, &c, 1), 1) << "errno " << errno;
      again.join();
    }});
    EXPECT_LT(took, 2s);
    // And on a plain thread, as libc reads it.
    std::thread later([&] {
      std::this_thread::sleep_for(20ms);
      (void)::send(p.b, "3", 1, MSG_NOSIGNAL);
    });
    char c = 0;
    errno = 0;
    EXPECT_EQ(::read(copy, &c, 1), 1) << "errno " << errno;
    EXPECT_EQ(c, '3');
    later.join();
    // Its user makes the copy non-blocking: the original is too (one open file description).
    EXPECT_EQ(::fcntl(copy, F_SETFL, O_NONBLOCK), 0);
    EXPECT_NE(::fcntl(p.a, F_GETFL) & O_NONBLOCK, 0);
    ::close(copy);
  }
}

// The program inherited a socket as its stderr (systemd's journal stream): the hooks never
// made it, so they never touch its flags, however a fiber writes to it; plain stdio on it
// blocks until the reader takes the line, as it always did.
TEST(HookFlags, AFibersWriteLeavesAnInheritedSocketsFlagsAlone) {
  int fds[2];
  ASSERT_EQ(raw_socketpair(SOCK_STREAM, fds), 0);  // made where no hook saw it
  int journal = fds[0], reader = fds[1];
  std::size_t filled = 0;
  auto took = on_one_worker({[&] {
                               EXPECT_EQ(::write(journal, "one line\n", 9), 9);
                               filled = fill(journal);
                               // A blocking write that must wait for the reader: parks.
                               EXPECT_EQ(::write(journal, "another line\n", 13), 13);
                             },
                             [&] {
                               (void)this_fiber::sleep_for(30ms);
                               EXPECT_EQ(raw_flags(journal) & O_NONBLOCK, 0);
                               drain(reader, 9 + filled);
                             }});
  EXPECT_LT(took, 2s);
  EXPECT_EQ(raw_flags(journal) & O_NONBLOCK, 0) << "the hooks changed an inherited descriptor";
  drain(reader, 13);
  // stdio on a plain thread: every line written, none lost to EAGAIN.
  filled = fill(journal);
  FILE* out = ::fdopen(::dup(journal), "w");
  ASSERT_NE(out, nullptr);
  std::thread reading([&] { drain(reader, filled + 1024 * 10); });
  int failed = 0;
  for (int i = 0; i < 1024; ++i) failed += std::fprintf(out, "%09d\n", i) < 0;
  failed += std::fflush(out) != 0;
  reading.join();
  EXPECT_EQ(failed, 0);
  std::fclose(out);
  raw_close(journal);
  raw_close(reader);
}

// The same for sockets the hooks made: their flags are the program's, however fibers use them.
TEST(HookFlags, TheKernelsFlagsAreAlwaysTheProgramsOwn) {
  Pair p;
  auto took = on_one_worker({[&] {
                               char c;
                               EXPECT_EQ(::read(p.a, &c, 1), 1);
                               EXPECT_EQ(raw_flags(p.a) & O_NONBLOCK, 0);
                               EXPECT_EQ(::fcntl(p.a, F_SETFL, O_NONBLOCK), 0);
                               EXPECT_NE(raw_flags(p.a) & O_NONBLOCK, 0);
                               int off = 0;
                               EXPECT_EQ(::ioctl(p.a, FIONBIO, &off), 0);
                               EXPECT_EQ(raw_flags(p.a) & O_NONBLOCK, 0);
                               EXPECT_EQ(::read(p.a, &c, 1), 1);
                             },
                             [&] {
                               (void)this_fiber::sleep_for(20ms);
                               EXPECT_EQ(raw_flags(p.a) & O_NONBLOCK, 0);
                               EXPECT_EQ(::write(p.b, "a", 1), 1);
                               (void)this_fiber::sleep_for(20ms);
                               EXPECT_EQ(::write(p.b, "b", 1), 1);
                             }});
  EXPECT_LT(took, 2s);
}

// The copy lands on a number whose last descriptor the program had made non-blocking and
// closed where no hook saw it: the copy is recorded as what it is (a blocking socket), so a
// fiber's read of it parks instead of holding the worker.
TEST(HookFlags, ACopyIsRecordedAtItsNumber) {
  for (int command : {F_DUPFD, F_DUPFD_CLOEXEC, -1}) {
    SCOPED_TRACE(command);
    Pair old, fresh;
    int number = std::exchange(old.a, -1);
    ASSERT_EQ(::fcntl(number, F_SETFL, O_NONBLOCK), 0);
    ASSERT_EQ(raw_close(number), 0);
    int copy = command < 0 ? ::dup2(fresh.a, number) : ::fcntl(fresh.a, command, number);
    ASSERT_EQ(copy, number);
    Watchdog hung(3s, [&] { (void)::send(fresh.b, "w", 1, MSG_NOSIGNAL); });
    auto took = on_one_worker({[&] {
                                 char c = 0;
                                 errno = 0;
                                 EXPECT_EQ(::read(copy, &c, 1), 1) << "errno " << errno;
                                 EXPECT_EQ(c, 'r');
                               },
                               [&] {
                                 (void)this_fiber::sleep_for(30ms);
                                 EXPECT_EQ(::send(fresh.b, "r", 1, MSG_NOSIGNAL), 1);
                               }});
    EXPECT_FALSE(hung.dismiss()) << "the read held the worker";
    EXPECT_LT(took, 2s);
    ::close(copy);
  }
}

// A blocking connect on a fiber waits cooperatively; the socket is blocking before and after.
TEST(HookFlags, AConnectOnAFiberLeavesTheSocketBlocking) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t size = sizeof address;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size), 0);
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  (void)on_one_worker({[&] {
    EXPECT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(raw_flags(client) & O_NONBLOCK, 0);
    // Refused: the same error as libc's, and still blocking.
    int refused = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in nobody = address;
    ::close(listener);
    errno = 0;
    EXPECT_EQ(::connect(refused, reinterpret_cast<sockaddr*>(&nobody), sizeof nobody), -1);
    EXPECT_EQ(errno, ECONNREFUSED);
    EXPECT_EQ(raw_flags(refused) & O_NONBLOCK, 0);
    ::close(refused);
  }});
  EXPECT_EQ(raw_flags(client) & O_NONBLOCK, 0);
  ::close(client);
}
