#include "stack_overflow.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "spindle/fiber/fiber.h"
#include "spindle/fiber/this_fiber.h"

namespace spindle {
namespace {

constexpr std::size_t kAltStackSize = 64 * 1024;

// The handler that was installed before ours; faults that are not overflows go there.
struct sigaction g_previous_segv;

// Appends `text` to buf (async-signal-safe: no allocation, no locale).
char* append(char* out, char* end, const char* text) {
  while (*text && out < end) *out++ = *text++;
  return out;
}

char* append_number(char* out, char* end, unsigned long long value, int base) {
  char digits[32];
  int n = 0;
  do {
    digits[n++] = "0123456789abcdef"[value % base];
    value /= base;
  } while (value && n < 32);
  while (n > 0 && out < end) *out++ = digits[--n];
  return out;
}

void report_overflow(const Fiber& fiber) {
  char message[256];
  char* end = message + sizeof message;
  char* out = append(message, end, "spindle: fiber stack overflow in fiber 0x");
  out = append_number(out, end, fiber.id(), 16);
  out = append(out, end, " (stack ");
  out = append_number(out, end, fiber.stack().size, 10);
  out = append(out, end, " bytes); raise SpawnOptions::stack_size or RuntimeOptions::stack_size\n");
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, message, out - message);
}

void on_segv(int signo, siginfo_t* info, void* context) {
  if (const Fiber* fiber = current_fiber()) {
    auto* fault = static_cast<char*>(info->si_addr);
    auto* base = static_cast<char*>(fiber->stack().base);
    if (fault < base && fault >= base - StackPool::guard_size()) {
      report_overflow(*fiber);
      signal(SIGABRT, SIG_DFL);
      std::abort();
    }
  }
  if (g_previous_segv.sa_flags & SA_SIGINFO) {
    if (g_previous_segv.sa_sigaction) return g_previous_segv.sa_sigaction(signo, info, context);
  } else if (g_previous_segv.sa_handler != SIG_DFL && g_previous_segv.sa_handler != SIG_IGN) {
    return g_previous_segv.sa_handler(signo);
  }
  // Default action: restore it and return; the faulting instruction faults again and kills us.
  signal(SIGSEGV, SIG_DFL);
}

}  // namespace

void install_stack_overflow_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous_segv);
  });
}

AltSignalStack::AltSignalStack() {
  void* memory =
      ::mmap(nullptr, kAltStackSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return;
  stack_t stack{};
  stack.ss_sp = memory;
  stack.ss_size = kAltStackSize;
  if (::sigaltstack(&stack, nullptr) != 0) {
    ::munmap(memory, kAltStackSize);
    return;
  }
  memory_ = memory;
}

AltSignalStack::~AltSignalStack() {
  if (!memory_) return;
  stack_t disable{};
  disable.ss_flags = SS_DISABLE;
  ::sigaltstack(&disable, nullptr);
  ::munmap(memory_, kAltStackSize);
}

}  // namespace spindle
