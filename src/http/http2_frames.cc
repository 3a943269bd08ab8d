#include "http2_frames.h"

namespace spindle::http::detail {

FramesSent send_frames(nghttp2_session* session, Stream& stream, std::string& out,
                       Deadline deadline) {
  constexpr std::size_t kGather = 64 * 1024;
  bool failed = false;
  for (;;) {
    const std::uint8_t* data = nullptr;
    ssize_t n = nghttp2_session_mem_send(session, &data);
    if (n < 0) {
      failed = true;
      break;
    }
    if (n == 0) break;
    out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
    if (out.size() >= kGather) break;
  }
  if (out.empty()) return failed ? FramesSent::kFailed : FramesSent::kNothing;
  bool written = stream.write_all(out, deadline).has_value();
  out.clear();
  return written && !failed ? FramesSent::kSent : FramesSent::kFailed;
}

}  // namespace spindle::http::detail
