// LogOutput: a log destination written by a thread of its own, within bounds of memory and of
// time whatever the output does (log_output.h).
#include "spindle/base/log_output.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>
#include <utility>

#include "log_internal.h"
#include "spindle/base/error.h"
#include "spindle/base/log.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;

// How often the writer runs its tick, and how often it says that it dropped lines.
constexpr auto kTick = 1s;
constexpr auto kReportEvery = 5s;

// How a descriptor is written without the writer ever blocking in write(2).
enum class Kind {
  kFile,         // a regular file: writes do not wait on a reader
  kNonBlocking,  // an open file description of our own with O_NONBLOCK (EAGAIN when full)
  kSocket,       // send(2) with MSG_DONTWAIT: no flag changed on a descriptor others share
  kPipe,         // a pipe shared with others: poll, then at most PIPE_BUF (never blocks)
};

// The kind of `fd`, and the descriptor to write it through: for a pipe or a terminal inherited
// from whoever started us, a description of our own opened through /proc, so that O_NONBLOCK
// changes nothing for the others writing to it (a shell, the other processes of a pipeline).
std::pair<int, Kind> writable_copy(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {-1, Kind::kFile};
  if (S_ISREG(st.st_mode)) return {::fcntl(fd, F_DUPFD_CLOEXEC, 3), Kind::kFile};
  if (S_ISSOCK(st.st_mode)) return {::fcntl(fd, F_DUPFD_CLOEXEC, 3), Kind::kSocket};
  std::string proc = "/proc/self/fd/" + std::to_string(fd);
  int own = ::open(proc.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (own >= 0) return {own, Kind::kNonBlocking};
  return {::fcntl(fd, F_DUPFD_CLOEXEC, 3), S_ISFIFO(st.st_mode) ? Kind::kPipe : Kind::kFile};
}

}  // namespace

struct LogOutput::Fd {
  int fd = -1;
  Kind kind = Kind::kFile;

  Fd(int f, Kind k) : fd(f), kind(k) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  // Writes what the output takes now, without waiting: the count, or -1 with errno (EAGAIN:
  // nothing now).
  ssize_t write_now(std::string_view data) const {
    ssize_t n;
    do {
      switch (kind) {
        case Kind::kSocket:
          n = ::send(fd, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
          break;
        case Kind::kPipe: {
          // POLLOUT on a pipe means room for PIPE_BUF bytes: a write of that much never waits.
          pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
          if (::poll(&p, 1, 0) == 0) {
            errno = EAGAIN;
            return -1;
          }
          n = ::write(fd, data.data(), std::min<std::size_t>(data.size(), PIPE_BUF));
          break;
        }
        default:
          n = ::write(fd, data.data(), data.size());
      }
    } while (n < 0 && errno == EINTR);
    return n;
  }
};

LogOutput::LogOutput(std::shared_ptr<Fd> fd, std::string name, std::string path,
                     std::size_t max_pending)
    : name_(std::move(name)),
      path_(std::move(path)),
      fd_(std::move(fd)),
      max_pending_(max_pending),
      wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      owner_(::getpid()) {
  writer_ = std::make_unique<std::thread>([this] { run(); });
}

namespace {
// `path` opened for appending (made 0644 if missing); O_NONBLOCK: a named pipe is written
// without waiting (a regular file ignores it).
std::expected<std::pair<int, Kind>, std::error_code> open_for_append(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) return std::unexpected(last_errno());
  struct stat st {};
  return std::pair{
      fd, ::fstat(fd, &st) == 0 && !S_ISREG(st.st_mode) ? Kind::kNonBlocking : Kind::kFile};
}
}  // namespace

std::expected<std::shared_ptr<LogOutput>, std::error_code> LogOutput::open(
    const std::string& path, std::size_t max_pending) {
  auto opened = open_for_append(path);
  if (!opened) return std::unexpected(opened.error());
  return std::shared_ptr<LogOutput>(
      new LogOutput(std::make_shared<Fd>(opened->first, opened->second), path, path, max_pending));
}

std::shared_ptr<LogOutput> LogOutput::adopt(int fd, std::string name, std::size_t max_pending) {
  auto [own, kind] = writable_copy(fd);
  return std::shared_ptr<LogOutput>(
      new LogOutput(std::make_shared<Fd>(own, kind), std::move(name), std::string(), max_pending));
}

namespace {
// The process's standard output and error (made on first use; freed at exit).
std::atomic<LogOutput*> g_standard_output{nullptr};
std::atomic<LogOutput*> g_standard_error{nullptr};
std::mutex g_standard_lock;

void close_standard_outputs() {
  detail::mark_logs_closing();
  // Standard output first: what its writer says of its drops goes to standard error.
  LogOutput* out = g_standard_output.load();
  LogOutput* err = g_standard_error.load();
  if (out != nullptr) out->close();
  if (err != nullptr) err->close();
  g_standard_output.store(nullptr);
  g_standard_error.store(nullptr);
  delete out;
  delete err;
  detail::free_log_places();  // (the error log's writer, which reads it, has stopped)
}
}  // namespace

void detail::close_logs_at_exit() {
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(&close_standard_outputs); });
}

LogOutput& LogOutput::standard(std::atomic<LogOutput*>& slot, int fd, const char* name,
                               std::size_t max_pending) {
  if (LogOutput* made = slot.load(std::memory_order_acquire)) return *made;
  detail::close_logs_at_exit();
  std::lock_guard guard(g_standard_lock);
  if (LogOutput* made = slot.load()) return *made;
  auto [own, kind] = writable_copy(fd);
  auto* made = new LogOutput(std::make_shared<Fd>(own, kind), name, std::string(), max_pending);
  slot.store(made, std::memory_order_release);
  return *made;
}

LogOutput& LogOutput::standard_output() {
  return standard(g_standard_output, STDOUT_FILENO, "standard output", 4 << 20);
}

LogOutput& LogOutput::standard_error() {
  return standard(g_standard_error, STDERR_FILENO, "standard error", 1 << 20);
}

LogOutput* LogOutput::standard_error_if_open() {
  return g_standard_error.load(std::memory_order_acquire);
}

LogOutput::~LogOutput() {
  close();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

bool LogOutput::write(std::string_view text, std::size_t lines, unsigned flags) {
  std::unique_lock lock(mutex_);
  if (closed_ && ((flags & kDirect) == 0 || !queue_.empty())) {
    dropped_ += lines;
    return false;
  }
  // Closed, a direct line still goes out if the output takes it at once (the error log of
  // what runs at exit after the close).
  if ((flags & kDirect) != 0 && queue_.empty() && !busy_) {
    ssize_t n = fd_->write_now(text);
    if (n == static_cast<ssize_t>(text.size())) return true;
    if (n > 0) {
      text.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      dropped_ += lines;
      last_error_ = last_errno();
      return false;
    }
  }
  if (closed_ || ((flags & kKeep) == 0 && pending_ + text.size() > max_pending_)) {
    dropped_ += lines;
    return false;
  }
  queue_.push_back(Chunk{std::string(text), lines, 0});
  pending_ += text.size();
  lock.unlock();
  ready_.notify_one();
  return true;
}

std::error_code LogOutput::reopen() {
  if (path_.empty()) return {};
  auto opened = open_for_append(path_);
  if (!opened) return opened.error();
  auto fd = std::make_shared<Fd>(opened->first, opened->second);
  {
    std::lock_guard guard(mutex_);
    std::swap(fd_, fd);  // the old one closes once the writer lets go of it too
  }
  wake();
  return {};
}

void LogOutput::finish_by(Clock::time_point deadline) {
  std::lock_guard guard(mutex_);
  finish_by_ = deadline;
}

void LogOutput::close() {
  {
    std::lock_guard guard(mutex_);
    if (!closing_) {
      closing_ = true;
      if (finish_by_ == Clock::time_point::max()) finish_by_ = Clock::now() + 1s;
    }
  }
  wake();
  ready_.notify_one();
  // A forked child's copy has no thread (its object is a copy of the parent's: left alone);
  // the writer itself (a tick letting go of the last reference) cannot wait for itself.
  std::lock_guard join(join_lock_);
  if (!writer_) return;
  if (::getpid() != owner_) {
    (void)writer_.release();
  } else if (writer_->get_id() == std::this_thread::get_id()) {
    writer_->detach();
    writer_.reset();
  } else {
    writer_->join();
    writer_.reset();
  }
  std::lock_guard guard(mutex_);
  closed_ = true;
}

void LogOutput::set_max_pending(std::size_t bytes) {
  std::lock_guard guard(mutex_);
  max_pending_ = bytes;
}

std::size_t LogOutput::max_pending() const {
  std::lock_guard guard(mutex_);
  return max_pending_;
}

std::uint64_t LogOutput::dropped_lines() const {
  std::lock_guard guard(mutex_);
  return dropped_;
}

std::size_t LogOutput::pending_bytes() const {
  std::lock_guard guard(mutex_);
  return pending_;
}

void LogOutput::on_tick(std::function<void()> tick) {
  std::lock_guard guard(mutex_);
  tick_ = std::move(tick);
}

void LogOutput::wake() {
  if (wake_fd_ < 0) return;
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
}

void LogOutput::run() {
  auto next_tick = Clock::now() + kTick;
  std::unique_lock lock(mutex_);
  for (;;) {
    auto now = Clock::now();
    if (now >= next_tick) {
      std::function<void()> tick = tick_;
      lock.unlock();
      if (tick) tick();
      report_drops();
      lock.lock();
      next_tick = Clock::now() + kTick;
      continue;
    }
    if (queue_.empty()) {
      if (closing_) break;
      ready_.wait_until(lock, next_tick);
      continue;
    }
    if (closing_ && now >= finish_by_) {
      drop_all();
      break;
    }
    if (write_some(lock)) continue;
    // The output takes nothing now: wait until it does, or the tick, or the deadline.
    auto fd = fd_;
    auto until = closing_ ? std::min(next_tick, finish_by_) : next_tick;
    lock.unlock();
    wait_writable(fd, until);
    lock.lock();
  }
  closed_ = true;
  lock.unlock();
  report_drops();
}

bool LogOutput::write_some(std::unique_lock<std::mutex>& lock) {
  auto fd = fd_;
  std::string_view rest = std::string_view(queue_.front().text).substr(queue_.front().written);
  busy_ = true;
  lock.unlock();
  ssize_t n = fd->write_now(rest);
  int error = errno;
  lock.lock();
  busy_ = false;
  Chunk& chunk = queue_.front();  // (write() only adds at the back: the front stays)
  if (n < 0 && (error == EAGAIN || error == EWOULDBLOCK)) return false;
  if (n > 0) {
    chunk.written += static_cast<std::size_t>(n);
    if (chunk.written < chunk.text.size()) return true;
  } else {
    // The output failed (a reader gone, a full disk): these lines are lost, and said so.
    dropped_ += chunk.lines;
    last_error_ = errno_code(n < 0 ? error : EIO);
  }
  pending_ -= chunk.text.size();
  queue_.pop_front();
  return true;
}

void LogOutput::wait_writable(const std::shared_ptr<Fd>& fd, Clock::time_point until) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
  int timeout = static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1000));
  pollfd fds[2] = {{.fd = fd->fd, .events = POLLOUT, .revents = 0},
                   {.fd = wake_fd_, .events = POLLIN, .revents = 0}};
  if (::poll(fds, 2, timeout) > 0 && fds[1].revents != 0) {
    std::uint64_t count;
    [[maybe_unused]] auto n = ::read(wake_fd_, &count, sizeof count);
  }
}

void LogOutput::drop_all() {
  for (const Chunk& chunk : queue_) dropped_ += chunk.lines;
  queue_.clear();
  pending_ = 0;
}

void LogOutput::report_drops() {
  std::uint64_t dropped, since;
  std::error_code error;
  std::size_t bound;
  {
    std::lock_guard guard(mutex_);
    auto now = Clock::now();
    if (dropped_ == reported_ || (now - last_report_ < kReportEvery && !closed_)) return;
    since = dropped_ - reported_;
    reported_ = dropped_;
    last_report_ = now;
    dropped = dropped_;
    error = std::exchange(last_error_, {});
    bound = max_pending_;
  }
  std::string why =
      error ? fmt::format("writing failed ({})", error.message())
            : fmt::format("the output took them slower than they came ({} bytes may wait)", bound);
  log_warn("log output {}: {} line(s) dropped since the last report ({} in all): {}", name_, since,
           dropped, why);
}

}  // namespace spindle
