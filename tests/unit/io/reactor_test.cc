#include "spindle/io/reactor.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

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

TEST(Reactor, TrimDropsTheEmptyTailOfTheSlotTableAndStaleEventsStayDropped) {
  // 300 registrations (two blocks of 256 slots), eventfds but for the last, a socket that
  // can be made readable: about 600 descriptors in all.
  Reactor reactor;
  SocketPair last;
  std::vector<UniqueFd> fds;
  auto registered = [&](std::size_t count, int final_fd) {
    std::vector<IoSlot*> slots;
    for (std::size_t i = 0; i + 1 < count; ++i) {
      fds.emplace_back(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
      slots.push_back(reactor.add(fds.back().get()).value());
    }
    if (final_fd >= 0) slots.push_back(reactor.add(final_fd).value());
    (void)reactor.poll(0ms, [](IoSlot&, std::uint32_t) {});  // the writability edges
    return slots;
  };
  std::vector<IoSlot*> slots = registered(300, last.a.get());
  EXPECT_FALSE(reactor.trimmable());
  // All but the first go; the last one's descriptor stays open and registered.
  for (std::size_t i = 1; i < slots.size(); ++i) reactor.release(slots[i]);
  EXPECT_TRUE(reactor.trimmable());
  EXPECT_EQ(reactor.trim(), 256 * sizeof(IoSlot));
  EXPECT_FALSE(reactor.trimmable());
  EXPECT_EQ(reactor.registered(), 1u);
  // New registrations take the lowest free index, then grow the table back over the dropped
  // block: the slot at the old last index has a generation no stale cookie carries.
  std::vector<IoSlot*> fresh = registered(300, -1);
  EXPECT_EQ(fresh.front()->index, 1u);
  EXPECT_EQ(fresh.back()->index, 299u);
  ASSERT_EQ(::write(last.b.get(), "x", 1), 1);
  int events = 0;
  (void)reactor.poll(100ms, [&](IoSlot&, std::uint32_t) { ++events; });
  EXPECT_EQ(events, 0);
  for (IoSlot* s : fresh) reactor.release(s);
  reactor.release(slots[0]);
}
