#pragma once
// Test helpers: run a test body inside a fiber of a fresh Runtime (like userver's UTEST).

#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "spindle/fiber/runtime.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// The sanitizer runtimes' count of heap in use (GCC ships no header declaring it).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace spindle::testing {

/// Runs `body` in a fiber on worker 0 of a new runtime with `workers` workers, then stops it.
template <typename Fn>
void run_in_fiber(Fn&& body, std::size_t workers = 2) {
  Runtime runtime(RuntimeOptions{.workers = workers});
  runtime.block_on(std::forward<Fn>(body));
}

/// A new empty folder /tmp/PREFIX-XXXXXX of this process's own, or "" (with a test failure).
/// Never a name made from the pid: such a folder outlives a process that dies before removing
/// it, and a later process given the same pid would find it full.
inline std::string make_temp_dir(const std::string& prefix) {
  std::string name = "/tmp/" + prefix + "-XXXXXX";
  if (::mkdtemp(name.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << name << " failed: " << std::strerror(errno);
    return {};
  }
  return name;
}

#ifdef SPINDLE_SOURCE_DIR
/// The folder holding the test CA and certificates of tests/tls/make-certs.sh (ca.pem,
/// localhost.pem/.key, other.pem/.key), made once per test binary in a folder of its own and
/// removed when the process that made it exits. (A folder named by the pid outlived its
/// process; a later process given the same pid found certificates a day old, expired.)
/// Needs SPINDLE_SOURCE_DIR.
inline const std::string& test_cert_dir() {
  struct Folder {
    std::string path;
    pid_t owner = ::getpid();
    Folder() : path(make_temp_dir("spindle-test-certs")) {
      if (path.empty()) return;
      std::string command = std::string(SPINDLE_SOURCE_DIR) + "/tests/tls/make-certs.sh " + path;
      if (std::system(command.c_str()) != 0) ADD_FAILURE() << "make-certs.sh failed (openssl?)";
    }
    ~Folder() {  // not in a forked child (a death test's): the folder is its parent's
      if (!path.empty() && ::getpid() == owner) {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
      }
    }
  };
  static const Folder folder;
  return folder.path;
}
#endif

/// Bytes of heap handed out and not given back, every arena: malloc's count, or the
/// sanitizer allocator's in a sanitizer build (where malloc's is not kept).
inline std::size_t heap_in_use() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return __sanitizer_get_current_allocated_bytes();
#else
  return ::mallinfo2().uordblks;
#endif
}

/// The current value of a /proc/sys setting, or -1.
inline long read_proc_number(const std::string& path) {
  std::ifstream in(path);
  long value = -1;
  in >> value;
  return value;
}

}  // namespace spindle::testing

/// A GoogleTest test whose body runs inside a fiber of a fresh two-worker Runtime.
#define FIBER_TEST(Suite, Name)                                                        \
  static void Suite##_##Name##_FiberBody();                                            \
  TEST(Suite, Name) { ::spindle::testing::run_in_fiber(&Suite##_##Name##_FiberBody); } \
  static void Suite##_##Name##_FiberBody()
