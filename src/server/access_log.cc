#include "spindle/server/access_log.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "spindle/base/log.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"

namespace spindle::http {
namespace {

constexpr std::size_t kHandOffBytes = 32 * 1024;
constexpr auto kHandOffInterval = std::chrono::seconds(1);

// Quoted-string content: backslash-escape quotes, backslashes and control characters, so a
// client cannot forge log lines.
void append_escaped(std::string& out, std::string_view text, bool json) {
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      if (json) {
        fmt::format_to(std::back_inserter(out), "\\u{:04x}", u);
      } else {
        fmt::format_to(std::back_inserter(out), "\\x{:02x}", u);
      }
    } else {
      out += c;
    }
  }
}

}  // namespace

AccessLog::AccessLog(std::shared_ptr<LogOutput> output, Format format, std::size_t workers)
    : output_(std::move(output)), format_(format), buffers_(workers) {}

std::shared_ptr<AccessLog> AccessLog::open(Runtime& runtime, std::shared_ptr<LogOutput> output,
                                           Format format) {
  std::shared_ptr<AccessLog> log(new AccessLog(std::move(output), format, runtime.size()));
  // A quiet worker still gets its last lines out within a second or two.
  for (std::size_t i = 0; i < runtime.size(); ++i) {
    spawn_on(runtime.worker(i), [weak = std::weak_ptr<AccessLog>(log), i] {
      while (!this_fiber::sleep_for(kHandOffInterval)) {
        auto log = weak.lock();
        if (!log) return;
        auto& buffer = log->buffers_[i];
        if (!buffer.text.empty()) log->hand_off(buffer);
      }
    }).detach();
  }
  return log;
}

Result<std::shared_ptr<AccessLog>> AccessLog::open(Runtime& runtime, const std::string& path,
                                                   Format format, std::size_t max_pending) {
  std::shared_ptr<LogOutput> output;
  if (path == "-") {
    // The process's one writer to standard output, never destroyed: held without owning it.
    output = std::shared_ptr<LogOutput>(std::shared_ptr<void>(), &LogOutput::standard_output());
  } else {
    auto opened = LogOutput::open(path, max_pending);
    if (!opened) return fail(opened.error());
    output = std::move(*opened);
  }
  return open(runtime, std::move(output), format);
}

AccessLog::~AccessLog() {
  for (auto& b : buffers_) {
    if (!b.text.empty()) hand_off(b);
  }
}

void AccessLog::record(const AccessRecord& record) {
  Worker* worker = Worker::current();
  if (!worker) return;
  WorkerBuffer& buffer = buffers_[worker->index()];
  format(buffer.text, format_, record, std::chrono::system_clock::now());
  ++buffer.lines;
  if (buffer.text.size() >= kHandOffBytes) hand_off(buffer);
}

void AccessLog::hand_off(WorkerBuffer& buffer) {
  // (The output copies what it keeps; past its bound it drops the batch and counts its lines.)
  (void)output_->write(buffer.text, buffer.lines);
  buffer.text.clear();
  buffer.lines = 0;
  if (buffer.text.capacity() > 4 * kHandOffBytes) buffer.text.shrink_to_fit();
}

void AccessLog::format(std::string& out, Format format, const AccessRecord& r,
                       std::chrono::system_clock::time_point now) {
  auto seconds = std::chrono::floor<std::chrono::seconds>(now);
  auto it = std::back_inserter(out);
  if (format == Format::kCombined) {
    fmt::format_to(it, "{} - - [{:%d/%b/%Y:%H:%M:%S} +0000] \"", r.remote, seconds);
    append_escaped(out, r.method, false);
    out += ' ';
    append_escaped(out, r.target, false);
    fmt::format_to(it, " HTTP/{}.{}\" {} {} \"", r.major_version, r.minor_version, r.status,
                   r.bytes);
    append_escaped(out, r.referer.empty() ? "-" : r.referer, false);
    out += "\" \"";
    append_escaped(out, r.user_agent.empty() ? "-" : r.user_agent, false);
    out += '"';
    for (const auto& [name, value] : r.attributes) {
      if (name.starts_with('_')) continue;  // private to the middlewares
      out += ' ';
      append_escaped(out, name, false);
      out += "=\"";
      append_escaped(out, value, false);
      out += '"';
    }
    out += '\n';
    return;
  }
  fmt::format_to(it, "{{\"time\":\"{:%Y-%m-%dT%H:%M:%S}Z\",\"remote\":\"", seconds);
  append_escaped(out, r.remote, true);
  out += "\",\"method\":\"";
  append_escaped(out, r.method, true);
  out += "\",\"target\":\"";
  append_escaped(out, r.target, true);
  out += "\",\"host\":\"";
  append_escaped(out, r.authority, true);
  fmt::format_to(it, "\",\"version\":\"HTTP/{}.{}\",\"status\":{},\"bytes\":{},\"referer\":\"",
                 r.major_version, r.minor_version, r.status, r.bytes);
  append_escaped(out, r.referer, true);
  out += "\",\"user_agent\":\"";
  append_escaped(out, r.user_agent, true);
  out += '"';
  for (const auto& [name, value] : r.attributes) {
    if (name.starts_with('_')) continue;
    out += ",\"";
    append_escaped(out, name, true);
    out += "\":\"";
    append_escaped(out, value, true);
    out += '"';
  }
  fmt::format_to(it, ",\"duration_us\":{}}}\n", r.duration.count());
}

}  // namespace spindle::http
