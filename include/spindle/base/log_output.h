#pragma once
/// LogOutput: where log lines go (a file, standard output, standard error), written by a thread
/// of its own so that no caller waits on the output, and within bounds whatever the output
/// does (a reader that stops, a full disk, a container runtime's stalled pipe):
///
/// - memory: at most max_pending bytes wait; lines past it are dropped and counted (as
///   journald's rate limit and nginx's log buffer bound theirs), reported in the error log every
///   few seconds while it happens;
/// - time: the thread never blocks in a write (a pipe or socket is written without waiting; it
///   waits in poll, where it can be woken), so that close() ends by its deadline, whatever is
///   left is dropped and counted.
///
/// A file output can be reopened (logrotate renames the file, then asks for a new one).

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <expected>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

namespace spindle {

/// A log destination with its writer thread. Thread-safe.
class LogOutput {
 public:
  using Clock = std::chrono::steady_clock;

  /// How write() treats a line.
  enum Flags : unsigned {
    kQueued = 0,
    /// Written by the caller at once, without waiting, when nothing waits before it (what the
    /// output does not take at once is queued): the error log, whose lines must be out before
    /// a crash can follow them.
    kDirect = 1,
    /// Never dropped for the bound (a line a script waits for, as "listening").
    kKeep = 2,
  };

  /// Opens `path` for appending (made 0644 if missing), bounded at `max_pending` bytes waiting.
  /// Fails with open(2)'s error.
  [[nodiscard]] static std::expected<std::shared_ptr<LogOutput>, std::error_code> open(
      const std::string& path, std::size_t max_pending);
  /// Writes to descriptor `fd` (not taken: a copy of its own, opened through /proc for a pipe
  /// or a terminal so that nothing changes for the others writing to it), as `name`.
  static std::shared_ptr<LogOutput> adopt(int fd, std::string name, std::size_t max_pending);
  /// The process's standard output and standard error, made on first use: one writer each, as
  /// two writers to one pipe would cut each other's lines. Closed and freed at exit (atexit),
  /// within finish_by's deadline (a second if none was set).
  static LogOutput& standard_output();
  static LogOutput& standard_error();
  /// Standard error's, or nullptr once it was freed at exit (the error log then writes to
  /// the descriptor itself).
  static LogOutput* standard_error_if_open();
  /// Closes (close()).
  ~LogOutput();
  LogOutput(const LogOutput&) = delete;
  LogOutput& operator=(const LogOutput&) = delete;

  /// Hands `text` (`lines` whole lines) to the output. False if it was dropped: the output is
  /// closed, or max_pending bytes wait already (unless kKeep).
  bool write(std::string_view text, std::size_t lines = 1, unsigned flags = kQueued);
  /// Opens the file at its path again (after it was renamed): what is written from now on goes
  /// to the new file. Nothing for standard output and error. On failure the old file stays.
  std::error_code reopen();
  /// The latest time close() writes until (a shutdown's deadline); by default a second after
  /// close() begins.
  void finish_by(Clock::time_point deadline);
  /// Takes no more lines, writes what waits until finish_by's deadline, drops (and counts) the
  /// rest, and stops its thread. Idempotent.
  void close();
  /// The bound of bytes waiting; a new one applies to the lines that come next.
  void set_max_pending(std::size_t bytes);
  std::size_t max_pending() const;

  /// Lines dropped so far (the bound, an output that failed, or left at close).
  std::uint64_t dropped_lines() const;
  /// Bytes waiting to be written now.
  std::size_t pending_bytes() const;
  /// "standard output", "standard error", or the file's path.
  const std::string& name() const { return name_; }
  /// The file's path ("" for standard output and error).
  const std::string& path() const { return path_; }

  /// Runs `tick` on the output's thread about once a second (reports that must come even when
  /// nothing is written: the error log's suppressed-line counts). Set before lines come.
  void on_tick(std::function<void()> tick);

 private:
  struct Chunk {
    std::string text;
    std::size_t lines = 0;
    std::size_t written = 0;  ///< bytes of text already out
  };
  /// A descriptor, closed when the last holder lets go (the writer may hold the one a reopen
  /// replaced until its write returns).
  struct Fd;

  LogOutput(std::shared_ptr<Fd> fd, std::string name, std::string path, std::size_t max_pending);
  /// The standard output in `slot` (made on first use, for descriptor `fd`).
  static LogOutput& standard(std::atomic<LogOutput*>& slot, int fd, const char* name,
                             std::size_t max_pending);
  /// The writer thread's body.
  void run();
  /// Writes the first chunk once, without waiting; false if the output takes nothing now.
  bool write_some(std::unique_lock<std::mutex>& lock);
  /// Waits until the output takes bytes, or `until`, or a wake-up; never longer than a second.
  void wait_writable(const std::shared_ptr<Fd>& fd, Clock::time_point until);
  /// Drops every chunk waiting (counted).
  void drop_all();
  /// Says, at most every few seconds, that lines were dropped and why.
  void report_drops();
  void wake();

  const std::string name_;
  const std::string path_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::shared_ptr<Fd> fd_;
  std::deque<Chunk> queue_;
  std::size_t pending_ = 0;
  std::size_t max_pending_;
  /// The writer is writing the first chunk (outside the lock): no direct write may pass it.
  bool busy_ = false;
  bool closing_ = false;
  bool closed_ = false;
  Clock::time_point finish_by_ = Clock::time_point::max();
  std::uint64_t dropped_ = 0;
  std::uint64_t reported_ = 0;  ///< dropped_ as of the last report
  Clock::time_point last_report_{};
  std::error_code last_error_;  ///< the output's last failure, reported with the drops
  std::function<void()> tick_;
  /// An eventfd that wakes the writer from poll (close, reopen).
  int wake_fd_ = -1;
  pid_t owner_ = 0;  ///< the process whose thread writes (a forked child's copy has none)
  /// Held by close() while it ends the writer (two closing at once: the second waits).
  std::mutex join_lock_;
  std::unique_ptr<std::thread> writer_;
};

}  // namespace spindle
