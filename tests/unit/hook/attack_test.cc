// Cases found attacking the hooks (issue 69 items 10-15): descriptors closed across threads and
// workers, workers that end with registrations, fork, signals, several fibers on one socket,
// descriptors that arrive in a message. Each must end (no fiber parked for good, no worker
// held) and give what libc gives, or what the hooks document where libc would wait forever.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "hook_testing.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/worker.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::hook_testing;

// libc's poll does not notice a descriptor closed under it; the hooks end the wait with
// POLLNVAL, as a poll that starts after the close says.
TEST(HookAttack, AParkedPollEndsWhenAnotherThreadCloses) {
  Pair p;
  int fd = std::exchange(p.a, -1);
  std::thread closer([&] {
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(::close(fd), 0);
  });
  Watchdog hung(5s, [&] { ::shutdown(p.b, SHUT_RDWR); });
  auto took = on_one_worker({[&] {
    pollfd one{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&one, 1, -1), 1);
    EXPECT_NE(one.revents & POLLNVAL, 0);
  }});
  EXPECT_FALSE(hung.dismiss());
  closer.join();
  EXPECT_LT(took, 2s);
}

// The close comes from a fiber of another worker: the parked fiber's worker is told.
TEST(HookAttack, AFiberOfAnotherWorkerCloses) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  Pair p;
  int fd = std::exchange(p.a, -1);
  std::atomic<bool> parked{false};
  Watchdog hung(5s, [&] { ::shutdown(p.b, SHUT_RDWR); });
  runtime.block_on([&] {
    auto reader = spawn_on(runtime.worker(0), [&] {
      char c;
      parked = true;
      errno = 0;
      EXPECT_EQ(::read(fd, &c, 1), -1);
      EXPECT_EQ(errno, EBADF);
    });
    auto closer = spawn_on(runtime.worker(1), [&] {
      while (!parked) (void)this_fiber::sleep_for(1ms);
      (void)this_fiber::sleep_for(30ms);
      EXPECT_EQ(::close(fd), 0);
    });
    reader.join();
    closer.join();
  });
  EXPECT_FALSE(hung.dismiss());
}

// A worker that registered a descriptor ends; then a plain thread closes the descriptor and a
// new runtime uses its number. Nothing may point at the worker that is gone (ASan says so).
TEST(HookAttack, ADescriptorOutlivesTheWorkerThatWaitedOnIt) {
  Pair p;
  {
    Runtime gone(RuntimeOptions{.workers = 1});
    (void)on_runtime(gone, {[&] {
                              char c;
                              EXPECT_EQ(::read(p.a, &c, 1), 1);
                            },
                            [&] {
                              (void)this_fiber::sleep_for(20ms);
                              EXPECT_EQ(::write(p.b, "g", 1), 1);
                            }});
  }
  int number = p.a;
  EXPECT_EQ(::close(p.a), 0);
  Pair again;  // often at the same number
  p.a = -1;
  (void)on_one_worker({[&] {
                         char c;
                         EXPECT_EQ(::read(again.a, &c, 1), 1);
                         EXPECT_EQ(c, 'n');
                       },
                       [&] {
                         (void)this_fiber::sleep_for(20ms);
                         EXPECT_EQ(::write(again.b, "n", 1), 1);
                       }});
  (void)number;
}

// fork() on a fiber whose worker has descriptors registered: the child has none of its
// parent's threads, so its calls are libc's (a close must not post to a worker the child does
// not have, a read must not park: parked, the child would run its copy of the worker's loop,
// and with it the copies of the parent's other fibers; the watcher below ends such a child).
TEST(HookAttack, AChildForkedOnAFiberCallsLibc) {
  Pair p;
  int status = -1;
  const pid_t parent = ::getpid();
  std::atomic<bool> done{false};
  (void)on_one_worker({[&] {
                         while (!done) {
                           (void)this_fiber::sleep_for(1ms);
                           if (::getpid() != parent) ::_exit(3);  // a fiber run in the child
                         }
                       },
                       [&] {
                         char c;
                         EXPECT_EQ(::read(p.a, &c, 1), 1);  // registered with this worker
                         pid_t child = ::fork();
                         if (child == 0) {
                           // Blocking read on the child's thread, then close: both libc's.
                           char d = 0;
                           bool ok = ::read(p.a, &d, 1) == 1 && d == 'c' && ::close(p.a) == 0 &&
                                     ::write(p.b, "k", 1) == 1;
                           ::_exit(ok ? 0 : 1);
                         }
                         ASSERT_GT(child, 0);
                         (void)this_fiber::sleep_for(50ms);  // the child waits for it
                         EXPECT_EQ(::write(p.b, "c", 1), 1);
                         for (int i = 0; i < 500 && ::waitpid(child, &status, WNOHANG) == 0; ++i) {
                           (void)this_fiber::sleep_for(10ms);
                         }
                         if (::waitpid(child, &status, WNOHANG) == 0) {
                           ADD_FAILURE() << "the child never ended";
                           ::kill(child, SIGKILL);
                           ::waitpid(child, &status, 0);
                         }
                         EXPECT_EQ(::read(p.a, &c, 1), 1);  // the child's answer
                         EXPECT_EQ(c, 'k');
                         done = true;
                       },
                       [&] {
                         (void)this_fiber::sleep_for(20ms);
                         EXPECT_EQ(::write(p.b, "f", 1), 1);
                       }});
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

namespace {
std::atomic<int> g_signals{0};
void count_signal(int) { g_signals.fetch_add(1); }
}  // namespace

// Signals (a handler without SA_RESTART) hit the worker's thread while a fiber waits: the
// fiber's read neither ends early nor fails; it gets the byte.
TEST(HookAttack, SignalsOnTheWorkerDoNotEndAFibersRead) {
  struct sigaction action {
  }, before{};
  action.sa_handler = count_signal;
  ::sigemptyset(&action.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR1, &action, &before), 0);
  Pair p;
  pthread_t worker_thread{};
  std::atomic<bool> parked{false};
  std::thread signaller([&] {
    while (!parked) std::this_thread::sleep_for(1ms);
    for (int i = 0; i < 20; ++i) {
      ::pthread_kill(worker_thread, SIGUSR1);
      std::this_thread::sleep_for(2ms);
    }
    EXPECT_EQ(::write(p.b, "s", 1), 1);
  });
  (void)on_one_worker({[&] {
    worker_thread = ::pthread_self();
    parked = true;
    char c = 0;
    errno = 0;
    EXPECT_EQ(::read(p.a, &c, 1), 1) << "errno " << errno;
    EXPECT_EQ(c, 's');
  }});
  signaller.join();
  EXPECT_GT(g_signals.load(), 0);
  ::sigaction(SIGUSR1, &before, nullptr);
}

// Two fibers of one worker wait to read one socket (two threads may block in read on one
// socket): both get a byte.
TEST(HookAttack, TwoFibersReadOneSocket) {
  Pair p;
  Watchdog hung(5s, [&] { ::shutdown(p.b, SHUT_RDWR); });
  auto reader = [&] {
    char c = 0;
    EXPECT_EQ(::read(p.a, &c, 1), 1);
  };
  auto took = on_one_worker({reader, reader, [&] {
                               (void)this_fiber::sleep_for(30ms);
                               EXPECT_EQ(::write(p.b, "1", 1), 1);
                               (void)this_fiber::sleep_for(30ms);
                               EXPECT_EQ(::write(p.b, "2", 1), 1);
                             }});
  EXPECT_FALSE(hung.dismiss());
  EXPECT_LT(took, 2s);
}

// Fibers of two workers wait on one socket: one worker's reactor has it, the other looks.
TEST(HookAttack, FibersOfTwoWorkersReadOneSocket) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  Pair p;
  Watchdog hung(5s, [&] { ::shutdown(p.b, SHUT_RDWR); });
  runtime.block_on([&] {
    std::vector<JoinHandle<void>> readers;
    for (std::size_t w : {0, 1}) {
      readers.push_back(spawn_on(runtime.worker(w), [&] {
        char c = 0;
        EXPECT_EQ(::read(p.a, &c, 1), 1);
      }));
    }
    (void)this_fiber::sleep_for(30ms);
    EXPECT_EQ(::write(p.b, "ab", 2), 2);
    for (auto& r : readers) r.join();
  });
  EXPECT_FALSE(hung.dismiss());
}

// A duplicate closed while a fiber waits on the original: the original is still open, so the
// wait goes on and gets the byte (only the closed number's waits end).
TEST(HookAttack, ClosingADuplicateLeavesTheOriginalWaiting) {
  Pair p;
  int copy = ::dup(p.a);
  ASSERT_GE(copy, 0);
  auto took = on_one_worker({[&] {
                               char c = 0;
                               EXPECT_EQ(::read(p.a, &c, 1), 1);
                               EXPECT_EQ(c, 'o');
                             },
                             [&] {
                               (void)this_fiber::sleep_for(20ms);
                               EXPECT_EQ(::close(copy), 0);
                               (void)this_fiber::sleep_for(20ms);
                               EXPECT_EQ(::write(p.b, "o", 1), 1);
                             }});
  EXPECT_LT(took, 2s);
}

// A descriptor that arrives in a message (SCM_RIGHTS) lands on a number whose last descriptor
// was made non-blocking and closed where no hook saw it: it is recorded as new there, so a
// fiber's read of it parks instead of holding the worker.
TEST(HookAttack, ADescriptorReceivedInAMessageIsNewAtItsNumber) {
  Pair channel, carried, old;
  int number = std::exchange(old.a, -1);
  ASSERT_EQ(::fcntl(number, F_SETFL, O_NONBLOCK), 0);
  ASSERT_EQ(raw_close(number), 0);
  // Send carried.a; the receiver's copy takes the lowest free number: `number`, if no lower
  // one is free (made so by holding the ones below).
  std::vector<int> holes;
  for (;;) {
    int fd = ::open("/dev/null", O_RDONLY);
    ASSERT_GE(fd, 0);
    if (fd >= number) {
      raw_close(fd);  // (unseen: the entry at `number` stays the old descriptor's)
      break;
    }
    holes.push_back(fd);
  }
  char byte = 'x';
  iovec part{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&message);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &carried.a, sizeof(int));
  ASSERT_EQ(::sendmsg(channel.b, &message, 0), 1);
  std::memset(control, 0, sizeof control);
  message.msg_controllen = sizeof control;
  ASSERT_EQ(::recvmsg(channel.a, &message, 0), 1);
  int received = -1;
  std::memcpy(&received, CMSG_DATA(CMSG_FIRSTHDR(&message)), sizeof(int));
  for (int fd : holes) ::close(fd);
  ASSERT_EQ(received, number);
  Watchdog hung(3s, [&] { (void)::send(carried.b, "w", 1, MSG_NOSIGNAL); });
  auto took = on_one_worker({[&] {
                               char got = 0;
                               EXPECT_EQ(::read(received, &got, 1), 1);
                               EXPECT_EQ(got, 'r');
                             },
                             [&] {
                               (void)this_fiber::sleep_for(30ms);
                               EXPECT_EQ(::send(carried.b, "r", 1, MSG_NOSIGNAL), 1);
                             }});
  EXPECT_FALSE(hung.dismiss()) << "the read held the worker";
  EXPECT_LT(took, 2s);
  ::close(received);
}
