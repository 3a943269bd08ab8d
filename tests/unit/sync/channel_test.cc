#include "spindle/sync/channel.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;

FIBER_TEST(Channel, DeliversInFifoOrder) {
  Channel<int> channel(4);
  auto producer = spawn([&] {
    for (int i = 0; i < 100; ++i) EXPECT_FALSE(channel.send(i));
    channel.close();
  });
  std::vector<int> got;
  while (auto v = channel.receive()) got.push_back(*v);
  producer.join();
  std::vector<int> expected(100);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(got, expected);
}

FIBER_TEST(Channel, BoundedSendWaitsForRoom) {
  Channel<int> channel(1);
  ASSERT_FALSE(channel.send(1));
  EXPECT_FALSE(channel.try_send(2));
  EXPECT_EQ(channel.send(2, Deadline::after(10ms)), std::errc::timed_out);
  auto sender = spawn([&] { return channel.send(3, Deadline::after(10s)); });
  (void)this_fiber::sleep_for(5ms);
  EXPECT_EQ(channel.receive().value(), 1);
  EXPECT_FALSE(sender.join());
  EXPECT_EQ(channel.receive().value(), 3);
}

FIBER_TEST(Channel, UnboundedSendNeverWaits) {
  Channel<std::string> channel;
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(channel.try_send(std::to_string(i)));
  EXPECT_EQ(channel.size(), 10000u);
}

FIBER_TEST(Channel, ReceiveDrainsAfterCloseThenFailsWithClosed) {
  Channel<int> channel(8);
  ASSERT_FALSE(channel.send(1));
  ASSERT_FALSE(channel.send(2));
  channel.close();
  EXPECT_EQ(channel.send(3), channel_closed());
  EXPECT_EQ(channel.receive().value(), 1);
  EXPECT_EQ(channel.receive().value(), 2);
  auto end = channel.receive();
  ASSERT_FALSE(end.has_value());
  EXPECT_EQ(end.error(), channel_closed());
}

FIBER_TEST(Channel, CloseWakesBlockedReceiversOnOtherWorkers) {
  Channel<int> channel;
  auto& runtime = Worker::current()->runtime();
  auto receiver = spawn_on(runtime.worker(1), [&] { return channel.receive().error(); });
  (void)this_fiber::sleep_for(5ms);
  channel.close();
  EXPECT_EQ(receiver.join(), channel_closed());
}

FIBER_TEST(Channel, ReceiveTimesOutAndCanBeCancelled) {
  Channel<int> channel;
  EXPECT_EQ(channel.receive(Deadline::after(5ms)).error(), std::errc::timed_out);
  auto receiver = spawn([&] { return channel.receive().error(); });
  (void)this_fiber::sleep_for(5ms);
  receiver.request_stop();
  EXPECT_EQ(receiver.join(), std::errc::operation_canceled);
  // Nothing was lost: a later send is still received.
  ASSERT_FALSE(channel.send(7));
  EXPECT_EQ(channel.receive().value(), 7);
}

FIBER_TEST(Channel, ManyProducersAndConsumersAcrossWorkersLoseNothing) {
  constexpr int kProducers = 8, kConsumers = 8, kItems = 5000;
  Channel<int> channel(16);
  auto& runtime = Worker::current()->runtime();
  std::vector<JoinHandle<long>> consumers;
  for (int c = 0; c < kConsumers; ++c) {
    consumers.push_back(spawn_on(runtime.worker(c % 2), [&] {
      long sum = 0;
      while (auto v = channel.receive()) sum += *v;
      return sum;
    }));
  }
  std::vector<JoinHandle<void>> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.push_back(spawn_on(runtime.worker(p % 2), [&] {
      for (int i = 1; i <= kItems; ++i) ASSERT_FALSE(channel.send(i));
    }));
  }
  for (auto& p : producers) p.join();
  channel.close();
  long total = 0;
  for (auto& c : consumers) total += c.join();
  EXPECT_EQ(total, long{kProducers} * kItems * (kItems + 1) / 2);
}

TEST(Channel, WorksBetweenAPlainThreadAndAFiber) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  Channel<std::unique_ptr<int>> channel(2);
  runtime.start();
  auto consumer = spawn_on(runtime.worker(0), [&] {
    int sum = 0;
    while (auto v = channel.receive()) sum += **v;
    return sum;
  });
  for (int i = 1; i <= 100; ++i) ASSERT_FALSE(channel.send(std::make_unique<int>(i)));
  channel.close();
  EXPECT_EQ(consumer.join(), 5050);
}
