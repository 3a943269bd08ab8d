#pragma once
/// Response compression: a middleware that gzip- (zlib) or brotli-compresses text responses
/// above a size threshold for clients that accept it (Accept-Encoding), preferring brotli.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "spindle/http/router.h"

namespace spindle::http {

/// When and how hard to compress.
struct CompressionOptions {
  /// Smallest body worth compressing.
  std::size_t min_size = 1024;
  /// zlib level (1-9).
  int gzip_level = 6;
  /// brotli quality (0-11); 5 is a good speed/ratio balance for dynamic content.
  int brotli_quality = 5;
};

/// A middleware that compresses eligible responses: status 200, a string body of at least
/// min_size bytes, a text-like Content-Type (text/*, JSON, JavaScript, XML, SVG), no
/// Content-Encoding yet. Adds Content-Encoding and Vary: Accept-Encoding.
Middleware compression(CompressionOptions options = {});

/// True for the media types worth compressing: text/*, JSON, JavaScript, XML, SVG.
bool compressible_type(std::string_view content_type);

/// gzip-compresses `data` (RFC 1952). nullopt if zlib fails.
std::optional<std::string> gzip_compress(std::string_view data, int level = 6);
/// brotli-compresses `data`. nullopt if the encoder fails.
std::optional<std::string> brotli_compress(std::string_view data, int quality = 5);

}  // namespace spindle::http
