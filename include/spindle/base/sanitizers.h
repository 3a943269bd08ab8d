#pragma once
/// SPINDLE_ASAN and SPINDLE_TSAN: defined as 1 in a build with AddressSanitizer or
/// ThreadSanitizer (GCC says so with __SANITIZE_ADDRESS__/__SANITIZE_THREAD__, Clang with
/// __has_feature), so that code can step aside for them: a cache of freed blocks that would
/// hide a use after free, a stack switch they must be told about.

#if defined(__SANITIZE_ADDRESS__)
#define SPINDLE_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define SPINDLE_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(SPINDLE_ASAN)
#define SPINDLE_ASAN 1
#endif
#if __has_feature(thread_sanitizer) && !defined(SPINDLE_TSAN)
#define SPINDLE_TSAN 1
#endif
#endif
