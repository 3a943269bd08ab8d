#pragma once
/// Channel<T>: a FIFO queue between fibers (of any workers) and threads, bounded or unbounded,
/// that can be closed.

#include <cstddef>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <system_error>

#include "spindle/base/error.h"
#include "spindle/fiber/spin_lock.h"
#include "spindle/io/deadline.h"
#include "spindle/sync/wait_list.h"

namespace spindle {

/// The error a send to a closed channel, or a receive from a closed and drained one, returns.
inline std::error_code channel_closed() { return std::make_error_code(std::errc::broken_pipe); }

/// A multi-producer multi-consumer channel. send() waits while a bounded channel is full;
/// receive() waits while it is empty. After close(), sends fail and receives drain what is
/// left, then fail with channel_closed().
template <typename T>
class Channel {
 public:
  /// Capacity of an unbounded channel.
  static constexpr std::size_t kUnbounded = std::numeric_limits<std::size_t>::max();

  /// A channel holding at most `capacity` items (at least 1), or unbounded.
  explicit Channel(std::size_t capacity = kUnbounded) : capacity_(capacity ? capacity : 1) {}
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// Queues `value`, waiting for room until `deadline`. Returns {}, channel_closed(),
  /// std::errc::timed_out or std::errc::operation_canceled; on error `value` is not queued.
  [[nodiscard]] std::error_code send(T value, Deadline deadline = Deadline::never()) {
    std::unique_lock guard(lock_);
    for (;;) {
      if (closed_) return channel_closed();
      if (items_.size() < capacity_) break;
      if (auto ec = senders_.wait(lock_, deadline)) return ec;
    }
    items_.push_back(std::move(value));
    receivers_.notify_one();
    return {};
  }

  /// Queues `value` if there is room and the channel is open.
  bool try_send(T value) {
    std::lock_guard guard(lock_);
    if (closed_ || items_.size() >= capacity_) return false;
    items_.push_back(std::move(value));
    receivers_.notify_one();
    return true;
  }

  /// Takes the oldest item, waiting until `deadline`. Fails with channel_closed() once closed
  /// and drained, or with std::errc::timed_out / std::errc::operation_canceled.
  [[nodiscard]] Result<T> receive(Deadline deadline = Deadline::never()) {
    std::unique_lock guard(lock_);
    while (items_.empty()) {
      if (closed_) return fail(channel_closed());
      if (auto ec = receivers_.wait(lock_, deadline)) return fail(ec);
    }
    return take_front();
  }

  /// Takes the oldest item if there is one.
  std::optional<T> try_receive() {
    std::lock_guard guard(lock_);
    if (items_.empty()) return std::nullopt;
    return take_front();
  }

  /// Closes the channel: wakes every waiting sender (they fail) and receiver (they drain, then
  /// fail). Idempotent.
  void close() {
    std::lock_guard guard(lock_);
    closed_ = true;
    senders_.notify_all();
    receivers_.notify_all();
  }

  /// True once closed.
  bool closed() {
    std::lock_guard guard(lock_);
    return closed_;
  }
  /// Items queued now (a snapshot).
  std::size_t size() {
    std::lock_guard guard(lock_);
    return items_.size();
  }

 private:
  // Requires lock_.
  T take_front() {
    T value = std::move(items_.front());
    items_.pop_front();
    senders_.notify_one();
    return value;
  }

  /// Most items queued at once.
  const std::size_t capacity_;
  /// Guards everything below.
  SpinLock lock_;
  /// The queue.
  std::deque<T> items_;
  /// True once closed.
  bool closed_ = false;
  /// Senders waiting for room.
  WaitList senders_;
  /// Receivers waiting for an item.
  WaitList receivers_;
};

}  // namespace spindle
