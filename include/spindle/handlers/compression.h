#pragma once
/// Response compression: a middleware that gzip- (zlib) or brotli-compresses text responses
/// above a size threshold for clients that accept it (Accept-Encoding), preferring brotli.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "spindle/server/router.h"

namespace spindle::http {

/// Bodies compressed in one go lie between these sizes (the middleware's and static files'
/// defaults alike): below, it is not worth it; above, it would hold a worker too long.
inline constexpr std::size_t kCompressMin = 1024;
inline constexpr std::size_t kCompressMax = 1 << 20;

/// When and how hard to compress.
struct CompressionOptions {
  /// Smallest body worth compressing.
  std::size_t min_size = kCompressMin;
  /// Largest body compressed in one go (streamed bodies are compressed as they stream, at any
  /// size).
  std::size_t max_size = kCompressMax;
  /// zlib level (1-9).
  int gzip_level = 6;
  /// brotli quality (0-11); 5 is a good speed/ratio balance for dynamic content.
  int brotli_quality = 5;
};

/// A middleware that compresses eligible responses: status 200 to a request other than HEAD,
/// a text-like Content-Type (text/*, JSON, JavaScript, XML, SVG), no Content-Encoding yet, no
/// Cache-Control no-transform (RFC 9110 §7.7), and either a string body of
/// min_size..max_size bytes (compressed at once) or a streamed body (compressed piece by
/// piece as the producer writes, each piece flushed so it reaches the client then). Adds
/// Content-Encoding and Vary: Accept-Encoding.
Middleware compression(CompressionOptions options = {});

/// Compresses a body that comes in pieces.
class StreamCompressor {
 public:
  /// A compressor for `coding` ("br" or "gzip") at the options' levels; nullptr if the coding
  /// is unknown or the library cannot start one.
  static std::unique_ptr<StreamCompressor> create(std::string_view coding,
                                                  const CompressionOptions& options);
  virtual ~StreamCompressor() = default;
  /// Compresses `data` and flushes it (a decoder can then decode all of it), or with `finish`
  /// ends the stream after it; appends the output to `out`. False if the library failed.
  virtual bool compress(std::string_view data, bool finish, std::string& out) = 0;
};

/// True for the media types worth compressing: text/*, JSON, JavaScript, XML, SVG.
bool compressible_type(std::string_view content_type);

/// gzip-compresses `data` (RFC 1952). nullopt if zlib fails.
std::optional<std::string> gzip_compress(std::string_view data, int level = 6);
/// brotli-compresses `data`. nullopt if the encoder fails.
std::optional<std::string> brotli_compress(std::string_view data, int quality = 5);

}  // namespace spindle::http
