#pragma once
/// Deadline: the point in time after which a blocking call gives up with std::errc::timed_out.

#include <time.h>

#include <chrono>

namespace spindle {

/// The clock every deadline and timer uses.
using Clock = std::chrono::steady_clock;

/// The same clock read at the kernel's tick resolution: at most a tick (1-10 ms) behind
/// Clock::now(), and about a quarter of its cost. For timeouts of seconds set on every
/// request, where a clock read shows in the profile.
inline Clock::time_point coarse_now() {
  timespec t;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return Clock::time_point(std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec));
}

/// A point on the steady clock, or "never". Cheap to copy; reading it does no syscall.
class Deadline {
 public:
  /// Never expires.
  constexpr Deadline() = default;

  /// A deadline that never expires.
  static constexpr Deadline never() { return Deadline(); }
  /// A deadline at `when`.
  static constexpr Deadline at(Clock::time_point when) { return Deadline(when); }
  /// A deadline passed already: a call given it does what it can now, without waiting (and
  /// without reading the clock unless it would have to wait).
  static constexpr Deadline no_wait() { return Deadline(Clock::time_point::min()); }
  /// A deadline `d` from now (one clock read).
  template <typename Rep, typename Period>
  static Deadline after(std::chrono::duration<Rep, Period> d) {
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(d));
  }
  /// A deadline `d` from coarse_now(): it may expire up to a tick early.
  template <typename Rep, typename Period>
  static Deadline after_coarse(std::chrono::duration<Rep, Period> d) {
    return Deadline(coarse_now() + std::chrono::duration_cast<Clock::duration>(d));
  }

  /// True unless this is never().
  constexpr bool is_finite() const { return when_ != Clock::time_point::max(); }
  /// The expiry time (time_point::max() for never).
  constexpr Clock::time_point when() const { return when_; }
  /// True if the deadline has passed at `now`.
  constexpr bool expired(Clock::time_point now) const { return is_finite() && now >= when_; }
  /// True if the deadline has passed (one clock read unless never).
  bool expired() const { return is_finite() && Clock::now() >= when_; }
  /// The earlier of two deadlines.
  friend constexpr Deadline earliest(Deadline a, Deadline b) { return a.when_ < b.when_ ? a : b; }
  friend constexpr bool operator==(Deadline, Deadline) = default;

 private:
  constexpr explicit Deadline(Clock::time_point when) : when_(when) {}

  /// Expiry time; max() means never.
  Clock::time_point when_ = Clock::time_point::max();
};

}  // namespace spindle
