// The two sides of the hooks' differential test (differential_test.cc), from one source:
//
//   hook_script_plain SEED STEPS          plain libc: built without the hooks, on a thread
//   hook_script_hooked SEED STEPS fiber   the hooks linked, the script on a spindle fiber
//   hook_script_hooked SEED STEPS thread  the hooks linked, the script on a plain thread
//
// Each writes the script's lines (script.h) to stdout. Descriptors inherited from the parent
// are closed first, so that both number theirs from the same lowest free one.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "script.h"

#ifdef SPINDLE_SCRIPT_HOOKED
#include "spindle/fiber/runtime.h"
#include "spindle/hook/hook.h"
#endif

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SEED STEPS [fiber|thread]\n", argv[0]);
    return 2;
  }
  ::close_range(3, ~0u, 0);
  ::signal(SIGPIPE, SIG_IGN);  // EPIPE is what the script writes down
  ::alarm(120);                // a call that waits for good ends the run (the lines show where)
  std::uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  int steps = std::atoi(argv[2]);
#ifdef SPINDLE_SCRIPT_HOOKED
  if (!spindle::hook::linked()) return 3;
  if (argc > 3 && std::string_view(argv[3]) == "fiber") {
    spindle::Runtime runtime(spindle::RuntimeOptions{.workers = 1});
    runtime.block_on([&] { spindle::hook_script::run(seed, steps, stdout); });
    return 0;
  }
#endif
  spindle::hook_script::run(seed, steps, stdout);
  return 0;
}
