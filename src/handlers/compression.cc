#include "spindle/handlers/compression.h"

#include <brotli/encode.h>
#include <zlib.h>

#include <stdexcept>

namespace spindle::http {

bool compressible_type(std::string_view type) {
  type = trim_ows(type.substr(0, type.find(';')));
  return type.starts_with("text/") || type == "application/json" ||
         type == "application/javascript" || type == "application/xml" || type == "image/svg+xml" ||
         type.ends_with("+json") || type.ends_with("+xml");
}

namespace {

// Whether the middleware may change `response`, the answer to `request`, at all: not an
// answer its sender forbade transforming (Cache-Control: no-transform, RFC 9110 §7.7, in any
// of its fields, any case, among other directives), not one already encoded, not a 206 (its
// Content-Range counts the bytes as sent), 204 or 304 (status 200 only), not a file sent as it
// is. An answer to HEAD whose body a handler made is treated as GET's (its fields say what GET's
// would, RFC 9110 §9.3.2; the connection leaves the body out); one streamed (a proxied HEAD: no
// body to tell what GET's would be) is left as its sender made it.
bool may_transform(const Request& request, const Response& response) {
  return response.status == 200 && !response.file &&
         !(request.method() == "HEAD" && response.stream) &&
         !response.headers.contains(token::kContentEncoding) &&
         !response.headers.has_token(token::kCacheControl, "no-transform");
}

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

namespace {

class GzipStream final : public StreamCompressor {
 public:
  explicit GzipStream(int level) {
    ok_ = deflateInit2(&z_, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK;
  }
  ~GzipStream() override {
    if (ok_) deflateEnd(&z_);
  }
  bool ok() const { return ok_; }

  bool compress(std::string_view data, bool finish, std::string& out) override {
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z_.avail_in = static_cast<uInt>(data.size());
    int flush = finish ? Z_FINISH : Z_SYNC_FLUSH;
    for (;;) {
      std::size_t at = out.size();
      std::size_t room = deflateBound(&z_, z_.avail_in) + 64;
      out.resize(at + room);
      z_.next_out = reinterpret_cast<Bytef*>(out.data() + at);
      z_.avail_out = static_cast<uInt>(room);
      int rc = deflate(&z_, flush);
      out.resize(at + room - z_.avail_out);
      if (rc == Z_STREAM_ERROR) return false;
      if (finish ? rc == Z_STREAM_END : (z_.avail_in == 0 && z_.avail_out > 0)) return true;
    }
  }

 private:
  z_stream z_{};
  bool ok_ = false;
};

class BrotliStream final : public StreamCompressor {
 public:
  explicit BrotliStream(int quality)
      : state_(BrotliEncoderCreateInstance(nullptr, nullptr, nullptr)) {
    if (state_)
      BrotliEncoderSetParameter(state_, BROTLI_PARAM_QUALITY, static_cast<std::uint32_t>(quality));
  }
  ~BrotliStream() override {
    if (state_) BrotliEncoderDestroyInstance(state_);
  }
  bool ok() const { return state_ != nullptr; }

  bool compress(std::string_view data, bool finish, std::string& out) override {
    auto op = finish ? BROTLI_OPERATION_FINISH : BROTLI_OPERATION_FLUSH;
    std::size_t in_left = data.size();
    const auto* in = reinterpret_cast<const std::uint8_t*>(data.data());
    for (;;) {
      std::size_t out_left = 0;
      std::uint8_t* next_out = nullptr;
      if (!BrotliEncoderCompressStream(state_, op, &in_left, &in, &out_left, &next_out, nullptr)) {
        return false;
      }
      // Take what the encoder produced from its own buffer.
      std::size_t size = 0;
      const std::uint8_t* produced = BrotliEncoderTakeOutput(state_, &size);
      out.append(reinterpret_cast<const char*>(produced), size);
      bool done = finish ? BrotliEncoderIsFinished(state_) != 0
                         : in_left == 0 && BrotliEncoderHasMoreOutput(state_) == 0;
      if (done) return true;
    }
  }

 private:
  BrotliEncoderState* state_;
};

// Compresses what a producer writes, then passes it on.
class CompressingWriter final : public BodyWriter {
 public:
  CompressingWriter(BodyWriter& inner, StreamCompressor& compressor)
      : inner_(inner), compressor_(compressor) {}

  bool write(std::string_view data) override {
    if (failed_) return false;
    if (data.empty()) return true;
    return pass(data, false);
  }
  void set_trailers(const HeaderMap& trailers) override { inner_.set_trailers(trailers); }
  /// Ends the compressed stream.
  bool finish() { return !failed_ && pass({}, true); }

 private:
  bool pass(std::string_view data, bool finish) {
    out_.clear();
    failed_ = !compressor_.compress(data, finish, out_) || !inner_.write(out_);
    return !failed_;
  }

  BodyWriter& inner_;
  StreamCompressor& compressor_;
  std::string out_;
  bool failed_ = false;
};

// The Content-Encoding and tag changes of a compressed response.
void mark_compressed(Response& response, std::string_view coding) {
  response.headers.add_view("Content-Encoding", token::kContentEncoding, coding);
  // The compressed body is not byte-identical to what a strong tag named (RFC 9110 8.8.3).
  if (auto etag = response.headers.get(token::kEtag); etag && !etag->starts_with("W/")) {
    std::string weak = "W/" + std::string(*etag);
    response.headers.set(std::string_view("ETag"), weak);
  }
}

}  // namespace

std::unique_ptr<StreamCompressor> StreamCompressor::create(std::string_view coding,
                                                           const CompressionOptions& options) {
  if (coding == "gzip") {
    auto z = std::make_unique<GzipStream>(options.gzip_level);
    if (z->ok()) return z;
  } else if (coding == "br") {
    auto b = std::make_unique<BrotliStream>(options.brotli_quality);
    if (b->ok()) return b;
  }
  return nullptr;
}

Middleware compression(CompressionOptions options) {
  return [options](Request& request, const Next& next) {
    Response response = next(request);
    bool streamed = static_cast<bool>(response.stream);
    if (!may_transform(request, response) ||
        !compressible_type(response.headers.get(token::kContentType).value_or(""))) {
      return response;
    }
    if (!streamed &&
        (response.body.size() < options.min_size || response.body.size() > options.max_size)) {
      return response;
    }
    // A streamed body whose length is known to be small is not worth it either.
    if (streamed && response.stream_length && *response.stream_length < options.min_size) {
      return response;
    }
    response.headers.add_view("Vary", token::kVary, "Accept-Encoding");
    std::string_view coding = choose_coding(request.header(token::kAcceptEncoding));
    if (coding.empty()) return response;
    if (streamed) {
      // Each piece is compressed as the producer writes it, on its fiber.
      response.stream_length.reset();  // the compressed length is known only at the end
      response.stream = [producer = std::move(response.stream), first = std::move(response.body),
                         coding, options](BodyWriter& body) {
        auto compressor = StreamCompressor::create(coding, options);
        if (!compressor) throw std::runtime_error("cannot start a compressor");
        CompressingWriter writer(body, *compressor);
        if (!first.empty() && !writer.write(first)) return;
        producer(writer);
        (void)writer.finish();
      };
      mark_compressed(response, coding);
      return response;
    }
    auto compressed = coding == "br" ? brotli_compress(response.body, options.brotli_quality)
                                     : gzip_compress(response.body, options.gzip_level);
    if (!compressed || compressed->size() >= response.body.size()) return response;
    response.body = std::move(*compressed);
    mark_compressed(response, coding);
    return response;
  };
}

}  // namespace spindle::http
