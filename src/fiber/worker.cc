#include "spindle/fiber/worker.h"

#include <malloc.h>

#include <cassert>
#include <optional>

#include "sanitizer.h"
#include "spindle/base/block_cache.h"
#include "spindle/base/log.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/waiter.h"
#include "spindle/io/bare_recv.h"
#include "stack_overflow.h"

namespace spindle {
namespace {

// Heap worth a malloc_trim (a walk of every arena) once given back.
constexpr std::size_t kWorthTrimming = 256 * 1024;

thread_local Worker* t_current_worker = nullptr;

}  // namespace

Worker* Worker::current() { return t_current_worker; }

Worker::Worker(Runtime& runtime, std::size_t index, const RuntimeOptions& options)
    : runtime_(&runtime),
      index_(index),
      stacks_(options.stack_size, options.stack_cache, options.huge_page_stacks) {
  trim_timer_.owner = this;
  trim_timer_.on_fire = [](Timer& timer) {
    (void)static_cast<Worker*>(timer.owner)->trim_idle_memory();
  };
}

Worker::~Worker() {
  assert(!thread_.joinable());
  // Fibers spawned onto a worker that never ran them: drop the worker's references.
  for (Fiber* f = inbox_fibers_head_; f;) {
    Fiber* next = f->next_ready_;
    if (!f->started_) f->release();
    f = next;
  }
}

void Worker::start() {
  thread_ = std::thread([this] { loop(); });
}

void Worker::request_stop() {
  stop_requested_.store(true, std::memory_order_release);
  reactor_.wake();
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::post(Task task) {
  inbox_lock_.lock();
  inbox_tasks_.push_back(std::move(task));
  inbox_nonempty_.store(true, std::memory_order_release);
  inbox_lock_.unlock();
  reactor_.wake();
}

void Worker::schedule(Fiber* fiber) {
  if (t_current_worker == this) {
    if (fiber->started_) {
      scheduler_.push(fiber);
    } else {
      start_fiber(fiber);
    }
    return;
  }
  inbox_lock_.lock();
  fiber->next_ready_ = nullptr;
  if (inbox_fibers_tail_) {
    inbox_fibers_tail_->next_ready_ = fiber;
  } else {
    inbox_fibers_head_ = fiber;
  }
  inbox_fibers_tail_ = fiber;
  inbox_nonempty_.store(true, std::memory_order_release);
  inbox_lock_.unlock();
  reactor_.wake();
}

void Worker::start_fiber(Fiber* fiber) {
  fiber->started_ = true;
  if (stopping_) fiber->stop_.store(true, std::memory_order_release);
  try {
    fiber->stack_ = stacks_.allocate(fiber->stack_size_);
  } catch (...) {
    // The spawner learns of it from join(), wherever it spawned from.
    fail_start(fiber, std::current_exception());
    return;
  }
  Scheduler::prepare(fiber);
  fiber->tsan_fiber_ = sanitizer::tsan_create();
  fiber->next_live_ = live_head_;
  if (live_head_) live_head_->prev_live_ = fiber;
  live_head_ = fiber;
  ++live_count_;
  if (fiber->run_next_) {
    scheduler_.push_front(fiber);
  } else {
    scheduler_.push(fiber);
  }
}

void Worker::fail_start(Fiber* fiber, std::exception_ptr error) {
  // Once a second at most, with the cause: a shortage makes many spawns fail at once.
  ++failed_starts_;
  auto now = Clock::now();
  if (now - last_start_failure_log_ >= std::chrono::seconds(1)) {
    last_start_failure_log_ = now;
    std::string cause = "unknown";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      cause = e.what();
    } catch (...) {
    }
    log_error("worker {}: {} fiber(s) could not start: no stack: {}", index_, failed_starts_,
              cause);
    failed_starts_ = 0;
  }
  fiber->error_ = std::move(error);
  fiber->finish();
  fiber->release();
}

void Worker::retire_fiber(Fiber* fiber) {
  if (fiber->prev_live_) {
    fiber->prev_live_->next_live_ = fiber->next_live_;
  } else {
    live_head_ = fiber->next_live_;
  }
  if (fiber->next_live_) fiber->next_live_->prev_live_ = fiber->prev_live_;
  --live_count_;
  // The fiber has left its stack for good: it can go back to the pool at once.
  stacks_.deallocate(std::exchange(fiber->stack_, Stack{}));
  fiber->release();
}

void Worker::cancel_all() {
  for (Fiber* f = live_head_; f; f = f->next_live_) {
    f->stop_.store(true, std::memory_order_release);
    f->cancel_wait();
  }
}

void Worker::drain_inbox() {
  inbox_lock_.lock();
  std::swap(inbox_tasks_, running_tasks_);
  Fiber* fiber = std::exchange(inbox_fibers_head_, nullptr);
  inbox_fibers_tail_ = nullptr;
  inbox_nonempty_.store(false, std::memory_order_relaxed);
  inbox_lock_.unlock();

  while (fiber) {
    Fiber* next = fiber->next_ready_;
    if (fiber->started_) {
      scheduler_.push(fiber);
    } else {
      start_fiber(fiber);
    }
    fiber = next;
  }
  for (Task& task : running_tasks_) {
    try {
      task();
    } catch (const std::exception& e) {
      log_error("worker {}: posted task threw: {}", index_, e.what());
    } catch (...) {
      log_error("worker {}: posted task threw an exception of unknown type", index_);
    }
  }
  running_tasks_.clear();
}

void Worker::run_ready() {
  // Fibers switch among themselves; after this many switches control comes back here, so
  // that I/O and timers are never starved by fibers that keep yielding.
  constexpr std::size_t kSwitchBudget = 64;
  scheduler_.run(std::max(scheduler_.ready(), kSwitchBudget));
}

void Worker::withdraw(RoundEndTask& task) {
  if (!task.queued) return;
  task.queued = false;
  std::erase(round_end_, &task);
}

void Worker::run_round_end() {
  // A task wakes fibers at most (they run in the next round): none is queued meanwhile.
  for (RoundEndTask* task : round_end_) {
    task->queued = false;
    task->run(*task);
  }
  round_end_.clear();
}

void Worker::fire_timers(Clock::time_point now) {
  while (Timer* timer = timers_.pop_due(now)) {
    if (Waiter* waiter = timer->waiter) {
      if (waiter->claim(WakeReason::kTimedOut)) waiter->wake();
    } else if (timer->on_fire) {
      timer->on_fire(*timer);
    }
  }
}

void Worker::wake_reader(IoSlot& slot) {
  Waiter* waiter = std::exchange(slot.reader, nullptr);
  ReadAhead* ahead = std::exchange(slot.read_ahead, nullptr);
  if (!waiter->claim(WakeReason::kNotified)) return;
  if (ahead != nullptr) {
    const ssize_t n = bare_recv(slot.fd, ahead->buffer.data(), ahead->buffer.size());
    ahead->result = n;
    ahead->error = n < 0 ? errno : 0;
    ahead->done = true;
  }
  waiter->wake();
}

void Worker::wake_io(Waiter*& parked) {
  if (Waiter* waiter = std::exchange(parked, nullptr)) {
    if (waiter->claim(WakeReason::kNotified)) waiter->wake();
  }
}

std::chrono::milliseconds Worker::poll_timeout(Clock::time_point now) const {
  using std::chrono::milliseconds;
  if (scheduler_.ready() > 0 || inbox_nonempty_.load(std::memory_order_acquire)) {
    return milliseconds(0);
  }
  // While stopping, wake up now and then to report fibers that ignore cancellation.
  milliseconds cap = stopping_ ? milliseconds(1000) : milliseconds(-1);
  const std::optional<Clock::time_point> next = timers_.next_deadline();
  if (!next) return cap;
  if (*next <= now) return milliseconds(0);
  // Round up: waking a little late is fine, waking early only spins.
  auto left = std::chrono::ceil<milliseconds>(*next - now);
  return cap.count() >= 0 ? std::min(left, cap) : left;
}

void Worker::poll(std::chrono::milliseconds timeout) {
  ++polls_;
  auto polled = reactor_.poll(timeout, [](IoSlot& slot, std::uint32_t events) {
    // (Urgent data wakes a reader too: a hooked poll for POLLPRI waits as one.)
    if (events & (EPOLLIN | EPOLLPRI | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      slot.drained = false;
      if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) slot.hung_up = true;
      if (slot.reader) {
        wake_reader(slot);
      } else if (slot.on_readable) {
        // An idle connection: no fiber waits; the callback starts one (it must not release
        // other slots: events for them may follow in this batch).
        std::exchange(slot.on_readable, nullptr)(slot);
      }
    }
    if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) wake_io(slot.writer);
  });
  polled_at_ = Clock::now();
  if (!polled) log_error("worker {}: epoll_wait failed: {}", index_, polled.error().message());
}

void Worker::keep_trimmed(std::shared_ptr<IdleCache> cache) {
  idle_caches_.push_back(std::move(cache));
}

bool Worker::holds_idle_memory() const {
  if (released_ >= kWorthTrimming || reactor_.trimmable() || stacks_.over_floor() ||
      buffers_.over_floor() || detail::blocks_over_floor()) {
    return true;
  }
  for (const auto& cache : idle_caches_) {
    if (cache->over_floor()) return true;
  }
  return false;
}

std::size_t Worker::trim_idle_memory() {
  // Stacks are unmapped: their pages go back at once.
  std::size_t stacks = stacks_.trim();
  std::size_t heap = buffers_.trim() + detail::trim_blocks() + reactor_.trim();
  // A cache only the worker still holds belongs to something gone (a stopped server).
  std::erase_if(idle_caches_, [](const auto& cache) { return cache.use_count() == 1; });
  for (const auto& cache : idle_caches_) heap += cache->trim();
  // What other layers freed counts once the worker is quiet (few fibers started in the last
  // second): while connections come and go, their memory is about to be reused anyway.
  FiberId seq = fiber_seq_.load(std::memory_order_relaxed);
  constexpr FiberId kQuiet = 64;
  if (seq - std::exchange(seq_at_trim_, seq) < kQuiet) heap += std::exchange(released_, 0);
  // Freed heap blocks stay in malloc's arenas as resident pages until trimmed; after a burst
  // that is most of the memory. malloc_trim gives whole free pages back (every arena).
  if (heap >= kWorthTrimming) ::malloc_trim(0);
  return stacks + heap;
}

void Worker::loop() {
  // Runnable rounds between two looks at timers and the reactor.
  constexpr int kRoundsPerPoll = 8;
  t_current_worker = this;
  AltSignalStack alt_stack;
  int busy_rounds = 0;
  for (;;) {
    if (inbox_nonempty_.load(std::memory_order_acquire)) drain_inbox();
    if (!stopping_ && stop_requested_.load(std::memory_order_acquire)) {
      stopping_ = true;
      stop_started_ = Clock::now();
      cancel_all();
    }
    run_ready();
    if (!round_end_.empty()) run_round_end();
    if (stopping_ && live_count_ == 0 && !inbox_nonempty_.load(std::memory_order_acquire)) break;
    // While fibers are runnable, keep running them and look at timers and sockets only every
    // few rounds: an epoll_wait per round would cost more than the rounds themselves.
    if (scheduler_.ready() > 0 && ++busy_rounds < kRoundsPerPoll) continue;
    busy_rounds = 0;
    auto now = Clock::now();
    fire_timers(now);
    if (stopping_ && !stop_warned_ && now - stop_started_ > std::chrono::seconds(5)) {
      stop_warned_ = true;
      log_warn("worker {}: {} fiber(s) still running 5 s after stop; they ignore cancellation",
               index_, live_count_);
    }
    // Pools over their floor are trimmed a second from now (and then every second until they
    // are not): an idle worker with nothing to give back has no timer at all.
    if (!trim_timer_.queued() && holds_idle_memory()) {
      trim_timer_.when = now + std::chrono::seconds(1);
      timers_.push(&trim_timer_);
    }
    poll(poll_timeout(now));
  }
  timers_.erase(&trim_timer_);
  t_current_worker = nullptr;
}

}  // namespace spindle
