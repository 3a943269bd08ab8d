#pragma once
/// Test helpers: undo gzip and brotli, checking that the data decodes completely.

#include <brotli/decode.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <string>

namespace spindle::testing {

/// Decodes a gzip stream (at most 1 MiB of output).
inline std::string gunzip(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, 15 + 16), Z_OK);
  std::string out(1 << 20, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(inflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  inflateEnd(&z);
  return out;
}

/// Decodes a brotli stream (at most 1 MiB of output).
inline std::string unbrotli(const std::string& data) {
  std::string out(1 << 20, '\0');
  std::size_t size = out.size();
  EXPECT_EQ(BrotliDecoderDecompress(data.size(), reinterpret_cast<const std::uint8_t*>(data.data()),
                                    &size, reinterpret_cast<std::uint8_t*>(out.data())),
            BROTLI_DECODER_RESULT_SUCCESS);
  out.resize(size);
  return out;
}

}  // namespace spindle::testing
