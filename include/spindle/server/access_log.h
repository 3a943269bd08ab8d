#pragma once
/// AccessLog: one line per request, in the combined format or as JSON lines. Each worker
/// appends to its own buffer (no lock); a buffer is handed to the log's output (a LogOutput:
/// written by a thread of its own, so that no request waits for the disk or a reader) when it
/// reaches 32 KiB or once a second. What waits for the output is bounded: past its bound,
/// lines are dropped and counted (LogOutput).

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/base/log_output.h"

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

  /// Writes to `output` (shared: several logs may write to one file, each line whole), and
  /// starts a flusher fiber on each worker of `runtime`.
  [[nodiscard]] static std::shared_ptr<AccessLog> open(Runtime& runtime,
                                                       std::shared_ptr<LogOutput> output,
                                                       Format format);
  /// Opens `path` for appending ("-" is standard output, LogOutput::standard_output()),
  /// bounded at `max_pending` bytes waiting. Fails with the open error.
  [[nodiscard]] static Result<std::shared_ptr<AccessLog>> open(Runtime& runtime,
                                                               const std::string& path,
                                                               Format format,
                                                               std::size_t max_pending = 4 << 20);
  /// Hands what the workers' buffers hold to the output (which writes it within its bound).
  ~AccessLog();

  /// Formats `record` into the calling worker's buffer. Worker threads only.
  void record(const AccessRecord& record);
  /// The output it writes to.
  const std::shared_ptr<LogOutput>& output() const { return output_; }

  /// Formats one line (for tests and other sinks), with `now` as the time of the request.
  static void format(std::string& out, Format format, const AccessRecord& record,
                     std::chrono::system_clock::time_point now);

 private:
  struct alignas(64) WorkerBuffer {
    std::string text;
    /// Lines in text.
    std::size_t lines = 0;
  };

  AccessLog(std::shared_ptr<LogOutput> output, Format format, std::size_t workers);
  /// Passes a worker's buffer to the output.
  void hand_off(WorkerBuffer& buffer);

  std::shared_ptr<LogOutput> output_;
  Format format_;
  std::vector<WorkerBuffer> buffers_;
};

}  // namespace spindle::http
