// A descriptor closed by another thread while a fiber uses it (issue 69 item 10). libc survives
// every such race: a call that starts after the close says EBADF, one in progress ends with
// what the file gives (EOF once the peer is gone), and a number reused at once is simply the
// new descriptor. The hooks must do no worse: never crash, never leave the fiber parked.
// Each round closes at a different moment (a random spin), hundreds of rounds per call.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "hook_testing.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::hook_testing;

namespace {

// What the fiber calls on the descriptor, over and over, until the descriptor is gone.
enum class Use { kRead, kRecv, kGetFlags, kSetFlags, kPoll, kWrite };

// One call on `fd`: true once it says the descriptor is gone or at its end (EBADF, EOF, data
// of a new descriptor at that number). A result libc could not give fails the test.
bool use_once(Use use, int fd) {
  char c = 0;
  errno = 0;
  switch (use) {
    case Use::kRead:
    case Use::kRecv: {
      ssize_t n = use == Use::kRead ? ::read(fd, &c, 1) : ::recv(fd, &c, 1, 0);
      if (n < 0) {
        EXPECT_EQ(errno, EBADF);
      } else if (n > 0) {
        EXPECT_EQ(c, 'n') << "data no descriptor at that number was sent";
      }
      return true;
    }
    case Use::kGetFlags:
    case Use::kSetFlags: {
      int flags = ::fcntl(fd, F_GETFL);
      if (flags >= 0 && use == Use::kSetFlags) flags = ::fcntl(fd, F_SETFL, flags);
      if (flags >= 0) return false;
      EXPECT_EQ(errno, EBADF);
      return true;
    }
    case Use::kPoll: {
      pollfd p{fd, POLLIN, 0};
      int n = ::poll(&p, 1, -1);
      EXPECT_EQ(n, 1);  // POLLNVAL once closed, POLLIN/POLLHUP at the end of either file
      return true;
    }
    case Use::kWrite: {
      ssize_t n = ::send(fd, "w", 1, MSG_NOSIGNAL);
      if (n >= 0) return false;
      EXPECT_TRUE(errno == EBADF || errno == EPIPE || errno == ECONNRESET) << errno;
      return true;
    }
  }
  return true;
}

// Rounds of: a fiber uses one end of a fresh pair while a plain thread, after a random spin,
// closes it, makes a new pair (its number is often the one just closed) with data and an end
// on it, and ends the old peer. Each round must end within seconds.
void race(Use use, bool reuse, int rounds) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::mt19937 random(static_cast<unsigned>(use) * 7919 + reuse);
  for (int round = 0; round < rounds; ++round) {
    Pair p;
    int fd = std::exchange(p.a, -1);
    int spin = std::uniform_int_distribution<int>(0, 400)(random);
    std::atomic<bool> started{false}, done{false};
    int fresh[2] = {-1, -1};
    std::thread closer([&] {
      while (!started.load()) std::this_thread::yield();
      for (auto until = Clock::now() + std::chrono::microseconds(spin); Clock::now() < until;) {
      }
      EXPECT_EQ(::close(fd), 0);
      if (reuse) {
        ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fresh), 0);
        EXPECT_EQ(::write(fresh[1], "n", 1), 1);
        ::shutdown(fresh[1], SHUT_WR);
      }
      ::shutdown(p.b, SHUT_RDWR);
      done = true;
    });
    Watchdog hung(10s, [&] {
      std::fprintf(stderr, "round %d of use %d: the fiber never came back\n", round,
                   static_cast<int>(use));
      std::abort();
    });
    runtime.block_on([&] {
      started = true;
      // (A number reused at once may never say EBADF: then the calls end with the thread.)
      while (!use_once(use, fd) && !(reuse && done.load())) {
        if (round % 2 == 0) this_fiber::yield();
      }
    });
    hung.dismiss();
    closer.join();
    for (int f : fresh) {
      if (f >= 0) ::close(f);
    }
  }
}

}  // namespace

TEST(HookCloseRace, ReadsEndWithEbadfOrEof) { race(Use::kRead, false, 400); }
TEST(HookCloseRace, ReceivesEndWithEbadfOrEof) { race(Use::kRecv, false, 400); }
TEST(HookCloseRace, FlagsSayEbadfOnceClosed) {
  race(Use::kGetFlags, false, 400);
  race(Use::kSetFlags, false, 400);
}
TEST(HookCloseRace, PollSaysSoOnceClosed) { race(Use::kPoll, false, 400); }
TEST(HookCloseRace, WritesSayEbadfOnceClosed) { race(Use::kWrite, false, 400); }
TEST(HookCloseRace, ANumberReusedAtOnceIsTheNewDescriptor) {
  race(Use::kRead, true, 300);
  race(Use::kGetFlags, true, 300);
  race(Use::kPoll, true, 300);
}

// The fiber is parked when the other thread closes: it wakes with EBADF (libc's read would go
// on waiting on the file and end with EOF when the peer goes: the hooks end it at the close).
// At the close, not when the parked fiber next looks again at its registration (250 ms after
// it parked): the bound tells the two apart.
TEST(HookCloseRace, AParkedReadWakesWhenAnotherThreadCloses) {
  Pair p;
  int fd = std::exchange(p.a, -1);
  std::thread closer([&] {
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(::close(fd), 0);
  });
  Watchdog hung(5s, [&] { ::shutdown(p.b, SHUT_RDWR); });
  auto took = on_one_worker({[&] {
    char c;
    errno = 0;
    EXPECT_EQ(::read(fd, &c, 1), -1);
    EXPECT_EQ(errno, EBADF);
  }});
  EXPECT_FALSE(hung.dismiss());
  closer.join();
  EXPECT_LT(took, 200ms);
}
