#pragma once
// Which calls the hooks make cooperative (private to src/hook).

#include <cstdint>
#include <optional>

#include "fd_table.h"

namespace spindle::hook::detail {

/// A call the hooks make wait cooperatively: the descriptor's entry as the call began.
struct Use {
  FdState* state;
  std::uint32_t generation;
  std::uint32_t facts;
};

/// The entry of `fd` if a call on it may wait cooperatively: made on a fiber, on a socket its
/// program has not made non-blocking (or one shared with descriptors the hooks do not follow,
/// whose flags are asked of the kernel before waiting), without MSG_DONTWAIT in `flags`.
/// Otherwise nothing: the call is libc's as it is.
std::optional<Use> cooperative(int fd, int flags);

}  // namespace spindle::hook::detail
