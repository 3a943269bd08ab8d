#include "spindle/base/block_cache.h"

#include <algorithm>
#include <cstdint>

#include "spindle/base/sanitizers.h"

namespace spindle {
namespace {

// Size classes: 64-byte steps up to 1 KiB, then 1 KiB steps up to 32 KiB.
constexpr std::size_t kSmallStep = 64, kSmallMax = 1024;
constexpr std::size_t kLargeStep = 1024, kLargeMax = 32 * 1024;
constexpr std::size_t kSmallClasses = kSmallMax / kSmallStep;
constexpr std::size_t kClasses = kSmallClasses + (kLargeMax - kSmallMax) / kLargeStep;

constexpr std::size_t class_of(std::size_t size) {
  if (size == 0) size = 1;
  return size <= kSmallMax ? (size - 1) / kSmallStep
                           : kSmallClasses + (size - kSmallMax - 1) / kLargeStep;
}
constexpr std::size_t class_size(std::size_t c) {
  return c < kSmallClasses ? (c + 1) * kSmallStep
                           : kSmallMax + (c + 1 - kSmallClasses) * kLargeStep;
}
static_assert(class_size(class_of(1)) == 64 && class_size(class_of(1024)) == 1024);
static_assert(class_size(class_of(1025)) == 2048 && class_size(class_of(16385)) == 17 * 1024);
static_assert(kClasses <= 64, "BlockCache::over_ has a bit per class");
static_assert(class_of(kLargeMax) == kClasses - 1 && class_size(kClasses - 1) == kLargeMax);

class BlockCache {
 public:
  // At most this many bytes cached per thread; beyond, a freed block goes to malloc.
  static constexpr std::size_t kBudget = 32 * 1024 * 1024;
  // Blocks per class that survive a trim (fiber/idle_cache.h explains the low-water mark).
  static constexpr std::size_t kSmallFloor = 64, kLargeFloor = 8;

  ~BlockCache() {
    closed_ = true;  // a block freed later in this thread's exit goes straight to malloc
    for (Node*& head : free_) {
      while (Node* n = head) {
        head = n->next;
        ::operator delete(n);
      }
    }
  }
  void* take(std::size_t size) {
    std::size_t c = class_of(size);
    if (kDisabled || c >= kClasses) return ::operator new(size);
    Node* n = free_[c];
    if (n == nullptr) return ::operator new(class_size(c));
    free_[c] = n->next;
    if (count_[c]-- == floor(c) + 1) over_ &= ~(std::uint64_t{1} << c);
    bytes_ -= class_size(c);
    low_water_[c] = std::min(low_water_[c], count_[c]);
    return n;
  }
  void give(void* p, std::size_t size) noexcept {
    std::size_t c = class_of(size);
    if (kDisabled || closed_ || c >= kClasses || bytes_ + class_size(c) > kBudget) {
      ::operator delete(p);
      return;
    }
    free_[c] = new (p) Node{free_[c]};
    if (++count_[c] == floor(c) + 1) over_ |= std::uint64_t{1} << c;
    bytes_ += class_size(c);
  }
  /// Asked before every poll of the reactor: one word, not a walk over the classes.
  bool over_floor() const { return over_ != 0; }
  std::size_t trim() {
    std::size_t freed = 0;
    for (std::size_t c = 0; c < kClasses; ++c) {
      std::size_t excess = count_[c] > floor(c) ? count_[c] - floor(c) : 0;
      for (std::size_t n = std::min(low_water_[c], excess); n > 0; --n) {
        Node* node = free_[c];
        free_[c] = node->next;
        --count_[c];
        ::operator delete(node);
        freed += class_size(c);
      }
      low_water_[c] = count_[c];
      if (count_[c] <= floor(c)) over_ &= ~(std::uint64_t{1} << c);
    }
    bytes_ -= freed;
    return freed;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  struct Node {
    Node* next;
  };
  static constexpr std::size_t floor(std::size_t c) {
    return c < kSmallClasses ? kSmallFloor : kLargeFloor;
  }
#if SPINDLE_ASAN || SPINDLE_TSAN
  static constexpr bool kDisabled = true;
#else
  static constexpr bool kDisabled = false;
#endif
  Node* free_[kClasses] = {};
  std::size_t count_[kClasses] = {};
  std::size_t low_water_[kClasses] = {};
  std::size_t bytes_ = 0;
  /// Bit c set while class c holds more than its floor.
  std::uint64_t over_ = 0;
  bool closed_ = false;
};

thread_local BlockCache blocks;

}  // namespace

void* take_block(std::size_t size) { return blocks.take(size); }

void give_block(void* block, std::size_t size) noexcept {
  if (block != nullptr) blocks.give(block, size);
}

bool detail::blocks_over_floor() { return blocks.over_floor(); }

std::size_t detail::trim_blocks() { return blocks.trim(); }

std::size_t detail::cached_block_bytes() { return blocks.bytes(); }

}  // namespace spindle
