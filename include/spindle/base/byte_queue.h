// Bytes that arrive at one end and leave at the other: a stream's body between the side that
// receives it and the side that takes it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace spindle {

/// A string and the offset of its first byte not yet taken. What has been taken is dropped
/// once it is at least as large as what waits (so each move is of no more bytes than were
/// taken since the last), or all at once when nothing waits: the memory held follows what
/// waits, never what has passed through, however the two ends take turns.
class ByteQueue {
 public:
  /// The bytes waiting, in order.
  std::string_view view() const { return std::string_view(bytes_).substr(begin_); }
  std::size_t size() const { return bytes_.size() - begin_; }
  bool empty() const { return begin_ == bytes_.size(); }

  /// The waiting bytes become `bytes` (taken over, not copied).
  void assign(std::string bytes) {
    bytes_ = std::move(bytes);
    begin_ = 0;
  }
  void append(std::string_view data) {
    if (begin_ > 0 && begin_ >= size()) {
      bytes_.erase(0, begin_);
      begin_ = 0;
    }
    bytes_.append(data);
  }
  /// Drops the first `n` waiting bytes (`n` <= size()).
  void consume(std::size_t n) {
    begin_ += n;
    if (begin_ == bytes_.size()) clear();
  }
  /// Drops every waiting byte, keeping the memory for the next ones.
  void clear() {
    bytes_.clear();
    begin_ = 0;
  }
  /// Bytes held, taken or not (for tests: the bound above).
  std::size_t held() const { return bytes_.size(); }

 private:
  std::string bytes_;
  std::size_t begin_ = 0;
};

}  // namespace spindle
