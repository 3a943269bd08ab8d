#include "spindle/fiber/fiber.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <climits>
#include <thread>

#include "sanitizer.h"
#include "spindle/base/block_cache.h"
#include "spindle/base/intrusive_ptr.h"
#include "spindle/base/log.h"
#include "spindle/fiber/fiber_local.h"
#include "spindle/fiber/io_wait.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/waiter.h"
#include "spindle/fiber/worker.h"

namespace spindle {
namespace {

// Thread waiters sleep on the waiter's state word.
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, Deadline deadline) {
  timespec ts{};
  timespec* timeout = nullptr;
  if (deadline.is_finite()) {
    auto left = deadline.when() - Clock::now();
    if (left <= Clock::duration::zero()) return;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    ts.tv_sec = ns / 1'000'000'000;
    ts.tv_nsec = ns % 1'000'000'000;
    timeout = &ts;
  }
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected,
            timeout, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
}

}  // namespace

// ---- Fiber -----------------------------------------------------------------------------------

Fiber::Fiber(Worker& worker, SpawnOptions options)
    : worker_(&worker),
      id_(worker.next_fiber_id()),
      stack_size_(options.stack_size),
      run_next_(options.run_next) {}

void* Fiber::operator new(std::size_t size) { return take_block(size); }

void Fiber::operator delete(void* p, std::size_t size) { give_block(p, size); }

Fiber::~Fiber() {
  for (auto it = locals_.rbegin(); it != locals_.rend(); ++it) it->destroy(it->value);
  sanitizer::tsan_destroy(tsan_fiber_);
}

bool Fiber::finished() const {
  std::lock_guard lock(join_lock_);
  return done_;
}

void Fiber::main() {
  run_body();
  // Fiber-locals die on the fiber, while it can still park in their destructors.
  while (!locals_.empty()) {
    Local local = locals_.back();
    locals_.pop_back();
    local.destroy(local.value);
  }
  finish();
}

void Fiber::finish() {
  join_lock_.lock();
  done_ = true;
  Waiter* joiner = std::exchange(joiner_, nullptr);
  bool unobserved_error = detached_ && error_;
  join_lock_.unlock();
  if (joiner) joiner->notify();
  if (unobserved_error) log_unobserved_error();
}

void Fiber::log_unobserved_error() const {
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    log_error("fiber {:#x} ended by an exception: {}", id_, e.what());
  } catch (...) {
    log_error("fiber {:#x} ended by an exception of unknown type", id_);
  }
}

void Fiber::wait_finished() {
  Waiter waiter;
  join_lock_.lock();
  if (done_) {
    join_lock_.unlock();
    return;
  }
  assert(joiner_ == nullptr && "a fiber can be joined once");
  joiner_ = &waiter;
  (void)park(waiter, Deadline::never(), kNotCancellable, AfterSwitch::unlock(join_lock_));
}

void Fiber::detach() {
  join_lock_.lock();
  detached_ = true;
  bool unobserved_error = done_ && error_;
  join_lock_.unlock();
  if (unobserved_error) log_unobserved_error();
}

void Fiber::request_stop() {
  if (stop_.exchange(true, std::memory_order_acq_rel)) return;
  if (Worker::current() == worker_) {
    cancel_wait();
  } else {
    worker_->post([self = IntrusivePtr<Fiber>(this)] { self->cancel_wait(); });
  }
}

void Fiber::cancel_wait() {
  if (cancellable_wait_ && cancellable_wait_->claim(WakeReason::kCanceled)) {
    cancellable_wait_->wake();
  }
}

// ---- Waiter and park -------------------------------------------------------------------------

Waiter::Waiter() : fiber_(current_fiber()) { timer.waiter = this; }

void Waiter::wake(Fiber* owner) {
  if (owner) {
    owner->worker().schedule(owner);
  } else {
    futex_wake_all(&state_);
  }
}

std::error_code wake_error(WakeReason reason) {
  switch (reason) {
    case WakeReason::kNotified:
      return {};
    case WakeReason::kTimedOut:
      return std::make_error_code(std::errc::timed_out);
    case WakeReason::kCanceled:
      return std::make_error_code(std::errc::operation_canceled);
    case WakeReason::kWaiting:
      break;
  }
  assert(false && "woken waiter without a reason");
  return std::make_error_code(std::errc::state_not_recoverable);
}

std::error_code park(Waiter& waiter, Deadline deadline, bool cancellable, AfterSwitch after) {
  Fiber* fiber = waiter.fiber_;
  if (!fiber) {
    // A plain thread sleeps on the waiter's state word; claim() changes it before the wake.
    after();
    constexpr auto kWaiting = static_cast<std::uint32_t>(WakeReason::kWaiting);
    while (waiter.state_.load(std::memory_order_acquire) == kWaiting) {
      if (deadline.expired()) {
        waiter.claim(WakeReason::kTimedOut);  // loses to a notifier that got there first
        break;
      }
      futex_wait(&waiter.state_, kWaiting, deadline);
    }
    return wake_error(waiter.reason());
  }

  // Already decided: do not park at all.
  if ((cancellable && fiber->stop_requested() && waiter.claim(WakeReason::kCanceled)) ||
      (deadline.expired() && waiter.claim(WakeReason::kTimedOut))) {
    after();
    return wake_error(waiter.reason());
  }
  Worker& worker = fiber->worker();
  if (deadline.is_finite()) {
    waiter.timer.when = deadline.when();
    worker.timers().push(&waiter.timer);
  }
  if (cancellable) fiber->cancellable_wait_ = &waiter;
  worker.scheduler().suspend(after);
  fiber->cancellable_wait_ = nullptr;
  worker.timers().erase(&waiter.timer);
  return wake_error(waiter.reason());
}

// ---- this_fiber ------------------------------------------------------------------------------

Fiber* current_fiber() {
  Worker* worker = Worker::current();
  return worker ? worker->scheduler().current() : nullptr;
}

void detail::on_next_suspend(void (*hook)(void*), void* arg) {
  if (Fiber* fiber = current_fiber()) {
    fiber->suspend_hook_ = hook;
    fiber->suspend_hook_arg_ = arg;
  }
}

namespace this_fiber {

FiberId id() {
  Fiber* fiber = current_fiber();
  return fiber ? fiber->id() : 0;
}

void yield() {
  Fiber* fiber = current_fiber();
  if (!fiber) {
    std::this_thread::yield();
    return;
  }
  Scheduler& scheduler = fiber->worker().scheduler();
  scheduler.push(fiber);
  scheduler.suspend();
}

bool stop_requested() {
  Fiber* fiber = current_fiber();
  return fiber && fiber->stop_requested();
}

std::error_code sleep_until(Deadline deadline) {
  Waiter waiter;
  auto ec = park(waiter, deadline, kCancellable);
  return ec == std::errc::timed_out ? std::error_code{} : ec;
}

}  // namespace this_fiber

// ---- fiber-local storage ---------------------------------------------------------------------

class FiberLocalStorage {
 public:
  static void* get(Fiber& fiber, const void* key, void* (*make)(), void (*destroy)(void*)) {
    for (const auto& local : fiber.locals_) {
      if (local.key == key) return local.value;
    }
    void* value = make();
    fiber.locals_.push_back({key, value, destroy});
    return value;
  }
};

namespace detail {

void* fiber_local_get(const void* key, void* (*make)(), void (*destroy)(void*)) {
  Fiber* fiber = current_fiber();
  if (!fiber) throw std::logic_error("FiberLocal used outside a fiber");
  return FiberLocalStorage::get(*fiber, key, make, destroy);
}

}  // namespace detail

// ---- I/O readiness ---------------------------------------------------------------------------

std::error_code wait_ready(IoSlot& slot, IoDirection direction, Deadline deadline,
                           ReadAhead* ahead) {
  Fiber* fiber = current_fiber();
  if (!fiber) return std::make_error_code(std::errc::operation_not_permitted);
  if (direction == IoDirection::kWrite) {
    if (auto ec = fiber->worker().reactor().watch_writable(slot)) return ec;
  }
  Waiter waiter;
  Waiter*& parked = direction == IoDirection::kRead ? slot.reader : slot.writer;
  assert(parked == nullptr && "one waiter per direction");
  parked = &waiter;
  if (ahead != nullptr) slot.read_ahead = ahead;
  auto ec = park(waiter, deadline, kCancellable);
  // The reactor clears them when it wakes us (cancel_waits too); a timeout leaves them to us.
  if (parked == &waiter) {
    parked = nullptr;
    if (ahead != nullptr) slot.read_ahead = nullptr;  // (a writer's wait leaves the reader's)
  }
  return ec;
}

void cancel_waits(IoSlot& slot) {
  slot.read_ahead = nullptr;
  for (Waiter** parked : {&slot.reader, &slot.writer}) {
    if (Waiter* waiter = std::exchange(*parked, nullptr)) {
      if (waiter->claim(WakeReason::kCanceled)) waiter->wake();
    }
  }
}

}  // namespace spindle
