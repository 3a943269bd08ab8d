#pragma once
/// DNS discovery: the names of upstream targets (A and AAAA) and SRV names, looked up with
/// c-ares (which gives TTLs) and looked up again on their TTL by a thread of its own — never on
/// a worker. When an answer changes, the gateway is built again with the new targets (the
/// configuration's own reload path): a target that left DNS drains, one that appeared joins.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "spindle/proxy/config.h"

namespace spindle::proxy {

/// What the names resolved to.
struct DnsAnswers {
  /// Host name -> its addresses (IP text), sorted; empty if the name has none (or failed).
  std::map<std::string, std::vector<std::string>> addresses;
  struct Srv {
    std::string host;
    std::uint16_t port = 0;
    unsigned weight = 1;
    bool operator==(const Srv&) const = default;
  };
  /// SRV name -> its records (the lowest priority's), sorted.
  std::map<std::string, std::vector<Srv>> services;

  bool operator==(const DnsAnswers&) const = default;
};

/// The names a configuration needs resolved: targets' host names that are not IP addresses,
/// and upstreams' SRV names.
void dns_names(const Config& config, std::set<std::string>& hosts, std::set<std::string>& srv);

/// Keeps a set of names resolved.
class Discovery {
 public:
  explicit Discovery(DnsConfig config);
  /// Stops the thread.
  ~Discovery();
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

  /// Looks `hosts` and `srv` (and the hosts SRV records name) up now, on the calling thread
  /// (up to `config.timeout` per lookup). A name that fails keeps the answer it had (a DNS
  /// outage does not empty an upstream), else has none.
  DnsAnswers resolve(const DnsConfig& config, const std::set<std::string>& hosts,
                     const std::set<std::string>& srv);
  /// From now on keeps `hosts` and `srv` looked up on their TTL (in place of the names kept
  /// before), starting from `answers` (resolve()'s).
  void keep(const DnsConfig& config, const std::set<std::string>& hosts,
            const std::set<std::string>& srv, DnsAnswers answers);

  /// The answers, if they changed since keep() or the last changed() that returned some.
  std::optional<DnsAnswers> changed();

 private:
  /// The thread's body: looks names up when they are due.
  void run();

  std::mutex lock_;
  std::condition_variable wake_;
  DnsConfig config_;
  std::set<std::string> hosts_;
  std::set<std::string> srv_;
  DnsAnswers answers_;
  bool changed_ = false;
  bool stopping_ = false;
  /// Bumped by keep(): the thread starts its schedule again.
  std::uint64_t generation_ = 0;
  std::thread thread_;
};

}  // namespace spindle::proxy
