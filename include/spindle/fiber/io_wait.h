#pragma once
/// Waiting for a registered descriptor to become ready: the bridge from the Reactor to fibers.

#include <system_error>

#include "spindle/io/deadline.h"
#include "spindle/io/reactor.h"

namespace spindle {

/// Which readiness to wait for.
enum class IoDirection { kRead, kWrite };

/// Parks the calling fiber until `slot` reports readiness in `direction` (or error/hang-up),
/// `deadline` passes (std::errc::timed_out) or the fiber is asked to stop
/// (std::errc::operation_canceled). One waiter per direction. Call only after the syscall said
/// EAGAIN: readiness is edge-triggered. Outside a fiber: std::errc::operation_not_permitted.
/// A reader may offer `ahead`: if the reactor wakes it, it reads into it first (ReadAhead).
[[nodiscard]] std::error_code wait_ready(IoSlot& slot, IoDirection direction, Deadline deadline,
                                         ReadAhead* ahead = nullptr);

/// Wakes the fibers parked on `slot` (their wait returns std::errc::operation_canceled), so
/// that the slot can be released: used when a socket is closed under a waiting fiber.
void cancel_waits(IoSlot& slot);

}  // namespace spindle
