#pragma once
// nghttp2's HPACK coder, as the oracle spindle's is compared with (tests and fuzzing only).
#include <nghttp2/nghttp2.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace spindle::testing {

using FieldList = std::vector<std::pair<std::string, std::string>>;

/// nghttp2's decoder for one direction of a connection.
class OracleInflater {
 public:
  OracleInflater() { nghttp2_hd_inflate_new(&inflater_); }
  ~OracleInflater() { nghttp2_hd_inflate_del(inflater_); }
  OracleInflater(const OracleInflater&) = delete;
  OracleInflater& operator=(const OracleInflater&) = delete;

  /// The fields of one block, or nullopt if nghttp2 refuses it. `never_indexed` gets the
  /// names nghttp2 saw marked so.
  std::optional<FieldList> inflate(const std::string& block,
                                   std::vector<std::string>* never_indexed = nullptr) {
    FieldList out;
    const auto* in = reinterpret_cast<const std::uint8_t*>(block.data());
    std::size_t left = block.size();
    for (;;) {
      nghttp2_nv nv;
      int flags = 0;
      auto n = nghttp2_hd_inflate_hd2(inflater_, &nv, &flags, in, left, 1);
      if (n < 0) return std::nullopt;
      in += n;
      left -= static_cast<std::size_t>(n);
      if (flags & NGHTTP2_HD_INFLATE_EMIT) {
        out.emplace_back(std::string(reinterpret_cast<char*>(nv.name), nv.namelen),
                         std::string(reinterpret_cast<char*>(nv.value), nv.valuelen));
        if (never_indexed && (nv.flags & NGHTTP2_NV_FLAG_NO_INDEX)) {
          never_indexed->push_back(out.back().first);
        }
      }
      if (flags & NGHTTP2_HD_INFLATE_FINAL) {
        nghttp2_hd_inflate_end_headers(inflater_);
        return out;
      }
      if (n == 0 && left == 0 && !(flags & NGHTTP2_HD_INFLATE_EMIT)) return std::nullopt;
    }
  }

 private:
  nghttp2_hd_inflater* inflater_ = nullptr;
};

/// nghttp2's encoder for one direction of a connection.
class OracleDeflater {
 public:
  explicit OracleDeflater(std::size_t table_size = 4096) {
    nghttp2_hd_deflate_new(&deflater_, table_size);
  }
  ~OracleDeflater() { nghttp2_hd_deflate_del(deflater_); }
  OracleDeflater(const OracleDeflater&) = delete;
  OracleDeflater& operator=(const OracleDeflater&) = delete;

  void change_table_size(std::size_t size) {
    nghttp2_hd_deflate_change_table_size(deflater_, size);
  }

  std::string deflate(const FieldList& fields, bool never_index = false) {
    std::vector<nghttp2_nv> nva;
    for (const auto& [name, value] : fields) {
      nva.push_back({reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
                     reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(),
                     value.size(),
                     static_cast<std::uint8_t>(never_index ? NGHTTP2_NV_FLAG_NO_INDEX
                                                           : NGHTTP2_NV_FLAG_NONE)});
    }
    std::string out(nghttp2_hd_deflate_bound(deflater_, nva.data(), nva.size()), '\0');
    auto n = nghttp2_hd_deflate_hd(deflater_, reinterpret_cast<std::uint8_t*>(out.data()),
                                   out.size(), nva.data(), nva.size());
    out.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
    return out;
  }

 private:
  nghttp2_hd_deflater* deflater_ = nullptr;
};

}  // namespace spindle::testing
