#pragma once
/// spawn / spawn_on and JoinHandle: starting fibers and collecting their results.

#include <cassert>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "spindle/base/intrusive_ptr.h"
#include "spindle/fiber/fiber.h"
#include "spindle/fiber/worker.h"

namespace spindle {

/// A handle to a spawned fiber whose body returns T. Move-only. Dropping a handle without
/// join() detaches the fiber (it runs on; an exception escaping it is logged).
template <typename T>
class JoinHandle {
 public:
  JoinHandle() = default;
  explicit JoinHandle(IntrusivePtr<detail::ResultFiber<T>> fiber) : fiber_(std::move(fiber)) {}
  JoinHandle(JoinHandle&&) noexcept = default;
  JoinHandle& operator=(JoinHandle&& other) noexcept {
    if (this != &other) {
      detach();
      fiber_ = std::move(other.fiber_);
    }
    return *this;
  }
  ~JoinHandle() { detach(); }

  /// Waits for the fiber (from a fiber: parks; from a thread: sleeps) and returns its value or
  /// rethrows its exception. Not cancellable. The handle is empty afterwards.
  T join() {
    assert(fiber_ && "join on an empty JoinHandle");
    fiber_->wait_finished();
    auto fiber = std::move(fiber_);
    return fiber->take_result();
  }
  /// Lets the fiber run on without a handle.
  void detach() {
    if (fiber_) std::move(fiber_)->detach();
    fiber_ = {};
  }
  /// Asks the fiber to stop (see Fiber::request_stop).
  void request_stop() const {
    if (fiber_) fiber_->request_stop();
  }
  /// True if the handle refers to a fiber.
  bool joinable() const { return static_cast<bool>(fiber_); }
  /// True if the fiber has finished (so join() will not wait).
  bool finished() const { return fiber_ && fiber_->finished(); }
  /// The fiber's id (0 for an empty handle).
  FiberId id() const { return fiber_ ? fiber_->id() : 0; }

 private:
  /// The fiber, or empty.
  IntrusivePtr<detail::ResultFiber<T>> fiber_;
};

/// Starts `fn` in a new fiber on `worker`. Safe from any thread; from another thread the stack
/// is taken when the worker picks the fiber up. If no stack can be had (StackPool::allocate
/// failed), `fn` never runs: the fiber finishes at once and join() rethrows the
/// std::system_error. On the calling worker that is known on return: the handle's finished()
/// is then already true. Throws std::bad_alloc only if the fiber object cannot be allocated.
template <typename Fn>
auto spawn_on(Worker& worker, Fn&& fn, SpawnOptions options = {})
    -> JoinHandle<std::invoke_result_t<std::decay_t<Fn>&>> {
  using T = std::invoke_result_t<std::decay_t<Fn>&>;
  auto* fiber = new detail::FiberImpl<T, std::decay_t<Fn>>(worker, options, std::forward<Fn>(fn));
  // One reference for the worker (dropped when the fiber finishes), one for the handle.
  IntrusivePtr<detail::ResultFiber<T>> handle(fiber);
  worker.schedule(fiber);
  return JoinHandle<T>(std::move(handle));
}

/// Starts `fn` in a new fiber on the calling worker. Throws std::logic_error outside a worker.
template <typename Fn>
auto spawn(Fn&& fn, SpawnOptions options = {}) {
  Worker* worker = Worker::current();
  if (!worker) throw std::logic_error("spindle::spawn outside a runtime worker; use spawn_on");
  return spawn_on(*worker, std::forward<Fn>(fn), options);
}

}  // namespace spindle
