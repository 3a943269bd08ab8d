#include "spindle/fiber/block_slab.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

#include "pages.h"
#include "sanitizer.h"

namespace spindle {
namespace {

/// Blocks carved from each mapping.
constexpr std::size_t kBlocksPerMapping = 32;

// Under AddressSanitizer a block waiting in the slab is poisoned (a use after give is
// reported), as is the page between two blocks.
void poison(const char* at, std::size_t size) {
#if SPINDLE_ASAN
  ASAN_POISON_MEMORY_REGION(at, size);
#else
  (void)at, (void)size;
#endif
}
void unpoison(const char* at, std::size_t size) {
#if SPINDLE_ASAN
  ASAN_UNPOISON_MEMORY_REGION(at, size);
#else
  (void)at, (void)size;
#endif
}

}  // namespace

BlockSlab::BlockSlab(std::size_t block_size, std::size_t floor, std::size_t max_resident)
    : block_size_(std::max<std::size_t>(block_size, 1)), resident_(floor, max_resident) {
  stride_ = detail::round_to_pages(block_size_);
#if SPINDLE_ASAN
  stride_ += detail::page_size();
#endif
}

BlockSlab::~BlockSlab() {
  for (const Mapping& m : mappings_) {
    unpoison(m.base, m.size);
    ::munmap(m.base, m.size);
  }
}

char* BlockSlab::take() {
  char* block = nullptr;
  if (!resident_.empty()) {
    block = resident_.take();
  } else if (!released_.empty()) {
    block = released_.back();
    released_.pop_back();
  } else {
    if (carve_left_ == 0) {
      const std::size_t size = stride_ * kBlocksPerMapping;
      // Room first: once mapped, nothing may throw. (Every block may one day be released:
      // release() then never allocates.)
      mappings_.reserve(mappings_.size() + 1);
      released_.reserve((mappings_.size() + 1) * kBlocksPerMapping);
      void* base =
          ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      mappings_.push_back({static_cast<char*>(base), size});
      poison(static_cast<char*>(base), size);
      carve_ = static_cast<char*>(base);
      carve_left_ = kBlocksPerMapping;
    }
    block = carve_;
    carve_ += stride_;
    --carve_left_;
  }
  unpoison(block, block_size_);
  return block;
}

void BlockSlab::give(char* block) {
  poison(block, block_size_);
  if (!resident_.give(std::move(block))) release(block);
}

std::size_t BlockSlab::trim() {
  return resident_.trim([this](char* block) { release(block); }) * block_size_;
}

void BlockSlab::release(char* block) {
  // The pages stay mapped and read as zeros from now on; nothing else lives on them.
  (void)::madvise(block, stride_, MADV_DONTNEED);
  released_.push_back(block);
}

}  // namespace spindle
