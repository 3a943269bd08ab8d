// Micro-benchmarks of the fiber runtime, each next to the same operation done with ucontext or
// pthreads in the same run. bench/micro.py turns the pairs into ratios.
//
// Names: BM_<Operation>/<impl>. Every spindle benchmark has a peer with the same <Operation>.
#include <benchmark/benchmark.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <ucontext.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/io/timer_queue.h"
#include "spindle/sync/channel.h"
#include "spindle/sync/mutex.h"

using namespace spindle;

namespace {

// Runs `body` in a fiber of a one-worker runtime (the benchmark state is used from there).
template <typename Fn>
void in_fiber(Fn&& body) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.block_on(std::forward<Fn>(body));
}

// ---- switch: two contexts handing control back and forth -------------------------------------

void BM_Switch_spindle(benchmark::State& state) {
  in_fiber([&] {
    bool done = false;
    auto partner = spawn([&] {
      while (!done) this_fiber::yield();
    });
    for (auto _ : state) this_fiber::yield();  // to the partner and back: two switches
    done = true;
    partner.join();
  });
  state.SetItemsProcessed(state.iterations() * 2);
}
BENCHMARK(BM_Switch_spindle)->UseRealTime();

ucontext_t g_main_context, g_partner_context;

void partner_body() {
  for (;;) swapcontext(&g_partner_context, &g_main_context);
}

void BM_Switch_ucontext(benchmark::State& state) {
  std::vector<char> stack(64 * 1024);
  getcontext(&g_partner_context);
  g_partner_context.uc_stack.ss_sp = stack.data();
  g_partner_context.uc_stack.ss_size = stack.size();
  g_partner_context.uc_link = nullptr;
  makecontext(&g_partner_context, partner_body, 0);
  for (auto _ : state) swapcontext(&g_main_context, &g_partner_context);  // two switches
  state.SetItemsProcessed(state.iterations() * 2);
}
BENCHMARK(BM_Switch_ucontext)->UseRealTime();

// ---- spawn + join ----------------------------------------------------------------------------

void BM_SpawnJoin_spindle(benchmark::State& state) {
  in_fiber([&] {
    for (auto _ : state) spawn([] {}).join();
  });
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SpawnJoin_spindle)->UseRealTime();

void BM_SpawnJoin_pthread(benchmark::State& state) {
  for (auto _ : state) {
    pthread_t thread;
    pthread_create(
        &thread, nullptr, [](void*) -> void* { return nullptr; }, nullptr);
    pthread_join(thread, nullptr);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SpawnJoin_pthread)->UseRealTime();

// ---- channel ping-pong: a message there and one back ----------------------------------------

void BM_ChannelPingPong_spindle(benchmark::State& state) {
  in_fiber([&] {
    Channel<int> ping(1), pong(1);
    auto echo = spawn([&] {
      while (auto v = ping.receive()) (void)pong.send(*v);
    });
    for (auto _ : state) {
      (void)ping.send(1);
      benchmark::DoNotOptimize(pong.receive());
    }
    ping.close();
    echo.join();
  });
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ChannelPingPong_spindle)->UseRealTime();

// A blocking queue of the usual std::mutex + std::condition_variable kind, between threads.
class ThreadQueue {
 public:
  void push(int v) {
    {
      std::lock_guard lock(mutex_);
      items_.push_back(v);
    }
    ready_.notify_one();
  }
  int pop() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return !items_.empty(); });
    int v = items_.front();
    items_.pop_front();
    return v;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<int> items_;
};

void BM_ChannelPingPong_pthread(benchmark::State& state) {
  ThreadQueue ping, pong;
  std::thread echo([&] {
    for (int v; (v = ping.pop()) >= 0;) pong.push(v);
  });
  for (auto _ : state) {
    ping.push(1);
    benchmark::DoNotOptimize(pong.pop());
  }
  ping.push(-1);
  echo.join();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ChannelPingPong_pthread)->UseRealTime();

// ---- uncontended lock + unlock ---------------------------------------------------------------

void BM_MutexUncontended_spindle(benchmark::State& state) {
  Mutex mutex;
  for (auto _ : state) {
    mutex.lock();
    benchmark::ClobberMemory();
    mutex.unlock();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MutexUncontended_spindle);

void BM_MutexUncontended_pthread(benchmark::State& state) {
  pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
  for (auto _ : state) {
    pthread_mutex_lock(&mutex);
    benchmark::ClobberMemory();
    pthread_mutex_unlock(&mutex);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MutexUncontended_pthread);

// ---- timer insert + cancel, with 10,000 other timers pending ---------------------------------

void BM_TimerInsertCancel_spindle(benchmark::State& state) {
  TimerQueue queue;
  std::vector<Timer> pending(10'000);
  auto now = Clock::now();
  for (std::size_t i = 0; i < pending.size(); ++i) {
    pending[i].when = now + std::chrono::milliseconds(i % 5000);
    queue.push(&pending[i]);
  }
  Timer timer;
  std::int64_t i = 0;
  for (auto _ : state) {
    timer.when = now + std::chrono::milliseconds(++i % 5000);
    queue.push(&timer);
    queue.erase(&timer);
  }
  for (auto& t : pending) queue.erase(&t);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TimerInsertCancel_spindle);

void BM_TimerInsertCancel_pthread(benchmark::State& state) {
  // POSIX per-process timers: arm and disarm (the kernel keeps them in its own timer tree).
  sigevent event{};
  event.sigev_notify = SIGEV_NONE;
  timer_t timer;
  timer_create(CLOCK_MONOTONIC, &event, &timer);
  itimerspec arm{}, disarm{};
  std::int64_t i = 0;
  for (auto _ : state) {
    arm.it_value.tv_sec = 1 + (++i % 5);
    timer_settime(timer, 0, &arm, nullptr);
    timer_settime(timer, 0, &disarm, nullptr);
  }
  timer_delete(timer);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TimerInsertCancel_pthread);

}  // namespace

BENCHMARK_MAIN();
