#pragma once
/// ChunkedDecoder: decodes a chunked request body (RFC 9112 7.1) incrementally, zero-copy: it
/// hands out views of the payload inside the bytes it is given. Trailer fields are checked for
/// well-formedness and dropped. No I/O.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace spindle::http {

/// Decodes one chunked body.
class ChunkedDecoder {
 public:
  /// What one decode step produced.
  struct Step {
    enum class Kind {
      kData,      ///< `data` is payload (a view into the input)
      kNeedMore,  ///< all of `consumed` was framing; the rest needs more bytes: call again
      kDone,      ///< the body and its trailers are complete
      kError,     ///< malformed or over a limit: answer `status`, close the connection
    };
    Kind kind = Kind::kNeedMore;
    /// Bytes of the input this step used (drop them before the next call).
    std::size_t consumed = 0;
    /// kData: the payload bytes.
    std::string_view data;
    /// kError: 400 (malformed) or 413 (body larger than allowed).
    int status = 0;
    /// kError: why.
    std::string_view reason;
  };

  /// A decoder that rejects bodies over `max_body` bytes of payload (413).
  explicit ChunkedDecoder(std::uint64_t max_body = UINT64_MAX) : max_body_(max_body) {}

  /// Decodes from the start of `input` (the bytes not consumed by earlier steps, plus new ones).
  Step next(std::string_view input);
  /// Payload bytes decoded so far.
  std::uint64_t body_size() const { return total_; }
  /// True once kDone was returned.
  bool done() const { return state_ == State::kDone; }

 private:
  enum class State { kSize, kData, kDataEnd, kTrailer, kDone };
  /// Longest chunk-size line (with extensions) or trailer line accepted.
  static constexpr std::size_t kMaxLine = 4096;
  /// Most trailer bytes accepted.
  static constexpr std::size_t kMaxTrailers = 16 * 1024;

  /// One framing or payload piece; framing progress is kNeedMore with consumed > 0.
  Step next_piece(std::string_view input);
  Step size_line(std::string_view input);
  Step trailer_line(std::string_view input);

  /// Where in the chunked framing we are.
  State state_ = State::kSize;
  /// Payload bytes left in the current chunk.
  std::uint64_t remaining_ = 0;
  /// Payload bytes so far.
  std::uint64_t total_ = 0;
  /// Limit on total_.
  std::uint64_t max_body_;
  /// Trailer bytes so far.
  std::size_t trailer_bytes_ = 0;
};

}  // namespace spindle::http
