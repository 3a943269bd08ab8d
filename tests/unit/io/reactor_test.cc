#include "spindle/io/reactor.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

using namespace std::chrono_literals;
using spindle::IoSlot;
using spindle::Reactor;
using spindle::UniqueFd;

namespace {
struct SocketPair {
  UniqueFd a, b;
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
};
}  // namespace

TEST(Reactor, ReportsReadabilityOfARegisteredDescriptor) {
  Reactor reactor;
  SocketPair pair;
  auto slot = reactor.add(pair.a.get());
  ASSERT_TRUE(slot.has_value());
  // Drain the initial writability edge.
  (void)reactor.poll(0ms, [](IoSlot&, std::uint32_t) {});
  ASSERT_EQ(::write(pair.b.get(), "x", 1), 1);
  bool readable = false;
  (void)reactor.poll(1000ms, [&](IoSlot& s, std::uint32_t events) {
    EXPECT_EQ(&s, *slot);
    readable = events & EPOLLIN;
  });
  EXPECT_TRUE(readable);
  reactor.release(*slot);
}

TEST(Reactor, IsEdgeTriggeredSoUnconsumedDataIsReportedOnce) {
  Reactor reactor;
  SocketPair pair;
  auto slot = reactor.add(pair.a.get());
  ASSERT_TRUE(slot.has_value());
  (void)reactor.poll(0ms, [](IoSlot&, std::uint32_t) {});
  ASSERT_EQ(::write(pair.b.get(), "x", 1), 1);
  int events = 0;
  (void)reactor.poll(1000ms, [&](IoSlot&, std::uint32_t) { ++events; });
  (void)reactor.poll(0ms, [&](IoSlot&, std::uint32_t) { ++events; });
  EXPECT_EQ(events, 1);
  reactor.release(*slot);
}

TEST(Reactor, DropsEventsQueuedForAReleasedSlot) {
  Reactor reactor;
  SocketPair pair;
  auto slot = reactor.add(pair.a.get());
  ASSERT_TRUE(slot.has_value());
  ASSERT_EQ(::write(pair.b.get(), "x", 1), 1);
  // The descriptor stays open (as when another process shares it), but the slot is released:
  // its queued events must not reach the slot's next owner.
  reactor.release(*slot);
  int events = 0;
  (void)reactor.poll(0ms, [&](IoSlot&, std::uint32_t) { ++events; });
  EXPECT_EQ(events, 0);
}

TEST(Reactor, ReusesReleasedSlots) {
  Reactor reactor;
  SocketPair first, second;
  auto a = reactor.add(first.a.get());
  ASSERT_TRUE(a.has_value());
  reactor.release(*a);
  first.a.reset();
  auto b = reactor.add(second.a.get());
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(reactor.registered(), 1u);
  reactor.release(*b);
}

TEST(Reactor, AddFailsForAnInvalidDescriptor) {
  Reactor reactor;
  auto slot = reactor.add(-1);
  ASSERT_FALSE(slot.has_value());
  EXPECT_EQ(slot.error(), std::errc::bad_file_descriptor);
  EXPECT_EQ(reactor.registered(), 0u);
}

TEST(Reactor, WakeFromAnotherThreadInterruptsABlockingPoll) {
  Reactor reactor;
  std::thread waker([&] {
    std::this_thread::sleep_for(20ms);
    reactor.wake();
  });
  auto start = std::chrono::steady_clock::now();
  auto n = reactor.poll(std::chrono::milliseconds(10'000), [](IoSlot&, std::uint32_t) {});
  waker.join();
  EXPECT_TRUE(n.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(Reactor, ManyWakesAreCoalescedAndTheNextWakeStillWorks) {
  Reactor reactor;
  for (int i = 0; i < 100; ++i) reactor.wake();
  (void)reactor.poll(0ms, [](IoSlot&, std::uint32_t) {});
  std::thread waker([&] {
    std::this_thread::sleep_for(10ms);
    reactor.wake();
  });
  auto start = std::chrono::steady_clock::now();
  (void)reactor.poll(std::chrono::milliseconds(10'000), [](IoSlot&, std::uint32_t) {});
  waker.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(Reactor, WatchesWritabilityOnlyOnceAsked) {
  Reactor reactor;
  SocketPair pair;
  auto slot = reactor.add(pair.a.get());
  ASSERT_TRUE(slot.has_value());
  std::uint32_t seen = 0;
  (void)reactor.poll(0ms, [&](IoSlot&, std::uint32_t events) { seen |= events; });
  EXPECT_FALSE(seen & EPOLLOUT);  // writable, but nobody asked: no wake-ups per ACK
  EXPECT_FALSE(reactor.watch_writable(**slot));
  seen = 0;
  (void)reactor.poll(1000ms, [&](IoSlot&, std::uint32_t events) { seen |= events; });
  EXPECT_TRUE(seen & EPOLLOUT);  // already writable: reported right after the change
  EXPECT_FALSE(reactor.watch_writable(**slot));  // idempotent
  reactor.release(*slot);
}
