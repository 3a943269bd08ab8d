#pragma once
/// FiberLocal<T>: one T per fiber, created on first use and destroyed when the fiber ends.

#include <stdexcept>

#include "spindle/fiber/fiber.h"

namespace spindle {

namespace detail {
/// Finds the current fiber's value for `key`, creating it with `make` on first use.
/// Throws std::logic_error outside a fiber.
void* fiber_local_get(const void* key, void* (*make)(), void (*destroy)(void*));
}  // namespace detail

/// A variable with one value per fiber. The first get() in a fiber default-constructs its value
/// (one small allocation); it is destroyed when that fiber ends.
template <typename T>
class FiberLocal {
 public:
  FiberLocal() = default;
  FiberLocal(const FiberLocal&) = delete;
  FiberLocal& operator=(const FiberLocal&) = delete;

  /// The calling fiber's value. Throws std::logic_error outside a fiber.
  T& get() {
    return *static_cast<T*>(detail::fiber_local_get(
        this, [] { return static_cast<void*>(new T()); },
        [](void* p) { delete static_cast<T*>(p); }));
  }
  T* operator->() { return &get(); }
  T& operator*() { return get(); }
};

}  // namespace spindle
