// libFuzzer driver for what DNS discovery takes from a name server's reply (read_dns_reply:
// c-ares's parsers, then spindle's own reading of SOA records and its limits). The first byte
// picks the record type asked (A, AAAA, SRV); the rest is the reply. Beyond "no crash, no
// sanitizer report": whatever the bytes, at most 64 addresses, each an IP address, sorted and
// once; at most 64 SRV records, each with a port, a weight of 1-1000 and a host name of
// letters, digits, '-', '_' and '.', sorted by priority; a TTL below 2^31.
#include <arpa/inet.h>

#include <algorithm>
#include <cstdint>
#include <span>

#include "fuzz_checks.h"
#include "spindle/proxy/discovery.h"

using spindle::proxy::Discovery;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  auto type = static_cast<Discovery::Type>(data[0] % 3);
  auto got = spindle::proxy::read_dns_reply(type, std::span(data + 1, size - 1));
  if (!got) return 0;
  check(got->addresses.size() <= 64 && got->records.size() <= 64);
  check(std::ranges::is_sorted(got->addresses));
  check(std::ranges::adjacent_find(got->addresses) == got->addresses.end());
  unsigned char raw[16];
  for (const auto& a : got->addresses) {
    check(::inet_pton(type == Discovery::Type::kA ? AF_INET : AF_INET6, a.c_str(), raw) == 1);
  }
  for (const auto& r : got->records) {
    check(r.port != 0 && r.weight >= 1 && r.weight <= 1000 && !r.host.empty());
    check(std::ranges::all_of(r.host, [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    }));
  }
  check(std::ranges::is_sorted(got->records, {}, &spindle::proxy::DnsAnswers::Srv::priority));
  check(!got->ttl || got->ttl->count() < (std::int64_t{1} << 31));
  return 0;
}
