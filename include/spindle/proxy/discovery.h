#pragma once
/// DNS discovery: the names of upstream targets (A and AAAA) and SRV names, looked up with
/// c-ares (which gives TTLs) on a thread of its own — never on the main thread or a worker —
/// and looked up again on their TTL. All the names due are asked at once, on one c-ares
/// channel. When an answer changes, the gateway is built again with the new targets (the
/// configuration's own reload path): a target that left DNS drains, one that appeared joins.
///
/// Each address family stands alone: a name's addresses are those of its A answer and those of
/// its AAAA answer, whatever the other lookup did. A lookup that fails (SERVFAIL, REFUSED, no
/// answer in time, a reply that is not DNS) keeps the family's last answer until its TTL plus
/// DnsConfig::stale_grace has passed (RFC 8767's serving of stale data), then drops it; an
/// authoritative negative answer (NXDOMAIN, or no record of the type) empties it at once.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "spindle/io/unique_fd.h"
#include "spindle/proxy/config.h"

namespace spindle::proxy {

/// What the names resolved to.
struct DnsAnswers {
  /// Host name -> its addresses (IP text, A and AAAA together), sorted; empty while it has
  /// none (before its first answer too).
  std::map<std::string, std::vector<std::string>> addresses;
  /// One SRV record, as a target.
  struct Srv {
    std::string host;        ///< the target's name (checked: letters, digits, '-', '_', '.')
    std::uint16_t port = 0;  ///< never 0 (such a record is left out)
    unsigned weight = 1;     ///< 1-1000: 0 counts as 1, larger ones are scaled down
    unsigned priority = 0;   ///< lower first: the others are backups (RFC 2782)
    bool operator==(const Srv&) const = default;
  };
  /// SRV name -> its records (every priority; at most 64, the lowest priorities'), sorted by
  /// priority.
  std::map<std::string, std::vector<Srv>> services;

  bool operator==(const DnsAnswers&) const = default;
};

/// The names a configuration needs resolved: targets' host names that are not IP addresses,
/// the Redis's (`redis.address`) if it is a name, and upstreams' SRV names.
void dns_names(const Config& config, std::set<std::string>& hosts, std::set<std::string>& srv);

/// Keeps a set of names resolved, on a thread of its own (started when first given names).
/// keep() and the readers are called from one thread (the main thread); the counts from any.
class Discovery {
 public:
  /// What a lookup can end in.
  enum class Outcome { kAnswered, kNegative, kFailed };
  /// The record types looked up.
  enum class Type { kA, kAaaa, kSrv };

  explicit Discovery(DnsConfig config);
  /// Stops the thread at once (lookups in flight are abandoned).
  ~Discovery();
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

  /// From now on keeps `hosts` and `srv` (and the hosts SRV records name) looked up, in place
  /// of the names kept before: those still kept keep their answers, new ones are looked up at
  /// once on the thread. Never waits.
  void keep(const DnsConfig& config, const std::set<std::string>& hosts,
            const std::set<std::string>& srv);

  /// True when every name kept has had its first lookup end (answered or not).
  bool settled();
  /// Waits until settled(), `until`, or `interrupt` (a descriptor, -1: none) is readable;
  /// returns settled().
  bool wait_settled(std::chrono::steady_clock::time_point until, int interrupt = -1);

  /// The answers now: every name kept (empty while it has no address). A name the hosts file
  /// lists (/etc/hosts, or the file $CARES_HOSTS names) has the file's addresses, read on the
  /// thread too (again every min_ttl), and is not asked of DNS.
  DnsAnswers answers();
  /// The answers, if they changed since the last answers() or changed() that gave some.
  std::optional<DnsAnswers> changed();
  /// Readable when the answers changed or the names settled (changed() empties it).
  int fd() const { return notify_.get(); }

  /// Lookups ended, by type and outcome (for /metrics).
  std::uint64_t lookups(Type type, Outcome outcome) const {
    return counts_[static_cast<int>(type)][static_cast<int>(outcome)].load(
        std::memory_order_relaxed);
  }
  /// Names (or families, or SRV names) served from an answer whose lookups now fail.
  std::size_t stale();

 private:
  struct Freshness;
  struct Host;
  struct Service;
  struct Ticket;
  class Channel;

  /// The thread's body: sends the lookups due, waits for answers, wake-ups and the next due.
  void run();
  /// Reads the hosts file's addresses for the names new, and (every min_ttl) for those it
  /// listed: those it lists are not DNS's to answer. Never waits on the file.
  void check_hosts_file();
  /// The hosts file's text; "" if there is none; nullopt if it cannot be read now (logged once).
  std::optional<std::string> read_hosts_file();
  /// The lookups due now (marked in flight); when the next is due after them (under lock_).
  std::vector<Ticket*> due(std::chrono::steady_clock::time_point now,
                           std::chrono::steady_clock::time_point& next);
  /// Sends one lookup (on a channel that could not be set up, it fails at once).
  void send(Channel& channel, Ticket* ticket);
  /// c-ares's callback for every lookup.
  static void on_reply(void* arg, int status, int timeouts, unsigned char* reply, int length);
  /// Takes a lookup's outcome in (under lock_).
  void merge_host(const Ticket& ticket, int status, const unsigned char* reply, int length);
  void merge_service(const Ticket& ticket, int status, const unsigned char* reply, int length);
  /// The hosts kept: the configuration's and those SRV records name (under lock_).
  void sync_hosts();
  /// Notes new answers and settling, and wakes the reader (under lock_).
  void publish();
  /// Wakes the thread.
  void wake();

  std::mutex lock_;                          ///< guards the members up to stopping_
  DnsConfig config_;                         ///< name servers, TTL bounds, timeout, grace
  std::uint64_t config_serial_ = 0;          ///< bumped when servers or timeout change
  std::set<std::string> config_hosts_;       ///< the configuration's host names
  std::map<std::string, Host> hosts_;        ///< every host name kept, by name
  std::map<std::string, Service> services_;  ///< every SRV name kept, by name
  std::uint64_t serial_ = 0;                 ///< tells a name kept again from the one dropped
  std::chrono::steady_clock::time_point hosts_file_next_{};  ///< when it is read again
  DnsAnswers answers_;                                       ///< the answers as last published
  bool changed_ = false;               ///< answers_ changed since the reader last looked
  bool was_settled_ = false;           ///< settled() when last published
  std::atomic<bool> stopping_{false};  ///< set by the destructor
  UniqueFd wake_;                      ///< eventfd: keep() or stop for the thread
  UniqueFd notify_;                    ///< eventfd: news for the reader
  std::string hosts_file_trouble_;     ///< the thread's: why the hosts file was last unread
  std::vector<Ticket*> resend_;        ///< the thread's: lookups of a replaced channel
  std::array<std::array<std::atomic<std::uint64_t>, 3>, 3> counts_{};  ///< type x outcome
  std::thread thread_;  ///< started by the first keep() with names
};

/// What one DNS reply says, as discovery takes it.
struct DnsReply {
  std::vector<std::string> addresses;       ///< A or AAAA: at most 64, sorted, each once
  std::vector<DnsAnswers::Srv> records;     ///< SRV: the usable ones (see DnsAnswers::Srv)
  std::optional<std::chrono::seconds> ttl;  ///< the addresses' lowest TTL; of a reply without
                                            ///< records, its SOA's negative TTL (RFC 2308)
};

/// Reads `reply`, the bytes a name server sent for a lookup of `type`: nullopt if they do not
/// parse. Any bytes are safe to give it (tests/fuzz/dns_reply_fuzz.cc).
std::optional<DnsReply> read_dns_reply(Discovery::Type type, std::span<const unsigned char> reply);

/// The addresses the hosts file `text` gives each of `names` (case-insensitive), per family
/// (A, AAAA: IP text, sorted, each once); a name no line lists is not in the map. Lines are
/// "IP NAME [ALIAS...]" with `#` comments, as in /etc/hosts; a line whose IP does not parse is
/// skipped. Any text is safe to give it.
std::map<std::string, std::array<std::vector<std::string>, 2>> hosts_file_addresses(
    std::string_view text, const std::vector<std::string>& names);

}  // namespace spindle::proxy
