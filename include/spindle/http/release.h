// Giving a container's memory back. In the lowest layer, so that the protocol code (pure) and
// everything above it share it.
#pragma once

#include <utility>

namespace spindle {

/// Empties `c` and gives back its memory. `c = {}` and `c.clear()` keep it: assigning an empty
/// string or vector to one keeps its capacity (a string even when moved from an empty one).
/// What an idle connection keeps between its activations goes through here.
template <typename Container>
void release(Container& c) {
  Container().swap(c);
}

}  // namespace spindle
