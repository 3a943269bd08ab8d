#pragma once
/// StackPool: the per-worker "coroutine pool" of fiber stacks.
///
/// Each stack is an mmap'd region with a PROT_NONE guard page below it, so an overflow faults
/// instead of corrupting a neighbour. A pool made with `huge_pages` carves its stacks instead
/// from chunks the kernel backs with 2 MiB pages (transparent huge pages, `madvise`), so that
/// a thousand waiting fibers' stacks take a few TLB entries instead of a thousand: there only
/// the chunk's lowest stack has a guard page, the others a canary at their bottom checked when
/// the stack comes back (an overwritten one aborts, naming the overflow), and a used stack
/// costs its whole size in memory (the huge page is resident), not the pages it touched. Freed
/// stacks of the pool's size are kept for reuse, so a spawn on a warm pool costs no syscall; those
/// not reused for a while are unmapped (trim()), so a burst of fibers does not keep its stacks'
/// pages. Each stack is registered with valgrind while mapped (a no-op outside it), so that it
/// follows the switches. Not thread-safe: one pool per worker.

#include <cstddef>
#include <limits>
#include <vector>

#include "spindle/fiber/idle_cache.h"

namespace spindle {

/// One fiber stack: [base, base + size) is usable; the guard page lies just below base.
struct Stack {
  /// Lowest usable address.
  void* base = nullptr;
  /// Usable bytes.
  std::size_t size = 0;
  /// Valgrind's id for the stack (0 outside valgrind).
  unsigned valgrind_id = 0;

  /// The highest address (where a downward-growing stack starts).
  void* top() const { return static_cast<char*>(base) + size; }
};

/// A cache of guarded stacks of one size.
class StackPool {
 public:
  /// The default usable stack size: 64 KiB; four times that under AddressSanitizer, whose
  /// redzones make every frame larger (so the same code overflows there first).
#if defined(__SANITIZE_ADDRESS__)
  static constexpr std::size_t kDefaultStackSize = 256 * 1024;
#else
  static constexpr std::size_t kDefaultStackSize = 64 * 1024;
#endif

  /// Stacks kept through any trim.
  static constexpr std::size_t kFloor = 16;

  /// No limit on the stacks kept for reuse (the default): what a burst of fibers left is kept
  /// until a trim finds it unused. A limit below the swings of a worker's live fibers makes
  /// every swing unmap stacks and map them again (three system calls and fresh pages each):
  /// 5,000 requests in flight proxied to an HTTP/2 upstream, ending in batches as its answers
  /// come and starting in batches as the clients' requests do, cost 1.6 times the CPU with a
  /// limit of 1,024 (docs/performance.md). Memory is no reason for one: a kept stack was in
  /// use in the burst, and the trim follows the load down within two seconds.
  static constexpr std::size_t kKeepAll = std::numeric_limits<std::size_t>::max();

  /// Bytes of each huge-page chunk (a multiple of 2 MiB).
  static constexpr std::size_t kChunkSize = 16 << 20;

  /// A pool of `stack_size`-byte stacks (rounded up to pages) keeping at most `max_cached`;
  /// with `huge_pages`, its stacks come from huge-page chunks (above), as many as are needed.
  explicit StackPool(std::size_t stack_size = kDefaultStackSize, std::size_t max_cached = kKeepAll,
                     bool huge_pages = false);
  ~StackPool();
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  /// A stack of at least `size` bytes (0: the pool's size). Throws std::system_error with the
  /// kernel's reason when it refuses the mapping (ENOMEM: memory, or vm.max_map_count, as each
  /// stack needs two mappings).
  Stack allocate(std::size_t size = 0);
  /// True if this pool's stacks come from huge-page chunks.
  bool huge_pages() const { return per_chunk_ != 0; }
  /// Test hook: the next `count` allocate() calls fail as if the kernel had refused them, so
  /// that what a failed spawn does can be tested.
  void fail_next_allocations(std::size_t count) { fail_next_ = count; }
  /// Returns a stack; kept for reuse if it has the pool's size and the cache has room (a
  /// chunk's stack always is). Aborts with a message if a chunk's stack overflowed.
  void deallocate(Stack stack);

  /// Usable size of the pool's stacks.
  std::size_t stack_size() const { return stack_size_; }
  /// Stacks waiting for reuse.
  std::size_t cached() const { return free_.size() + chunk_free_.size(); }
  /// True if more than kFloor stacks wait for reuse, or a chunk holds memory no stack uses.
  bool over_floor() const;
  /// Unmaps the cached stacks not reused since the last trim (FreeList) and gives back the
  /// memory of each chunk no stack uses; returns the bytes.
  std::size_t trim();

  /// Size of the guard page(s) below each stack.
  static std::size_t guard_size();

 private:
  /// Usable bytes of each pooled stack, page-aligned.
  std::size_t stack_size_;
  /// A huge-page chunk: `per_chunk_` stacks from `base` up.
  struct Chunk {
    char* base = nullptr;
    /// Its stacks in use.
    std::size_t in_use = 0;
    /// Memory touched since the last trim gave it back.
    bool resident = false;
  };

  /// The chunk holding `base`, or nullptr.
  Chunk* chunk_of(const void* base);
  /// Maps a chunk and adds its stacks to chunk_free_.
  void add_chunk();

  /// Stacks ready for reuse (LIFO: the most recently used is warmest in cache).
  FreeList<Stack> free_;
  /// Stacks a chunk holds (0: no huge pages).
  std::size_t per_chunk_ = 0;
  /// The chunks, in the order they were made.
  std::vector<Chunk> chunks_;
  /// The chunks' stacks not in use (LIFO, as free_).
  std::vector<Stack> chunk_free_;
  /// Allocations still to fail (fail_next_allocations).
  std::size_t fail_next_ = 0;
};

}  // namespace spindle
