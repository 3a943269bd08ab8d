#pragma once
// Test helpers: run a test body inside a fiber of a fresh Runtime (like userver's UTEST).

#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
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

#ifdef SPINDLE_SOURCE_DIR
/// The folder holding the test CA and certificates of tests/tls/make-certs.sh (ca.pem,
/// localhost.pem/.key, other.pem/.key), made once per test binary. Needs SPINDLE_SOURCE_DIR.
inline const std::string& test_cert_dir() {
  static const std::string dir = [] {
    std::string d = "/tmp/spindle-test-certs-" + std::to_string(::getpid());
    std::string command = std::string(SPINDLE_SOURCE_DIR) + "/tests/tls/make-certs.sh " + d;
    if (std::system(command.c_str()) != 0) ADD_FAILURE() << "make-certs.sh failed (openssl?)";
    return d;
  }();
  return dir;
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
