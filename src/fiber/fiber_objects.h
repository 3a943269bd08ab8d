#pragma once
// The calling thread's cache of freed fiber objects (fiber.cc), as the worker trims it.

#include <cstddef>

namespace spindle::detail {

/// True if some size class holds more freed fiber objects than it keeps when idle.
bool fiber_objects_over_floor();
/// Frees the cached fiber objects not reused since the last trim; returns the bytes.
std::size_t trim_fiber_objects();

}  // namespace spindle::detail
