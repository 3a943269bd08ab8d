#pragma once
/// BlockSlab: large blocks of one size (a connection's read buffer) carved from mappings of
/// their own, apart from the malloc heap, and given back to the kernel page by page when
/// nobody needs them.
///
/// Why not malloc: a burst of connections takes thousands of such blocks from the heap at once,
/// between the small objects those connections keep. Freed after the burst, the blocks leave
/// holes that later small objects settle in; malloc_trim cannot give back a page one of them
/// sits on, so the burst's memory stays resident (measured: 7.9 KB per idle HTTP/2 connection
/// after a burst of 2,000, 4.9 KB with the blocks apart). Here the blocks never share a page
/// with anything else, and a trim gives back exactly the pages of the blocks nobody took.
///
/// Blocks wait for reuse resident (LIFO: the warmest first) up to `max_resident`; the worker's
/// trim (IdleCache) gives back the pages of those not taken since the last trim, down to
/// `floor`, with madvise: the block stays in the slab, and its pages come back zeroed when it
/// is next written. Mappings are kept until the slab goes: its address space follows the peak,
/// its resident memory the load. Not thread-safe: one per worker.

#include <cstddef>
#include <vector>

#include "spindle/fiber/idle_cache.h"

namespace spindle {

class BlockSlab {
 public:
  /// Blocks of `block_size` bytes (at least 1), `floor` and `max_resident` as above.
  BlockSlab(std::size_t block_size, std::size_t floor, std::size_t max_resident);
  /// Unmaps every mapping: no block may be in use any more.
  ~BlockSlab();
  BlockSlab(const BlockSlab&) = delete;
  BlockSlab& operator=(const BlockSlab&) = delete;

  /// A block of block_size() bytes, its content unspecified (std::bad_alloc if no mapping can
  /// be had).
  char* take();
  /// Takes back a block of this slab.
  void give(char* block);
  /// Gives back the pages of the blocks not taken since the last trim, down to the floor;
  /// returns how many bytes.
  std::size_t trim();

  std::size_t block_size() const { return block_size_; }
  /// Blocks waiting for reuse with their pages resident.
  std::size_t resident() const { return resident_.size(); }
  /// True if more than the floor wait resident.
  bool over_floor() const { return resident_.over_floor(); }

 private:
  /// Gives a block's pages back; it waits among the released ones.
  void release(char* block);

  std::size_t block_size_;
  /// From one block to the next: block_size_ in whole pages (and, under AddressSanitizer, a
  /// poisoned page between blocks, so that running off a block's end is reported).
  std::size_t stride_;
  FreeList<char*> resident_;
  /// Blocks whose pages were given back.
  std::vector<char*> released_;
  struct Mapping {
    char* base;
    std::size_t size;
  };
  std::vector<Mapping> mappings_;
  /// The newest mapping's blocks not yet handed out: from `carve_`, this many.
  char* carve_ = nullptr;
  std::size_t carve_left_ = 0;
};

}  // namespace spindle
