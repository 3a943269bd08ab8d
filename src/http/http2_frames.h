#pragma once
// Moving nghttp2's output to the socket, for the server's and the client's HTTP/2 connections
// alike (private to src/http).

#include <nghttp2/nghttp2.h>

#include <string>

#include "spindle/http/header_map.h"
#include "spindle/io/deadline.h"
#include "spindle/net/stream.h"
#include "spindle/sync/event.h"

namespace spindle::http::detail {

/// nghttp2 is C: nothing may be thrown through it. Guarded<&callback>::call runs a callback
/// and turns any exception it lets out (an allocation failure, say) into
/// NGHTTP2_ERR_CALLBACK_FAILURE, which ends the session instead of the process.
template <auto Fn>
struct Guarded;
template <typename... Args, int (*Fn)(Args...)>
struct Guarded<Fn> {
  static int call(Args... args) noexcept {
    try {
      return Fn(args...);
    } catch (...) {
      return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
  }
};

/// nghttp2's allocator for a session: the thread's block cache (spindle/fiber/block_cache.h)
/// instead of malloc. A stream costs nghttp2 about five allocations, which come and go in
/// bursts as large as the streams in flight.
nghttp2_mem* block_memory();

/// Inside a data source's read callback at the body's end: submits `trailers` (names in lower
/// case) to follow the last DATA frame, and marks that frame as not ending the stream (the
/// trailers' HEADERS do). Nothing if there are none.
void submit_trailers(nghttp2_session* session, std::int32_t id, const HeaderMap& trailers,
                     std::uint32_t* flags);

/// What send_frames did.
enum class FramesSent {
  kNothing,  ///< nghttp2 had nothing to give now
  kSent,     ///< frames went out (there may be more: call again)
  kFailed,   ///< the session or the write failed: the connection is over
};

/// Takes what `session` has to send (nghttp2_session_mem_send, gathered into `out` up to 64
/// KiB so that many small frames cost one write) and writes it to `stream` by `deadline`.
FramesSent send_frames(nghttp2_session* session, Stream& stream, std::string& out,
                       Deadline deadline);

/// Parks the writer until someone submits, resumes or receives something (they set `wake`).
/// Call right after send_frames said kNothing: nghttp2's want_write may still say yes for DATA
/// that flow control holds back, so only a wake-up can tell when to try again. Nobody ran
/// between that mem_send and the reset here, so no wake-up can be missed.
inline void wait_for_frames(Event& wake) {
  wake.reset();
  (void)wake.wait();
}

}  // namespace spindle::http::detail
