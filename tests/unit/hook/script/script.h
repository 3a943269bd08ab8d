#pragma once
// A generated sequence of libc calls on sockets, for the hooks' differential test
// (differential_test.cc): the same seed gives the same calls wherever it runs, and every
// result is written down, so that a run with the hooks on a fiber can be compared line by
// line with a run of plain libc on a thread (another binary, built without the hooks).

#include <cstdint>
#include <cstdio>
#include <string>

namespace spindle::hook_script {

/// Makes and runs `steps` calls of script `seed`, writing one line per call to `out` (flushed
/// as it goes: a run that hangs still shows where). Every call that would wait for good in
/// libc is given what ends it (a peer that writes later, reads, or a timeout).
void run(std::uint64_t seed, int steps, std::FILE* out);

}  // namespace spindle::hook_script
