#include "http2_frames.h"

#include <vector>

namespace spindle::http::detail {

void submit_trailers(nghttp2_session* session, std::int32_t id, const HeaderMap& trailers,
                     std::uint32_t* flags) {
  if (trailers.empty()) return;
  std::vector<nghttp2_nv> nv;
  nv.reserve(trailers.size());
  for (const Field& f : trailers) {
    nv.push_back({reinterpret_cast<std::uint8_t*>(const_cast<char*>(f.name.data())),
                  reinterpret_cast<std::uint8_t*>(const_cast<char*>(f.value.data())), f.name.size(),
                  f.value.size(), NGHTTP2_NV_FLAG_NONE});
  }
  if (nghttp2_submit_trailer(session, id, nv.data(), nv.size()) == 0) {
    *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
  }
}

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
