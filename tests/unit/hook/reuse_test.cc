// A descriptor closed where the hooks may not see it (fclose of an fdopen'd socket,
// close_range, dup2 over it, a bare close system call), its number then taken by a new
// blocking socket the hooks did not make either (issue 69 item 13). Whatever the hooks kept
// about the old descriptor must not decide how the new one reads: a fiber's read parks and
// gets the peer's byte (it never holds the worker, never waits forever), a thread's read is
// libc's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "hook_testing.h"
#include "spindle/fiber/this_fiber.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::hook_testing;

namespace {

enum class Closer { kFcloseOfFdopen, kCloseRange, kDup2Over, kBareSystemCall };

void close_by(Closer closer, int fd) {
  switch (closer) {
    case Closer::kFcloseOfFdopen: {
      FILE* f = ::fdopen(fd, "r+");
      ASSERT_NE(f, nullptr);
      ASSERT_EQ(std::fclose(f), 0);
      return;
    }
    case Closer::kCloseRange:
      ASSERT_EQ(::close_range(fd, fd, 0), 0);
      return;
    case Closer::kDup2Over: {
      int other = ::open("/dev/null", O_RDONLY);
      ASSERT_EQ(::dup2(other, fd), fd);
      ::close(other);
      return;
    }
    case Closer::kBareSystemCall:
      ASSERT_EQ(raw_close(fd), 0);
      return;
  }
}

// How the old descriptor was used before it went.
enum class Before { kParkedOnAFiber, kMadeNonBlocking };

// The old descriptor at `number` (its peer `old_peer`), used as `before` says, then closed by
// `closer`; a new pair made where no hook sees it, one end moved to `number`. The new peer.
int reuse(Runtime& runtime, int number, int old_peer, Before before, Closer closer) {
  if (before == Before::kParkedOnAFiber) {
    (void)on_runtime(runtime, {[&] {
                                 char c;
                                 EXPECT_EQ(::read(number, &c, 1), 1);
                               },
                               [&] {
                                 (void)this_fiber::sleep_for(20ms);
                                 EXPECT_EQ(::send(old_peer, "o", 1, MSG_NOSIGNAL), 1);
                               }});
  } else {
    EXPECT_EQ(::fcntl(number, F_SETFL, O_NONBLOCK), 0);
    (void)on_runtime(runtime, {[&] {
                       char c;
                       errno = 0;
                       EXPECT_EQ(::read(number, &c, 1), -1);
                       EXPECT_EQ(errno, EAGAIN);
                     }});
  }
  close_by(closer, number);
  int fresh[2];
  EXPECT_EQ(raw_socketpair(SOCK_STREAM, fresh), 0);
  if (fresh[0] != number) raw_move(fresh[0], number);
  return fresh[1];
}

void new_socket_at_old_number_reads_blocking(Before before, Closer closer) {
  // One worker throughout: what it registered for the old descriptor is still there.
  Runtime runtime(RuntimeOptions{.workers = 1});
  Pair old;
  int number = old.a;
  int peer = reuse(runtime, number, old.b, before, closer);
  Watchdog hung(3s, [&] { (void)::send(peer, "w", 1, MSG_NOSIGNAL); });
  auto took = on_runtime(runtime, {[&] {
                                     char c = 0;
                                     errno = 0;
                                     EXPECT_EQ(::read(number, &c, 1), 1) << "errno " << errno;
                                     EXPECT_EQ(c, 'n');
                                   },
                                   [&] {
                                     (void)this_fiber::sleep_for(30ms);
                                     EXPECT_EQ(::send(peer, "n", 1, MSG_NOSIGNAL), 1);
                                   }});
  EXPECT_FALSE(hung.dismiss()) << "the read held the worker";
  EXPECT_LT(took, 1500ms);
  // A plain thread: libc's blocking read.
  std::thread later([&] {
    std::this_thread::sleep_for(20ms);
    (void)::send(peer, "t", 1, MSG_NOSIGNAL);
  });
  char c = 0;
  EXPECT_EQ(::read(number, &c, 1), 1);
  EXPECT_EQ(c, 't');
  later.join();
  ::close(peer);  // (the Pair closes the new socket at `number`)
}

}  // namespace

TEST(HookReuse, AfterFcloseOfFdopen) {
  new_socket_at_old_number_reads_blocking(Before::kParkedOnAFiber, Closer::kFcloseOfFdopen);
  new_socket_at_old_number_reads_blocking(Before::kMadeNonBlocking, Closer::kFcloseOfFdopen);
}

TEST(HookReuse, AfterCloseRange) {
  new_socket_at_old_number_reads_blocking(Before::kParkedOnAFiber, Closer::kCloseRange);
  new_socket_at_old_number_reads_blocking(Before::kMadeNonBlocking, Closer::kCloseRange);
}

TEST(HookReuse, AfterDup2OverIt) {
  new_socket_at_old_number_reads_blocking(Before::kParkedOnAFiber, Closer::kDup2Over);
  new_socket_at_old_number_reads_blocking(Before::kMadeNonBlocking, Closer::kDup2Over);
}

// Not even the close is seen: what the hooks registered for the old socket is found stale
// when the fiber has waited a while (the hooks look again at a parked descriptor now and
// then), and the read goes on with the new one.
TEST(HookReuse, AfterABareCloseSystemCall) {
  new_socket_at_old_number_reads_blocking(Before::kParkedOnAFiber, Closer::kBareSystemCall);
}

// The number is reused while a fiber is parked on it, by paths no hook sees: the read ends
// (EBADF, EOF, or the new socket's data: the number's new descriptor), it does not hang.
TEST(HookReuse, UnderAParkedFiber) {
  Pair old;
  int number = old.a;
  int fresh[2] = {-1, -1};
  std::thread thread([&] {
    std::this_thread::sleep_for(50ms);
    ASSERT_EQ(raw_close(number), 0);
    ASSERT_EQ(raw_socketpair(SOCK_STREAM, fresh), 0);
    if (fresh[0] != number) raw_move(fresh[0], number);
    (void)::send(fresh[1], "n", 1, MSG_NOSIGNAL);
    ::shutdown(old.b, SHUT_RDWR);
  });
  Watchdog hung(5s, [&] { (void)::send(fresh[1], "w", 1, MSG_NOSIGNAL); });
  auto took = on_one_worker({[&] {
    char c = 0;
    errno = 0;
    ssize_t n = ::read(number, &c, 1);
    EXPECT_TRUE(n == 0 || (n == -1 && errno == EBADF) || (n == 1 && c == 'n'))
        << n << " errno " << errno;
  }});
  EXPECT_FALSE(hung.dismiss());
  thread.join();
  EXPECT_LT(took, 3s);
  ::close(fresh[1]);
}
