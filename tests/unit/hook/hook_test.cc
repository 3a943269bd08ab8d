// The opt-in hooks: blocking libc calls park the calling fiber, not its worker; anywhere else
// they are libc's. Each test runs its fibers on ONE worker: a call that blocked the thread
// would stop every other fiber, and the timings (or a watchdog) would show it.
#include "spindle/hook/hook.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "hook_testing.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::hook_testing;

TEST(Hook, IsLinked) { EXPECT_TRUE(hook::linked()); }

TEST(Hook, ABlockingReadParksOnlyItsFiber) {
  Pair p;
  // If the read held the thread, the writer fiber could never run: the watchdog writes after
  // 3 s so that the test ends, and the time shows it.
  std::mutex lock;
  std::condition_variable ended;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock guard(lock);
    if (!ended.wait_for(guard, 3s, [&] { return done; })) {
      (void)::send(p.b, "w", 1, MSG_NOSIGNAL);
    }
  });
  char got = 0;
  auto took = on_one_worker({[&] { EXPECT_EQ(::read(p.a, &got, 1), 1); },
                             [&] {
                               (void)this_fiber::sleep_for(50ms);
                               EXPECT_EQ(::write(p.b, "x", 1), 1);
                             }});
  {
    std::lock_guard guard(lock);
    done = true;
  }
  ended.notify_all();
  watchdog.join();
  EXPECT_EQ(got, 'x');
  EXPECT_LT(took, 1s);
}

TEST(Hook, OnAPlainThreadEveryCallIsLibcs) {
  Pair p;
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(::write(p.b, "y", 1), 1);
  });
  char got = 0;
  EXPECT_EQ(::recv(p.a, &got, 1, 0), 1);  // blocks this thread, as libc's does
  writer.join();
  EXPECT_EQ(got, 'y');
  EXPECT_EQ(::fcntl(p.a, F_GETFL) & O_NONBLOCK, 0);
}

TEST(Hook, ASocketItsUserMadeNonBlockingSaysEagain) {
  Pair p;
  (void)on_one_worker({[&] {
    char c;
    // A blocking socket the hooks made non-blocking underneath still looks blocking.
    std::thread later([&] {
      std::this_thread::sleep_for(30ms);
      (void)::send(p.b, "z", 1, MSG_NOSIGNAL);
    });
    EXPECT_EQ(::read(p.a, &c, 1), 1);
    later.join();
    EXPECT_EQ(::fcntl(p.a, F_GETFL) & O_NONBLOCK, 0);
    // Now the user asks for O_NONBLOCK: EAGAIN at once, as it expects.
    EXPECT_EQ(::fcntl(p.a, F_SETFL, ::fcntl(p.a, F_GETFL) | O_NONBLOCK), 0);
    EXPECT_NE(::fcntl(p.a, F_GETFL) & O_NONBLOCK, 0);
    errno = 0;
    EXPECT_EQ(::read(p.a, &c, 1), -1);
    EXPECT_EQ(errno, EAGAIN);
    // And back to blocking through ioctl(FIONBIO): the read waits again.
    int off = 0;
    EXPECT_EQ(::ioctl(p.a, FIONBIO, &off), 0);
    EXPECT_EQ(::fcntl(p.a, F_GETFL) & O_NONBLOCK, 0);
    std::thread again([&] {
      std::this_thread::sleep_for(30ms);
      (void)::send(p.b, "q", 1, MSG_NOSIGNAL);
    });
    EXPECT_EQ(::recv(p.a, &c, 1, 0), 1);
    EXPECT_EQ(c, 'q');
    again.join();
  }});
}

TEST(Hook, AReceiveTimeoutEndsTheWaitWithEagainAndOthersRunMeanwhile) {
  Pair p;
  timeval timeout{0, 150'000};
  ASSERT_EQ(::setsockopt(p.a, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout), 0);
  std::atomic<int> ticks{0};
  std::atomic<bool> done{false};
  auto took = on_one_worker({[&] {
                               char c;
                               auto started = Clock::now();
                               errno = 0;
                               EXPECT_EQ(::read(p.a, &c, 1), -1);
                               EXPECT_EQ(errno, EAGAIN);
                               EXPECT_GE(Clock::now() - started, 140ms);
                               done = true;
                             },
                             [&] {
                               while (!done) {
                                 ++ticks;
                                 (void)this_fiber::sleep_for(10ms);
                               }
                             }});
  EXPECT_LT(took, 1s);
  EXPECT_GE(ticks.load(), 5);  // the other fiber kept running
}

TEST(Hook, ClosingADescriptorWakesTheFiberParkedOnIt) {
  Pair p;
  int fd = p.a;
  p.a = -1;  // closed by the test
  auto took = on_one_worker({[&] {
                               char c;
                               errno = 0;
                               EXPECT_EQ(::read(fd, &c, 1), -1);
                               EXPECT_EQ(errno, EBADF);
                             },
                             [&] {
                               (void)this_fiber::sleep_for(50ms);
                               EXPECT_EQ(::close(fd), 0);
                             }});
  EXPECT_LT(took, 1s);
}

TEST(Hook, SleepsParkTheFiber) {
  std::vector<std::function<void()>> fibers;
  for (int i = 0; i < 100; ++i) {
    fibers.push_back([i] {
      if (i % 3 == 0) {
        EXPECT_EQ(::usleep(100'000), 0);
      } else if (i % 3 == 1) {
        timespec t{0, 100'000'000};
        EXPECT_EQ(::nanosleep(&t, nullptr), 0);
      } else {
        timespec t{0, 100'000'000};
        EXPECT_EQ(::clock_nanosleep(CLOCK_MONOTONIC, 0, &t, nullptr), 0);
      }
    });
  }
  auto took = on_one_worker(std::move(fibers));
  EXPECT_GE(took, 95ms);
  EXPECT_LT(took, 600ms);  // 100 x 100 ms, at once
}

TEST(Hook, PollAndSelectParkUntilOneIsReady) {
  Pair x, y;
  auto took = on_one_worker({[&] {
                               pollfd fds[2] = {{x.a, POLLIN, 0}, {y.a, POLLIN, 0}};
                               EXPECT_EQ(::poll(fds, 2, 2000), 1);
                               EXPECT_EQ(fds[0].revents, 0);
                               EXPECT_NE(fds[1].revents & POLLIN, 0);
                               fd_set readable;
                               FD_ZERO(&readable);
                               FD_SET(x.a, &readable);
                               timeval t{2, 0};
                               EXPECT_EQ(::select(x.a + 1, &readable, nullptr, nullptr, &t), 1);
                               EXPECT_TRUE(FD_ISSET(x.a, &readable));
                               // Nothing ready: the timeout.
                               pollfd none{x.b, POLLIN, 0};
                               EXPECT_EQ(::poll(&none, 1, 50), 0);
                             },
                             [&] {
                               (void)this_fiber::sleep_for(30ms);
                               EXPECT_EQ(::write(y.b, "1", 1), 1);
                               (void)this_fiber::sleep_for(30ms);
                               EXPECT_EQ(::write(x.b, "2", 1), 1);
                             }});
  EXPECT_LT(took, 1s);
}

TEST(Hook, AcceptAndConnectOnBlockingSocketsPark) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(listener, 8), 0);
  socklen_t size = sizeof address;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size);
  auto took = on_one_worker(
      {[&] {
         int accepted = ::accept(listener, nullptr, nullptr);
         ASSERT_GE(accepted, 0);
         char c = 0;
         EXPECT_EQ(::recv(accepted, &c, 1, 0), 1);
         EXPECT_EQ(c, 'h');
         ::close(accepted);
       },
       [&] {
         (void)this_fiber::sleep_for(30ms);
         int client = ::socket(AF_INET, SOCK_STREAM, 0);
         ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
         EXPECT_EQ(::send(client, "h", 1, 0), 1);
         ::close(client);
       }});
  ::close(listener);
  EXPECT_LT(took, 1s);
}

TEST(Hook, ADuplicateKeepsTheUsersView) {
  Pair p;
  (void)on_one_worker({[&] {
    int copy = ::dup(p.a);
    ASSERT_GE(copy, 0);
    std::thread writer([&] {
      std::this_thread::sleep_for(30ms);
      (void)::send(p.b, "d", 1, MSG_NOSIGNAL);
    });
    char c = 0;
    EXPECT_EQ(::read(copy, &c, 1), 1);
    writer.join();
    EXPECT_EQ(::fcntl(copy, F_GETFL) & O_NONBLOCK, 0);
    EXPECT_EQ(::fcntl(p.a, F_GETFL) & O_NONBLOCK, 0);
    ::close(copy);
  }});
}

TEST(Hook, ARegularFileIsReadAsLibcReadsIt) {
  char path[] = "/tmp/spindle-hook-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "file", 4), 4);
  (void)on_one_worker({[&] {
    char buffer[8] = {};
    EXPECT_EQ(::pread(fd, buffer, sizeof buffer, 0), 4);
    ::lseek(fd, 0, SEEK_SET);
    EXPECT_EQ(::read(fd, buffer, sizeof buffer), 4);
    EXPECT_EQ(std::string(buffer, 4), "file");
    EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);  // never touched
  }});
  ::close(fd);
  ::unlink(path);
}

TEST(Hook, GetaddrinfoResolvesOnAHelperThread) {
  std::atomic<int> ticks{0};
  std::atomic<bool> done{false};
  (void)on_one_worker({[&] {
                         addrinfo hints{};
                         hints.ai_socktype = SOCK_STREAM;
                         addrinfo* found = nullptr;
                         EXPECT_EQ(::getaddrinfo("localhost", "80", &hints, &found), 0);
                         ASSERT_NE(found, nullptr);
                         ::freeaddrinfo(found);
                         done = true;
                       },
                       [&] {
                         while (!done) {
                           ++ticks;
                           (void)this_fiber::sleep_for(1ms);
                         }
                       }});
  EXPECT_TRUE(done.load());
}
