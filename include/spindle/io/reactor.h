#pragma once
/// Reactor: one edge-triggered epoll instance per worker, plus an eventfd to wake it from other
/// threads.
///
/// It is a mechanism only: it tells its owner which registered descriptors became ready and
/// knows nothing of fibers. An fd is registered once, for reading and writing, for its lifetime
/// (EPOLLET), so readiness costs no epoll_ctl per wait. Not thread-safe except wake().

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/io/unique_fd.h"

namespace spindle {

class Waiter;

/// A parked reader's buffer, which its worker reads into as it wakes it (TcpStream::read): the
/// reads of the fibers one poll wakes are then made in a row, before any of them runs, and the
/// kernel's work for each does not evict the fibers' code and data from the caches in between.
struct ReadAhead {
  std::span<char> buffer;
  /// Set once read: recv's result, and its errno when that is negative.
  bool done = false;
  ssize_t result = 0;
  int error = 0;
};

/// Per-descriptor state of one registration. Slots are pooled and reused; a generation
/// number discards events that were queued for a slot's previous owner.
struct IoSlot {
  /// The registered descriptor (not owned).
  int fd = -1;
  /// Incremented on every release; part of the epoll cookie.
  std::uint32_t generation = 0;
  /// Index in the reactor's slot table.
  std::uint32_t index = 0;
  /// True once EPOLLOUT is in the registration (added on the first write that must wait).
  bool watches_writable = false;
  /// True after a read found the socket empty (it would block, or came back shorter than
  /// asked) until the reactor next reports the slot readable. While set, a read parks at once:
  /// the system call could only say EAGAIN.
  bool drained = false;
  /// True once the reactor saw the peer hang up (EPOLLRDHUP, EPOLLHUP) or an error: no edge
  /// follows that, so `drained` is never set again (the next read returns 0 or the error).
  bool hung_up = false;
  /// Who is parked waiting for readability (owned by the fiber layer), or nullptr.
  Waiter* reader = nullptr;
  /// The parked reader's buffer, to read into as it is woken (see ReadAhead), or nullptr.
  ReadAhead* read_ahead = nullptr;
  /// Who is parked waiting for writability, or nullptr.
  Waiter* writer = nullptr;
  /// Called once (then cleared) when the slot becomes readable and no fiber waits to read:
  /// lets an idle connection wait with no fiber at all.
  void (*on_readable)(IoSlot& slot) = nullptr;
  /// Whatever on_readable needs (the idle connection).
  void* owner = nullptr;
};

/// The edge-triggered epoll loop of one worker.
class Reactor {
 public:
  /// Creates the epoll instance and the wake-up eventfd. Throws std::system_error on failure.
  Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  /// Registers `fd` (non-blocking) for EPOLLIN|EPOLLPRI|EPOLLRDHUP, edge-triggered. Returns the
  /// slot, or the epoll_ctl error. Writability is not watched until watch_writable(): with it,
  /// every ACK that frees send-buffer space would wake the loop, though most writes never wait.
  [[nodiscard]] Result<IoSlot*> add(int fd);

  /// Adds EPOLLOUT to the registration, once per descriptor (later calls cost nothing). Call
  /// after a write said EAGAIN: the kernel reports the edge at once if the socket has become
  /// writable meanwhile, so nothing is missed.
  [[nodiscard]] std::error_code watch_writable(IoSlot& slot);

  /// Releases a slot before its descriptor is closed. Costs no syscall: closing the descriptor
  /// removes it from epoll, and the generation check drops events already queued for it.
  void release(IoSlot* slot);

  /// True if the slot table ends in a block with no slot in use (trim() would drop it).
  bool trimmable() const;
  /// Drops the blocks at the end of the slot table that have no slot in use (after a burst
  /// of connections); returns the bytes freed. Slots in use never move.
  std::size_t trim();

  /// Waits up to `timeout` (negative: forever, zero: poll) and calls `on_ready(slot, events)`
  /// for each ready registration. Returns the number of events, or the epoll error.
  template <typename OnReady>
  Result<int> poll(std::chrono::milliseconds timeout, OnReady&& on_ready);

  /// Makes a blocked or future poll() return promptly. Safe from any thread.
  void wake();

  /// Number of slots in use.
  std::size_t registered() const { return slot_count_ - free_.size(); }

 private:
  static constexpr int kMaxEvents = 256;
  /// Slots per block of the slot table (a power of two).
  static constexpr std::uint32_t kSlotsPerBlock = 256;
  /// Cookie of the wake-up eventfd (no slot has this index).
  static constexpr std::uint64_t kWakeCookie = UINT64_MAX;

  /// Slot `i` of the table (i < slot_count_).
  IoSlot& slot_at(std::uint32_t i) { return blocks_[i / kSlotsPerBlock][i % kSlotsPerBlock]; }
  /// Maps an event cookie to its slot, or nullptr if it is stale or the wake-up fd.
  IoSlot* slot_for(std::uint64_t cookie);
  /// Reads the eventfd so that the next wake() produces a new edge.
  void drain_wake();

  /// The epoll instance.
  UniqueFd epoll_;
  /// Written by wake() to interrupt epoll_wait.
  UniqueFd wake_fd_;
  /// True while a wake-up is written and not yet drained: later wake() calls skip the write.
  std::atomic<bool> wake_pending_{false};
  /// Slot table: fixed blocks, so that slot addresses stay stable as it grows (cheaper to
  /// index than a std::deque; see slot_at).
  std::vector<std::unique_ptr<IoSlot[]>> blocks_;
  /// Slots made so far.
  std::uint32_t slot_count_ = 0;
  /// Slots in use in each block.
  std::vector<std::uint32_t> in_use_;
  /// Indexes of free slots, a min-heap (the lowest is reused first).
  std::vector<std::uint32_t> free_;
  /// Generation of the next slot made: above those of every block trim() dropped.
  std::uint32_t next_generation_ = 0;
  /// Buffer for epoll_wait.
  epoll_event events_[kMaxEvents];
};

template <typename OnReady>
Result<int> Reactor::poll(std::chrono::milliseconds timeout, OnReady&& on_ready) {
  int n = ::epoll_wait(epoll_.get(), events_, kMaxEvents, static_cast<int>(timeout.count()));
  if (n < 0) {
    if (errno == EINTR) return 0;
    return fail_errno();
  }
  for (int i = 0; i < n; ++i) {
    if (events_[i].data.u64 == kWakeCookie) {
      drain_wake();
      continue;
    }
    if (IoSlot* slot = slot_for(events_[i].data.u64)) on_ready(*slot, events_[i].events);
  }
  return n;
}

}  // namespace spindle
