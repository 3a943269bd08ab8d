#pragma once
/// The calling thread's cache of freed heap blocks, for objects made and dropped per request
/// (fibers, HTTP/2 streams, client exchanges, read buffers).
///
/// malloc keeps a few freed blocks per size for quick reuse (7 in glibc's per-thread cache),
/// and none above 1 KiB. A server with hundreds of requests in flight frees and takes them in
/// bursts of hundreds, so most of its per-request objects went through malloc's slow paths
/// (sorting bins, merging neighbours): about 5,000 instructions per proxied HTTP/2 request.
/// This cache keeps freed blocks by size class (64-byte steps up to 1 KiB, 1 KiB steps up to
/// 32 KiB; larger ones go straight to the heap), at most kBudget bytes per thread. A worker
/// trims it with its other pools (fiber/idle_cache.h): what was not reused for a second goes
/// back to malloc, down to a small floor per class.
///
/// A block may be freed on another thread than the one that took it: it joins that thread's
/// cache (memory is memory). Sanitizer builds skip the cache, so that AddressSanitizer still
/// sees every use after free.

#include <cstddef>
#include <new>
#include <string>

namespace spindle {

/// At least `size` bytes from the calling thread's cache or the heap (std::bad_alloc if none
/// can be had); aligned as operator new aligns.
void* take_block(std::size_t size);
/// Gives back a block from take_block(size), with the same `size`.
void give_block(void* block, std::size_t size) noexcept;

/// For a class whose objects come and go per request: its operator new and delete use the
/// thread's block cache. (Deleting through a base with a virtual destructor gives the most
/// derived size, as a sized delete must.)
struct BlockCached {
  static void* operator new(std::size_t size) { return take_block(size); }
  static void operator delete(void* block, std::size_t size) noexcept { give_block(block, size); }
};

/// An allocator over the block cache, for std::allocate_shared and containers.
template <typename T>
struct BlockAllocator {
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
  using value_type = T;
  BlockAllocator() = default;
  template <typename U>
  BlockAllocator(const BlockAllocator<U>& /*other*/) noexcept {}  // NOLINT: converting
  T* allocate(std::size_t n) { return static_cast<T*>(take_block(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { give_block(p, n * sizeof(T)); }
  friend bool operator==(BlockAllocator, BlockAllocator) { return true; }
};

/// A string whose buffer comes from the block cache (a per-request buffer that outgrows the
/// small-string room).
using BlockString = std::basic_string<char, std::char_traits<char>, BlockAllocator<char>>;

namespace detail {
/// True if some size class of this thread holds more blocks than it keeps when idle.
bool blocks_over_floor();
/// Frees this thread's cached blocks not reused since the last trim; returns the bytes.
std::size_t trim_blocks();
/// Bytes this thread's cache holds now.
std::size_t cached_block_bytes();
}  // namespace detail

}  // namespace spindle
