#pragma once
/// Memory a worker keeps for reuse, and how it is given back after a burst.
///
/// Pools of stacks, buffers and connection objects make the steady state cheap, but a burst
/// (10,000 connections arriving at once) fills them far beyond what the steady state needs.
/// Each such pool is a FreeList: it remembers the fewest items it held since the last trim
/// (its low-water mark), which is what nobody needed all that while. The worker trims its
/// pools once a second while any holds more than its floor (Worker::trim_idle_memory), so a
/// pool follows its load down within about two seconds and then costs no timer at all.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace spindle {

/// A pool kept by something other than the worker itself (the HTTP server's connection
/// buffers), trimmed with the worker's own (Worker::keep_trimmed). Owner thread only.
class IdleCache {
 public:
  virtual ~IdleCache() = default;
  /// True if it holds more than it keeps when idle.
  virtual bool over_floor() const = 0;
  /// Gives back what was not taken since the last trim, down to the floor; returns about how
  /// many bytes of malloc's heap that freed (what a malloc_trim may then give back; pages
  /// handed straight to the kernel, as a BlockSlab's, do not count).
  virtual std::size_t trim() = 0;
};

/// A LIFO of reusable items with a low-water mark. Not thread-safe.
template <typename T>
class FreeList {
 public:
  /// Keeps at most `max` items; a trim never goes below `floor`.
  FreeList(std::size_t floor, std::size_t max) : floor_(floor), max_(max) {}

  bool empty() const { return items_.empty(); }
  std::size_t size() const { return items_.size(); }
  /// True if it holds more than its floor.
  bool over_floor() const { return items_.size() > floor_; }

  /// The most recently given item (warmest in cache). Not empty().
  T take() {
    T item = std::move(items_.back());
    items_.pop_back();
    low_water_ = std::min(low_water_, items_.size());
    return item;
  }
  /// Keeps `item` for reuse (moved from) and returns true, or returns false and leaves it to
  /// the caller when the list is full.
  bool give(T&& item) {
    if (items_.size() >= max_) return false;
    items_.push_back(std::move(item));
    return true;
  }
  /// Hands the items nobody took since the last trim (oldest first, never below the floor) to
  /// `dispose`; returns how many.
  template <typename Dispose>
  std::size_t trim(Dispose&& dispose) {
    std::size_t excess = items_.size() > floor_ ? items_.size() - floor_ : 0;
    std::size_t n = std::min(low_water_, excess);
    for (std::size_t i = 0; i < n; ++i) dispose(std::move(items_[i]));
    items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(n));
    low_water_ = items_.size();
    if (items_.capacity() > 2 * items_.size() + 64) items_.shrink_to_fit();
    return n;
  }
  /// Hands every item to `dispose`.
  template <typename Dispose>
  void clear(Dispose&& dispose) {
    for (T& item : items_) dispose(std::move(item));
    items_.clear();
    low_water_ = 0;
  }

 private:
  /// Items kept through any trim.
  std::size_t floor_;
  /// Most items kept.
  std::size_t max_;
  /// The items (back: most recently given).
  std::vector<T> items_;
  /// Fewest items held since the last trim: what nobody needed in that time.
  std::size_t low_water_ = 0;
};

}  // namespace spindle
