#pragma once
/// How a connection's streams share its output: each stream with body bytes to send frames a
/// slice in its turn, until a turn's worth is framed (then the driver writes it) or no stream
/// can add more (their windows are closed). The server's driver and the upstream client both
/// frame their bodies this way. Pure: no I/O.

#include <cstddef>
#include <vector>

#include "spindle/h2/session.h"

namespace spindle::h2 {

/// What one stream frames in its turn, and what a turn gathers before it is written.
inline constexpr std::size_t kStreamSlice = 16 * 1024;
inline constexpr std::size_t kTurnBytes = 64 * 1024;

/// Lets the streams of `senders` take turns, starting at `next` (kept between calls, so that
/// no stream is always first). `frame(stream, slice)` frames up to `slice` bytes of its body
/// into `session`'s output and returns true once the stream has sent all of it: the stream
/// then leaves `senders`, and `done(stream)` is called.
template <typename Stream, typename Frame, typename Done>
void take_turns(const Session& session, std::vector<Stream*>& senders, std::size_t& next,
                Frame&& frame, Done&& done) {
  bool progress = true;
  while (progress && !senders.empty() && session.output_size() < kTurnBytes) {
    progress = false;
    for (std::size_t k = 0; k < senders.size() && session.output_size() < kTurnBytes;) {
      if (next >= senders.size()) next = 0;
      Stream& s = *senders[next];
      const std::size_t before = session.output_size();
      if (frame(s, kStreamSlice)) {
        senders.erase(senders.begin() + static_cast<std::ptrdiff_t>(next));
        progress = true;
        done(s);
        continue;
      }
      if (session.output_size() != before) progress = true;
      ++next;
      ++k;
    }
  }
}

}  // namespace spindle::h2
