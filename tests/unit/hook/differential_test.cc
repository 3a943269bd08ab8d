// The hooks against libc: the same generated calls (script/script.cc: flags, dup/dup2/dup3/
// F_DUPFD, MSG_DONTWAIT/MSG_WAITALL/MSG_PEEK, short and long reads and writes, closes from
// another thread and where the hooks cannot see them, numbers reused, stdio, connects) run by
// a program built WITHOUT the hooks on a plain thread, and by one built with them on a spindle
// fiber and on a plain thread. Every call must give the same result in all three, line for
// line. Each run is a child process of its own (script/main.cc), started together.
//
// SPINDLE_HOOK_SEEDS=N widens the seeds each case runs (default 12 per case).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "testing/subprocess.h"

namespace {

constexpr int kSteps = 70;

std::filesystem::path binaries() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path();
}

int seeds_per_case() {
  const char* wanted = std::getenv("SPINDLE_HOOK_SEEDS");
  return wanted != nullptr ? std::max(1, std::atoi(wanted)) : 12;
}

// A started run of the script, and its lines once it ended.
struct ScriptRun {
  std::string name;
  spindle::testing::Subprocess process;
  std::vector<std::string> lines;
  int exit_code = -1;

  ScriptRun(std::string name, std::vector<std::string> argv)
      : name(std::move(name)), process(std::move(argv)) {}
  void finish() {
    while (auto l = process.read_line()) lines.push_back(*l);
    exit_code = process.stop(0, std::chrono::seconds(30));
  }
};

// The first line where `run` differs from `libc`, with the lines before it.
std::string first_difference(const ScriptRun& libc, const ScriptRun& run) {
  std::size_t n = std::max(libc.lines.size(), run.lines.size());
  for (std::size_t i = 0; i < n; ++i) {
    std::string a = i < libc.lines.size() ? libc.lines[i] : "(nothing: the run ended)";
    std::string b = i < run.lines.size() ? run.lines[i] : "(nothing: the run ended)";
    if (a == b) continue;
    std::ostringstream out;
    for (std::size_t j = i >= 6 ? i - 6 : 0; j < i; ++j) out << "    " << libc.lines[j] << "\n";
    out << "  libc:        " << a << "\n  " << run.name << ": " << b << "\n";
    return out.str();
  }
  return {};
}

void compare_seeds(std::uint64_t first, int count) {
  auto dir = binaries();
  std::string plain = dir / "hook_script_plain", hooked = dir / "hook_script_hooked";
  for (std::uint64_t seed = first; seed < first + static_cast<std::uint64_t>(count); ++seed) {
    std::string s = std::to_string(seed), steps = std::to_string(kSteps);
    ScriptRun libc("libc", {plain, s, steps});
    ScriptRun fiber("hooks, fiber ", {hooked, s, steps, "fiber"});
    ScriptRun thread("hooks, thread", {hooked, s, steps, "thread"});
    ASSERT_TRUE(libc.process.started() && fiber.process.started() && thread.process.started());
    for (ScriptRun* r : {&libc, &fiber, &thread}) r->finish();
    ASSERT_EQ(libc.exit_code, 0) << "seed " << seed << ": the libc run did not end well";
    ASSERT_GE(libc.lines.size(), static_cast<std::size_t>(kSteps)) << "seed " << seed;
    for (ScriptRun* r : {&fiber, &thread}) {
      std::string difference = first_difference(libc, *r);
      EXPECT_TRUE(difference.empty()) << "seed " << seed << ", at:\n" << difference;
      EXPECT_EQ(r->exit_code, 0) << "seed " << seed << ": " << r->name;
    }
  }
}

}  // namespace

TEST(HookDifferential, TheScriptsRunTheSameAsWithLibc1) { compare_seeds(1, seeds_per_case()); }
TEST(HookDifferential, TheScriptsRunTheSameAsWithLibc2) { compare_seeds(1001, seeds_per_case()); }
TEST(HookDifferential, TheScriptsRunTheSameAsWithLibc3) { compare_seeds(2001, seeds_per_case()); }

// The comparison means something only if a run of the script is the same every time: libc
// against itself.
TEST(HookDifferential, AScriptRunsTheSameTwiceWithLibc) {
  auto plain = binaries() / "hook_script_plain";
  for (std::uint64_t seed : {7, 8, 9}) {
    ScriptRun a("libc", {plain, std::to_string(seed), std::to_string(kSteps)});
    ScriptRun b("libc again", {plain, std::to_string(seed), std::to_string(kSteps)});
    a.finish();
    b.finish();
    EXPECT_GE(a.lines.size(), static_cast<std::size_t>(kSteps));
    EXPECT_TRUE(first_difference(a, b).empty()) << first_difference(a, b);
  }
}
