#include "spindle/fiber/stack_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <system_error>

#include "pages.h"
#include "sanitizer.h"
#include "spindle/base/error.h"

#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#else
#define VALGRIND_STACK_REGISTER(start, end) 0u
#define VALGRIND_STACK_DEREGISTER(id) ((void)(id))
#endif

namespace spindle {
namespace {

using detail::page_size;
using detail::round_to_pages;

Stack map_stack(std::size_t size) {
  const std::size_t guard = StackPool::guard_size();
  void* region = ::mmap(nullptr, size + guard, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (region == MAP_FAILED) throw std::system_error(last_errno(), "fiber stack: mmap");
  if (::mprotect(region, guard, PROT_NONE) != 0) {
    auto ec = last_errno();
    ::munmap(region, size + guard);
    // ENOMEM here is the mapping count: the guard page splits the region in two.
    throw std::system_error(ec, "fiber stack: guard page (vm.max_map_count?)");
  }
  char* base = static_cast<char*>(region) + guard;
  // Tells valgrind this range is a stack, so a switch onto it is not taken for a huge frame.
  unsigned id = VALGRIND_STACK_REGISTER(base, base + size);
  return Stack{base, size, id};
}

void unmap_stack(Stack stack) {
  const std::size_t guard = StackPool::guard_size();
  VALGRIND_STACK_DEREGISTER(stack.valgrind_id);
  ::munmap(static_cast<char*>(stack.base) - guard, stack.size + guard);
}

// A transparent huge page; chunks are aligned to it.
constexpr std::size_t kHugePage = std::size_t{2} << 20;
static_assert(StackPool::kChunkSize % kHugePage == 0);

// The canary at the bottom of a chunk's stack: its address mixed with a constant, so that
// neither zeroes (a page given back) nor another stack's canary pass for it.
constexpr std::size_t kCanaryWords = 2;
std::uint64_t canary_word(const void* base, std::size_t i) {
  return (reinterpret_cast<std::uintptr_t>(base) + i) * 0x9e3779b97f4a7c15ull ^ 0x5350494e444c45ull;
}
void set_canary(const Stack& stack) {
  auto* words = static_cast<std::uint64_t*>(stack.base);
  for (std::size_t i = 0; i < kCanaryWords; ++i) words[i] = canary_word(stack.base, i);
}
bool canary_intact(const Stack& stack) {
  const auto* words = static_cast<const std::uint64_t*>(stack.base);
  for (std::size_t i = 0; i < kCanaryWords; ++i) {
    if (words[i] != canary_word(stack.base, i)) return false;
  }
  return true;
}

}  // namespace

std::size_t StackPool::guard_size() { return page_size(); }

StackPool::StackPool(std::size_t stack_size, std::size_t max_cached, bool huge_pages)
    : stack_size_(round_to_pages(stack_size)), free_(kFloor, max_cached) {
  if (huge_pages) per_chunk_ = kChunkSize / stack_size_;
}

StackPool::~StackPool() {
  free_.clear([](Stack s) { unmap_stack(s); });
  for (const Stack& s : chunk_free_) VALGRIND_STACK_DEREGISTER(s.valgrind_id);
  for (const Chunk& c : chunks_) ::munmap(c.base - guard_size(), kChunkSize + guard_size());
}

void StackPool::add_chunk() {
  // The mapping has room to align the chunk to a huge page, with a page below it (outside
  // every huge page, so none is split) as the lowest stack's guard. No MAP_STACK: since Linux
  // 6.7 it means "no huge pages".
  const std::size_t guard = guard_size();
  const std::size_t mapped = kChunkSize + kHugePage + guard;
  void* region = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) throw std::system_error(last_errno(), "fiber stack chunk: mmap");
  auto* start = static_cast<char*>(region);
  auto* base = reinterpret_cast<char*>(
      (reinterpret_cast<std::uintptr_t>(start + guard) + kHugePage - 1) & ~(kHugePage - 1));
  // What is kept is [base - guard, base + kChunkSize): the destructor unmaps exactly that.
  char* keep = base - guard;
  char* end = start + mapped;
  if (keep > start) ::munmap(start, static_cast<std::size_t>(keep - start));
  if (base + kChunkSize < end) {
    ::munmap(base + kChunkSize, static_cast<std::size_t>(end - (base + kChunkSize)));
  }
  if (::mprotect(keep, guard, PROT_NONE) != 0) {
    auto ec = last_errno();
    ::munmap(keep, kChunkSize + guard);
    throw std::system_error(ec, "fiber stack chunk: guard page (vm.max_map_count?)");
  }
  // Without transparent huge pages (`never`) this fails or does nothing: 4 KiB pages then.
  ::madvise(base, kChunkSize, MADV_HUGEPAGE);
  chunks_.push_back(Chunk{base, 0, false});
  // Highest first, so that the lowest (the one with the guard) is taken first.
  for (std::size_t i = per_chunk_; i-- > 0;) {
    char* stack = base + i * stack_size_;
    unsigned id = VALGRIND_STACK_REGISTER(stack, stack + stack_size_);
    chunk_free_.push_back(Stack{stack, stack_size_, id});
  }
}

StackPool::Chunk* StackPool::chunk_of(const void* base) {
  auto* p = static_cast<const char*>(base);
  for (Chunk& c : chunks_) {
    if (p >= c.base && p < c.base + kChunkSize) return &c;
  }
  return nullptr;
}

Stack StackPool::allocate(std::size_t size) {
  if (fail_next_ > 0) {
    --fail_next_;
    throw std::system_error(std::make_error_code(std::errc::not_enough_memory),
                            "fiber stack: mmap (injected failure)");
  }
  size = size == 0 ? stack_size_ : round_to_pages(size);
  if (size == stack_size_ && per_chunk_ != 0) {
    if (chunk_free_.empty()) add_chunk();
    Stack stack = chunk_free_.back();
    chunk_free_.pop_back();
#if SPINDLE_ASAN
    // What AddressSanitizer marked in it for the fiber before (its last frames never return)
    // or for an earlier mapping of the same addresses is stale.
    ASAN_UNPOISON_MEMORY_REGION(stack.base, stack.size);
#endif
    Chunk* chunk = chunk_of(stack.base);
    ++chunk->in_use;
    chunk->resident = true;
    set_canary(stack);
    return stack;
  }
  if (size == stack_size_ && !free_.empty()) return free_.take();
  return map_stack(size);
}

void StackPool::deallocate(Stack stack) {
  if (Chunk* chunk = per_chunk_ != 0 ? chunk_of(stack.base) : nullptr) {
    if (!canary_intact(stack)) {
      // The fiber ran below its stack into the one under it: that one may be corrupt.
      std::fprintf(stderr,
                   "spindle: fiber stack overflow (a %zu-byte stack of a huge-page chunk ran "
                   "past its end); raise SpawnOptions::stack_size or RuntimeOptions::stack_size\n",
                   stack.size);
      std::abort();
    }
    --chunk->in_use;
    chunk_free_.push_back(stack);
    return;
  }
  if (stack.size != stack_size_ || !free_.give(std::move(stack))) unmap_stack(stack);
}

bool StackPool::over_floor() const {
  if (free_.over_floor()) return true;
  for (const Chunk& c : chunks_) {
    if (c.in_use == 0 && c.resident) return true;
  }
  return false;
}

std::size_t StackPool::trim() {
  std::size_t bytes = free_.trim([](Stack s) { unmap_stack(s); }) * (stack_size_ + guard_size());
  for (Chunk& c : chunks_) {
    if (c.in_use != 0 || !c.resident) continue;
    // Its pages come back zeroed when a stack is used again (and get their canary then).
    ::madvise(c.base, kChunkSize, MADV_DONTNEED);
    c.resident = false;
    bytes += kChunkSize;
  }
  return bytes;
}

}  // namespace spindle
