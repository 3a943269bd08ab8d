#include "spindle/fiber/spin_lock.h"

#include <sched.h>

namespace spindle {

void SpinLock::relax(int spins) noexcept {
  if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else {
    ::sched_yield();
  }
}

}  // namespace spindle
