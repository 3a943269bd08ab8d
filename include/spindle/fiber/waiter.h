#pragma once
/// Waiter and park(): the one way anything in spindle blocks.
///
/// A waiter is claimed exactly once — by a notifier, by its deadline, or by cancellation — and
/// whoever claims it makes its owner runnable again. The owner is the fiber that created it, or,
/// outside any fiber, the thread (which then sleeps on a futex). Every primitive in sync/ and
/// every I/O wait is a Waiter plus some bookkeeping.

#include <atomic>
#include <cstdint>
#include <system_error>

#include "spindle/fiber/fiber.h"
#include "spindle/io/deadline.h"
#include "spindle/io/timer_queue.h"

namespace spindle {

/// Why a wait ended.
enum class WakeReason : std::uint32_t { kWaiting = 0, kNotified, kTimedOut, kCanceled };

/// Whether a wait ends early when the waiting fiber is asked to stop.
inline constexpr bool kCancellable = true;
/// A wait that only its notifier (or deadline) can end.
inline constexpr bool kNotCancellable = false;

/// One parked fiber or thread. Lives on the waiter's stack for the duration of one wait.
class Waiter {
 public:
  /// A waiter for the current fiber, or for the current thread outside fibers.
  Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  /// Claims the waiter for `reason`. True only for the single caller that wins; only that caller
  /// may then call wake().
  bool claim(WakeReason reason) {
    auto expected = static_cast<std::uint32_t>(WakeReason::kWaiting);
    return state_.compare_exchange_strong(expected, static_cast<std::uint32_t>(reason),
                                          std::memory_order_acq_rel, std::memory_order_acquire);
  }
  /// Makes the owner runnable. Call after a successful claim(), and only for a fiber waiter
  /// or from a path that knows the waiter still exists (see notify()).
  void wake() { wake(fiber_); }
  /// claim(kNotified) and wake(); true if this call woke the waiter. Safe from any thread while
  /// the waiter is published (linked under the caller's lock).
  bool notify() {
    // Read the owner before claiming: a thread waiter may see the claim, return and reuse this
    // memory before we get to wake it.
    Fiber* owner = fiber_;
    if (!claim(WakeReason::kNotified)) return false;
    wake(owner);
    return true;
  }
  /// The reason it was claimed for (kWaiting while parked).
  WakeReason reason() const {
    return static_cast<WakeReason>(state_.load(std::memory_order_acquire));
  }
  /// The owning fiber, or nullptr for a thread.
  Fiber* fiber() const { return fiber_; }

  /// Links for the intrusive WaitList (sync/); managed under that list's lock.
  Waiter* prev = nullptr;
  Waiter* next = nullptr;
  /// True while on a wait list.
  bool linked = false;
  /// The deadline timer (fiber waits only).
  Timer timer;

 private:
  /// Wakes `owner`, or this waiter's futex if it is a thread. Touches no member but the
  /// futex address, which stays harmless after the waiter is gone.
  void wake(Fiber* owner);

  friend std::error_code park(Waiter& waiter, Deadline deadline, bool cancellable,
                              AfterSwitch after);
  /// The owner fiber, or nullptr for a plain thread.
  Fiber* fiber_;
  /// A WakeReason; also the futex word for thread waiters.
  std::atomic<std::uint32_t> state_{0};
};

/// Parks the caller until `waiter` is claimed: by a notifier (returns {}), by `deadline`
/// (std::errc::timed_out) or, if `cancellable`, by request_stop() (std::errc::operation_canceled;
/// a fiber already asked to stop does not park at all). `after` runs exactly once, after the
/// caller is parked; the caller must hold whatever lock guards the structure the waiter was
/// published in, and `after` releases it. Not re-entrant for one waiter.
std::error_code park(Waiter& waiter, Deadline deadline, bool cancellable = kCancellable,
                     AfterSwitch after = {});

/// Maps a WakeReason to the error code park() returns for it.
std::error_code wake_error(WakeReason reason);

}  // namespace spindle
