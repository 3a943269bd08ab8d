#pragma once
// DNS replies built a field at a time, for the tests of what discovery reads from them.

#include <cstdint>
#include <string>
#include <vector>

namespace spindle::proxy::testing {

constexpr std::uint16_t kA = 1, kSoa = 6, kAaaa = 28, kSrv = 33;

// A DNS reply built a field at a time.
/// A DNS reply (to a question for api.test, or `name`) built a field at a time.
class Reply {
 public:
  Reply(std::uint16_t qtype, std::uint16_t rcode = 0,
        std::vector<std::string> name = {"api", "test"}, std::uint16_t id = 7)
      : qtype_(qtype), rcode_(rcode), name_(std::move(name)), id_(id) {}

  Reply& a(const std::string& dotted, std::uint32_t ttl = 60) {
    std::vector<std::uint8_t> rdata;
    for (std::size_t at = 0; at < dotted.size();) {
      std::size_t dot = dotted.find('.', at);
      rdata.push_back(static_cast<std::uint8_t>(std::stoi(dotted.substr(at, dot - at))));
      at = dot == std::string::npos ? dotted.size() : dot + 1;
    }
    return answer(kA, ttl, rdata);
  }
  Reply& srv(std::uint16_t priority, std::uint16_t weight, std::uint16_t port,
             const std::vector<std::string>& labels) {
    std::vector<std::uint8_t> rdata;
    for (std::uint16_t v : {priority, weight, port}) put16(rdata, v);
    put_name(rdata, labels);
    return answer(kSrv, 60, rdata);
  }
  Reply& soa(std::uint32_t ttl, std::uint32_t minimum) {
    std::vector<std::uint8_t> rdata;
    put_name(rdata, {"ns", "test"});
    put_name(rdata, {"hostmaster", "test"});
    for (std::uint32_t v : {1u, 3600u, 600u, 86400u, minimum}) put32(rdata, v);
    authority_.push_back(record(kSoa, ttl, rdata));
    return *this;
  }

  std::vector<std::uint8_t> bytes() const {
    std::vector<std::uint8_t> out;
    for (std::uint16_t v : {id_, static_cast<std::uint16_t>(0x8400 | rcode_), std::uint16_t{1},
                            static_cast<std::uint16_t>(answers_.size()),
                            static_cast<std::uint16_t>(authority_.size()), std::uint16_t{0}}) {
      put16(out, v);
    }
    put_name(out, name_);
    put16(out, qtype_);
    put16(out, 1);
    for (const auto& r : answers_) out.insert(out.end(), r.begin(), r.end());
    for (const auto& r : authority_) out.insert(out.end(), r.begin(), r.end());
    return out;
  }

 private:
  static void put16(std::vector<std::uint8_t>& out, std::uint16_t v) {
    out.push_back(static_cast<std::uint8_t>(v >> 8));
    out.push_back(static_cast<std::uint8_t>(v));
  }
  static void put32(std::vector<std::uint8_t>& out, std::uint32_t v) {
    put16(out, static_cast<std::uint16_t>(v >> 16));
    put16(out, static_cast<std::uint16_t>(v));
  }
  static void put_name(std::vector<std::uint8_t>& out, const std::vector<std::string>& labels) {
    for (const std::string& l : labels) {
      out.push_back(static_cast<std::uint8_t>(l.size()));
      out.insert(out.end(), l.begin(), l.end());
    }
    out.push_back(0);
  }
  std::vector<std::uint8_t> record(std::uint16_t type, std::uint32_t ttl,
                                   const std::vector<std::uint8_t>& rdata) const {
    std::vector<std::uint8_t> r{0xc0, 0x0c};  // the question's name
    put16(r, type);
    put16(r, 1);
    put32(r, ttl);
    put16(r, static_cast<std::uint16_t>(rdata.size()));
    r.insert(r.end(), rdata.begin(), rdata.end());
    return r;
  }
  Reply& answer(std::uint16_t type, std::uint32_t ttl, const std::vector<std::uint8_t>& rdata) {
    answers_.push_back(record(type, ttl, rdata));
    return *this;
  }

  std::uint16_t qtype_;
  std::uint16_t rcode_;
  std::vector<std::string> name_;
  std::vector<std::vector<std::uint8_t>> answers_;
  std::vector<std::vector<std::uint8_t>> authority_;
  std::uint16_t id_;
};

}  // namespace spindle::proxy::testing
