#include "spindle/http/compression.h"

#include <brotli/encode.h>
#include <zlib.h>

namespace spindle::http {

bool compressible_type(std::string_view type) {
  type = trim_ows(type.substr(0, type.find(';')));
  return type.starts_with("text/") || type == "application/json" ||
         type == "application/javascript" || type == "application/xml" || type == "image/svg+xml" ||
         type.ends_with("+json") || type.ends_with("+xml");
}

namespace {

// The coding to use: brotli if accepted, else gzip if accepted, else none.
std::string_view choose_coding(std::string_view accept) {
  if (accepts_encoding(accept, "br")) return "br";
  if (accepts_encoding(accept, "gzip")) return "gzip";
  return "";
}

}  // namespace

std::optional<std::string> gzip_compress(std::string_view data, int level) {
  z_stream z{};
  // 15 window bits + 16: a gzip wrapper instead of zlib's.
  if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return std::nullopt;
  }
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) return std::nullopt;
  return out;
}

std::optional<std::string> brotli_compress(std::string_view data, int quality) {
  std::string out(BrotliEncoderMaxCompressedSize(data.size()), '\0');
  std::size_t size = out.size();
  if (!BrotliEncoderCompress(quality, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_TEXT, data.size(),
                             reinterpret_cast<const std::uint8_t*>(data.data()), &size,
                             reinterpret_cast<std::uint8_t*>(out.data()))) {
    return std::nullopt;
  }
  out.resize(size);
  return out;
}

Middleware compression(CompressionOptions options) {
  return [options](Request& request, const Next& next) {
    Response response = next(request);
    if (response.status != 200 || response.file || response.body.size() < options.min_size ||
        response.headers.contains("content-encoding") ||
        !compressible_type(response.headers.get("content-type").value_or(""))) {
      return response;
    }
    response.headers.add_view("Vary", "Accept-Encoding");
    std::string_view coding = choose_coding(request.header("accept-encoding"));
    if (coding.empty()) return response;
    auto compressed = coding == "br" ? brotli_compress(response.body, options.brotli_quality)
                                     : gzip_compress(response.body, options.gzip_level);
    if (!compressed || compressed->size() >= response.body.size()) return response;
    response.body = std::move(*compressed);
    response.headers.add_view("Content-Encoding", coding);
    // The compressed body is not byte-identical to what a strong tag named (RFC 9110 8.8.3).
    if (auto etag = response.headers.get("etag"); etag && !etag->starts_with("W/")) {
      std::string weak = "W/" + std::string(*etag);
      response.headers.set(std::string_view("ETag"), weak);
    }
    return response;
  };
}

}  // namespace spindle::http
