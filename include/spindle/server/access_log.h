#pragma once
/// AccessLog: one line per request, in the combined format or as JSON lines, written in
/// batches by a helper thread so that no request waits for the disk. Each worker appends to
/// its own buffer (no lock); a buffer is handed to the writer when it reaches 32 KiB or once a
/// second.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/io/unique_fd.h"

namespace spindle {
class Runtime;
}

namespace spindle::http {

/// What is logged of one request.
struct AccessRecord {
  /// The client's address, as text (without the port).
  std::string_view remote;
  std::string_view method;
  std::string_view target;
  /// The authority the request is for (the canonical request's, http/canonical.h; "" if none):
  /// "host" in the JSON format.
  std::string_view authority;
  /// HTTP/1.0, HTTP/1.1 or HTTP/2.0.
  int major_version = 1;
  int minor_version = 1;
  int status = 0;
  /// Body bytes sent.
  std::uint64_t bytes = 0;
  std::string_view referer;
  std::string_view user_agent;
  /// Time from the complete head to the queued response.
  std::chrono::microseconds duration{0};
  /// The request's attributes (Request::set_attribute: the route, the upstream, its timings),
  /// logged as key="value" after the combined fields, or as JSON members.
  std::span<const std::pair<std::string, std::string>> attributes;
};

/// An access log shared by the workers of one runtime.
class AccessLog {
 public:
  /// The line format.
  enum class Format { kCombined, kJson };

  /// Opens `path` for appending ("-" is standard output) and starts the writer thread and a
  /// flusher fiber on each worker of `runtime`. Fails with the open error.
  [[nodiscard]] static Result<std::shared_ptr<AccessLog>> open(Runtime& runtime,
                                                               const std::string& path,
                                                               Format format);
  /// Hands everything over and waits for the writer.
  ~AccessLog();

  /// Formats `record` into the calling worker's buffer. Worker threads only.
  void record(const AccessRecord& record);

  /// Formats one line (for tests and other sinks), with `now` as the time of the request.
  static void format(std::string& out, Format format, const AccessRecord& record,
                     std::chrono::system_clock::time_point now);

 private:
  struct alignas(64) WorkerBuffer {
    std::string text;
    std::chrono::steady_clock::time_point last_handoff{};
  };

  AccessLog(UniqueFd fd, Format format, std::size_t workers);
  /// Passes a worker's buffer to the writer thread.
  void hand_off(WorkerBuffer& buffer);
  /// The writer thread's body.
  void write_loop();

  UniqueFd fd_;
  Format format_;
  std::vector<WorkerBuffer> buffers_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::string> queue_;
  bool stopping_ = false;
  std::thread writer_;
};

}  // namespace spindle::http
