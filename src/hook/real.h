#pragma once
// libc's own definitions of the functions the hooks define (private to src/hook): found past
// the program's definitions with dlsym(RTLD_NEXT), once each.

#include <dlfcn.h>

/// Declares `real_<name>`, libc's `name`, with the type of the program's declaration of it.
#define SPINDLE_REAL(name)                                             \
  static const auto real_##name = reinterpret_cast<decltype(&::name)>( \
      ::dlsym(RTLD_NEXT, #name))  // NOLINT(bugprone-macro-parentheses)
