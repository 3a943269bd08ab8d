#pragma once
// Annotations that tell AddressSanitizer and ThreadSanitizer about stack switches. Without them
// ASan mistakes a fiber stack for stack corruption and TSan mixes up fibers' histories. They
// compile to nothing in normal builds.

#include <cstddef>

#include "spindle/base/sanitizers.h"

#if SPINDLE_ASAN
#include <sanitizer/asan_interface.h>
#endif
#if SPINDLE_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace spindle::sanitizer {

/// Before switching to a stack [bottom, bottom+size); `fake_stack` keeps ASan's fake frames of
/// the stack being left (nullptr when that stack is finished for good).
inline void start_switch(void** fake_stack, const void* bottom, std::size_t size) {
#if SPINDLE_ASAN
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#else
  (void)fake_stack, (void)bottom, (void)size;
#endif
}

/// First thing after arriving on a stack; reports the bounds of the stack we came from.
inline void finish_switch(void* fake_stack, const void** old_bottom, std::size_t* old_size) {
#if SPINDLE_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, old_bottom, old_size);
#else
  (void)fake_stack, (void)old_bottom, (void)old_size;
#endif
}

/// TSan: the fiber object of the calling thread.
inline void* tsan_current() {
#if SPINDLE_TSAN
  return __tsan_get_current_fiber();
#else
  return nullptr;
#endif
}
/// TSan: a new fiber object.
inline void* tsan_create() {
#if SPINDLE_TSAN
  return __tsan_create_fiber(0);
#else
  return nullptr;
#endif
}
/// TSan: destroys a fiber object that is not running.
inline void tsan_destroy(void* fiber) {
#if SPINDLE_TSAN
  if (fiber) __tsan_destroy_fiber(fiber);
#else
  (void)fiber;
#endif
}
/// TSan: the next instructions run as `fiber`.
inline void tsan_switch(void* fiber) {
#if SPINDLE_TSAN
  __tsan_switch_to_fiber(fiber, 0);
#else
  (void)fiber;
#endif
}

}  // namespace spindle::sanitizer
