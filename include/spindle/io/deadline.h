#pragma once
/// Deadline: the point in time after which a blocking call gives up with std::errc::timed_out.

#include <chrono>

namespace spindle {

/// The clock every deadline and timer uses.
using Clock = std::chrono::steady_clock;

/// A point on the steady clock, or "never". Cheap to copy; reading it does no syscall.
class Deadline {
 public:
  /// Never expires.
  constexpr Deadline() = default;

  /// A deadline that never expires.
  static constexpr Deadline never() { return Deadline(); }
  /// A deadline at `when`.
  static constexpr Deadline at(Clock::time_point when) { return Deadline(when); }
  /// A deadline `d` from now (one clock read).
  template <typename Rep, typename Period>
  static Deadline after(std::chrono::duration<Rep, Period> d) {
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(d));
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
