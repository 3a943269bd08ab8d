#pragma once
/// BufferPool: a worker's pool of I/O buffers of one size (16 KiB), for code that holds a
/// buffer across a wait — a TLS write gathering small pieces, a request body being dropped —
/// without allocating each time and without sharing one buffer between the fibers of a worker
/// (a buffer is lent to one caller at a time, even while its fiber is parked). Not
/// thread-safe: one pool per worker (Worker::buffers()); take_buffer() finds the right one.

#include <cstddef>
#include <memory>
#include <span>

#include "spindle/fiber/idle_cache.h"

namespace spindle {

/// A cache of 16 KiB buffers.
class BufferPool {
 public:
  /// Bytes in each buffer (a TLS record's worth).
  static constexpr std::size_t kBufferSize = 16 * 1024;

  /// A buffer lent by a pool (or owned outright, with no pool); gives itself back when it
  /// goes. Move-only.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&&) noexcept = default;
    Buffer& operator=(Buffer&& other) noexcept {
      if (this != &other) {
        release();
        pool_ = other.pool_;
        data_ = std::move(other.data_);
      }
      return *this;
    }
    ~Buffer() { release(); }

    /// The kBufferSize bytes.
    std::span<char> span() { return {data_.get(), kBufferSize}; }
    char* data() { return data_.get(); }
    static constexpr std::size_t size() { return kBufferSize; }

   private:
    friend class BufferPool;
    friend Buffer take_buffer();
    Buffer(BufferPool* pool, std::unique_ptr<char[]> data) : pool_(pool), data_(std::move(data)) {}
    void release();

    /// Where it goes back (nullptr: freed).
    BufferPool* pool_ = nullptr;
    /// The bytes.
    std::unique_ptr<char[]> data_;
  };

  /// A pool that keeps at most `max_cached` buffers for reuse, and `floor` through any trim.
  explicit BufferPool(std::size_t max_cached = 64, std::size_t floor = 8)
      : free_(floor, max_cached) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// A buffer from the cache, or a new one (std::bad_alloc if none can be had).
  Buffer take();
  /// Buffers waiting for reuse.
  std::size_t cached() const { return free_.size(); }
  /// True if more than the floor wait for reuse.
  bool over_floor() const { return free_.over_floor(); }
  /// Frees the cached buffers not taken since the last trim (FreeList); returns the bytes.
  std::size_t trim();

 private:
  /// Takes a buffer back (freed if the cache is full).
  void give(std::unique_ptr<char[]> data);

  /// Buffers ready for reuse (LIFO: the most recently used is warmest in cache).
  FreeList<std::unique_ptr<char[]>> free_;
};

/// A buffer from the calling worker's pool; on a thread that is not a worker, one of its own.
BufferPool::Buffer take_buffer();

}  // namespace spindle
