#pragma once
/// this_fiber: operations on the calling fiber. Outside a fiber they act on the thread.

#include <chrono>
#include <system_error>

#include "spindle/fiber/fiber.h"
#include "spindle/io/deadline.h"

namespace spindle {

/// The running fiber, or nullptr outside fibers.
Fiber* current_fiber();

namespace this_fiber {

/// The calling fiber's id, or 0 outside a fiber.
FiberId id();

/// Lets the other runnable fibers of this worker run first (a thread yield outside fibers).
void yield();

/// True if the calling fiber was asked to stop (false outside fibers).
bool stop_requested();

/// Sleeps until `deadline`. Returns {} when it passed, std::errc::operation_canceled if the
/// fiber was asked to stop first.
std::error_code sleep_until(Deadline deadline);

/// Sleeps for `d` (see sleep_until).
template <typename Rep, typename Period>
std::error_code sleep_for(std::chrono::duration<Rep, Period> d) {
  return sleep_until(Deadline::after(d));
}

}  // namespace this_fiber
}  // namespace spindle
