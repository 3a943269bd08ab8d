// DNS discovery with c-ares, on a thread of its own: one channel, every lookup due sent on it at
// once, and a poll on its sockets and on an eventfd that keep() and the destructor write.

#include "spindle/proxy/discovery.h"

#include <ares.h>
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <span>
#include <utility>

#include "spindle/base/log.h"
#include "spindle/net/address.h"

namespace spindle::proxy {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Records used of one answer: more than an upstream needs, few enough that a hostile server
// cannot make discovery look up thousands of names.
constexpr int kMaxRecords = 64;
// SRV weights are scaled into the range configured targets have.
constexpr unsigned kMaxWeight = 1000;

const char* type_name(Discovery::Type type) {
  switch (type) {
    case Discovery::Type::kA:
      return "A";
    case Discovery::Type::kAaaa:
      return "AAAA";
    case Discovery::Type::kSrv:
      return "SRV";
  }
  return "?";
}

// What a c-ares status says of a lookup.
Discovery::Outcome outcome_of(int status) {
  if (status == ARES_SUCCESS) return Discovery::Outcome::kAnswered;
  // NXDOMAIN, or the name has no record of the type: an answer, that there is none.
  if (status == ARES_ENOTFOUND || status == ARES_ENODATA) return Discovery::Outcome::kNegative;
  return Discovery::Outcome::kFailed;
}

// A host name as SRV records may give one: what a Host field and SNI can carry, nothing else.
bool plausible_host(const std::string& name) {
  return !name.empty() && name.size() <= 253 && name.front() != '.' &&
         std::ranges::all_of(name, [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.';
         });
}

milliseconds clamp_ttl(const DnsConfig& config, std::chrono::seconds ttl) {
  return std::clamp(milliseconds(ttl), config.min_ttl, config.max_ttl);
}

// The addresses of an A or AAAA reply and their lowest TTL: c-ares's status (ARES_ENODATA: the
// reply has none).
int parse_addresses(Discovery::Type type, const unsigned char* reply, int length,
                    std::vector<std::string>& addresses, std::chrono::seconds& ttl) {
  int count = kMaxRecords;
  char text[INET6_ADDRSTRLEN];
  std::int64_t lowest = -1;
  auto note = [&](int family, const void* address, int record_ttl) {
    ::inet_ntop(family, address, text, sizeof text);
    addresses.emplace_back(text);
    if (lowest < 0 || record_ttl < lowest) lowest = record_ttl;
  };
  int status;
  if (type == Discovery::Type::kA) {
    ares_addrttl found[kMaxRecords];
    status = ares_parse_a_reply(reply, length, nullptr, found, &count);
    for (int i = 0; status == ARES_SUCCESS && i < count; ++i) {
      note(AF_INET, &found[i].ipaddr, found[i].ttl);
    }
  } else {
    ares_addr6ttl found[kMaxRecords];
    status = ares_parse_aaaa_reply(reply, length, nullptr, found, &count);
    for (int i = 0; status == ARES_SUCCESS && i < count; ++i) {
      note(AF_INET6, &found[i].ip6addr, found[i].ttl);
    }
  }
  std::ranges::sort(addresses);
  addresses.erase(std::ranges::unique(addresses).begin(), addresses.end());
  ttl = std::chrono::seconds(std::max<std::int64_t>(lowest, 0));
  return status;
}

// The usable records of an SRV reply, of every priority: a target of "." (no service there),
// port 0 or an implausible name left out; one per host and port (its lowest priority); the
// lowest priorities' kMaxRecords; weights within 1-kMaxWeight, in proportion. c-ares's status.
int parse_services(const unsigned char* reply, int length, std::vector<DnsAnswers::Srv>& records) {
  ares_srv_reply* list = nullptr;
  if (int status = ares_parse_srv_reply(reply, length, &list); status != ARES_SUCCESS) {
    return status;
  }
  unsigned heaviest = 0;
  for (auto* r = list; r != nullptr; r = r->next) {
    std::string host = r->host;
    if (r->port == 0 || !plausible_host(host)) continue;
    records.push_back({host, r->port, r->weight, r->priority});
    heaviest = std::max<unsigned>(heaviest, r->weight);
  }
  ares_free_data(list);
  for (auto& r : records) {
    if (heaviest > kMaxWeight) r.weight = r.weight * kMaxWeight / heaviest;
    r.weight = std::max(1u, r.weight);  // 0 means "rarely": the smallest share there is
  }
  std::ranges::sort(records, [](const auto& x, const auto& y) {
    return std::tie(x.priority, x.host, x.port, x.weight) <
           std::tie(y.priority, y.host, y.port, y.weight);
  });
  std::set<std::pair<std::string, std::uint16_t>> seen;
  std::erase_if(records, [&](const auto& r) { return !seen.insert({r.host, r.port}).second; });
  if (records.size() > kMaxRecords) records.resize(kMaxRecords);
  return ARES_SUCCESS;
}

// The negative-caching TTL of an NXDOMAIN or empty reply, if its authority section has an SOA
// record (RFC 2308: the lower of that record's TTL and its MINIMUM field).
std::optional<std::chrono::seconds> negative_ttl(const unsigned char* reply, int length) {
  if (reply == nullptr || length < 12) return std::nullopt;
  auto u16 = [&](int at) { return (reply[at] << 8) | reply[at + 1]; };
  auto u32 = [&](int at) { return (static_cast<std::uint32_t>(u16(at)) << 16) | u16(at + 2); };
  int at = 12;
  auto skip_name = [&] {
    char* name = nullptr;
    long used = 0;
    if (ares_expand_name(reply + at, reply, length, &name, &used) != ARES_SUCCESS) return false;
    ares_free_string(name);
    at += static_cast<int>(used);
    return true;
  };
  for (int i = 0, questions = u16(4); i < questions; ++i) {
    if (!skip_name() || at + 4 > length) return std::nullopt;
    at += 4;
  }
  for (int i = 0, answers = u16(6), records = answers + u16(8); i < records; ++i) {
    if (!skip_name() || at + 10 > length) return std::nullopt;
    int type = u16(at);
    std::uint32_t ttl = u32(at + 4);
    int end = at + 10 + u16(at + 8);
    at += 10;
    if (end > length) return std::nullopt;
    if (i >= answers && type == ns_t_soa) {
      if (!skip_name() || !skip_name() || at + 20 > end) return std::nullopt;
      std::uint32_t lowest = std::min(ttl, u32(at + 16));
      return std::chrono::seconds(lowest > 0x7fffffff ? 0 : lowest);  // RFC 2181: above: 0
    }
    at = end;
  }
  return std::nullopt;
}

// Takes one lookup's outcome in: `answer` (answered) replaces `kept` and holds for `ttl` plus
// the grace; a negative answer empties it; both are asked again after `ttl`. A failure keeps
// it while it holds, asked again after min_ttl. `what` and `why` are for the log.
template <class Record, class Freshness>
void take(const DnsConfig& config, const std::string& what, Discovery::Outcome outcome,
          const char* why, std::vector<Record> answer, milliseconds ttl, std::vector<Record>& kept,
          Freshness& fresh) {
  auto now = Clock::now();
  if (outcome != Discovery::Outcome::kFailed) {
    if (fresh.failing) log_info("dns: {}: answered again", what);
    fresh.failing = false;
    kept = std::move(answer);
    fresh.stale_after = now + ttl + config.stale_grace;
    fresh.next = now + ttl;
    return;
  }
  if (!fresh.failing) {
    auto left = std::chrono::duration_cast<milliseconds>(fresh.stale_after - now);
    if (kept.empty()) {
      log_warn("dns: {}: {}", what, why);
    } else {
      log_warn("dns: {}: {}; keeping the last answer ({} record(s)) for up to {} ms more", what,
               why, kept.size(), std::max<long>(0, left.count()));
    }
  }
  fresh.failing = true;
  if (!kept.empty() && now >= fresh.stale_after) {
    log_warn(
        "dns: {}: lookups still fail past the last answer's TTL and dns.stale_grace: its {} "
        "record(s) dropped",
        what, kept.size());
    kept.clear();
  }
  fresh.next = now + config.min_ttl;
}

}  // namespace

std::optional<DnsReply> read_dns_reply(Discovery::Type type, std::span<const unsigned char> reply) {
  const unsigned char* data = reply.data();
  int length = static_cast<int>(std::min<std::size_t>(reply.size(), 65535));
  DnsReply out;
  std::chrono::seconds ttl{0};
  int status = type == Discovery::Type::kSrv
                   ? parse_services(data, length, out.records)
                   : parse_addresses(type, data, length, out.addresses, ttl);
  if (status != ARES_SUCCESS && status != ARES_ENODATA) return std::nullopt;
  if (out.addresses.empty() && out.records.empty()) {
    out.ttl = negative_ttl(data, length);
  } else if (type != Discovery::Type::kSrv) {
    out.ttl = ttl;  // c-ares gives no SRV record's TTL
  }
  return out;
}

// How long a kept answer holds, and when it is asked again.
struct Discovery::Freshness {
  Clock::time_point stale_after;  ///< when the last answer stops counting if lookups fail
  Clock::time_point next;         ///< when it is looked up again
  bool failing = false;           ///< its last lookup failed (logged once per outage)
};

// A host name kept.
struct Discovery::Host {
  std::array<std::vector<std::string>, 2> addresses;  ///< A's and AAAA's (IP text, sorted)
  std::array<Freshness, 2> fresh;                     ///< A's and AAAA's
  int in_flight = 0;                                  ///< its lookups not ended yet
  bool looked_up = false;                             ///< its first lookup ended
  bool checked = false;                               ///< the hosts file was read for it
  bool hosts_file = false;                            ///< a name of the hosts file: not DNS's
  std::uint64_t serial = 0;                           ///< which keeping of the name this is
};

// An SRV name kept.
struct Discovery::Service {
  std::vector<DnsAnswers::Srv> records;  ///< the last answer's
  Freshness fresh;                       ///< when to ask again, how long the answer holds
  int in_flight = 0;                     ///< 1 while its lookup runs
  bool looked_up = false;                ///< its first lookup ended
  std::uint64_t serial = 0;              ///< which keeping of the name this is
};

// One lookup on its way: c-ares's callback argument.
struct Discovery::Ticket {
  Discovery* self;       ///< whose lookup
  std::string name;      ///< the name asked
  Type type;             ///< what was asked
  std::uint64_t serial;  ///< the keeping of the name it was asked for
};

// A c-ares channel set up from a DnsConfig; the poll on its sockets.
class Discovery::Channel {
 public:
  explicit Channel(const DnsConfig& config) {
    static const int initialised = ares_library_init(ARES_LIB_INIT_ALL);
    (void)initialised;
    ares_options options{};
    // Two tries, the second twice as long (c-ares doubles it): the timeout in all.
    options.timeout = static_cast<int>(std::max<long>(100, config.timeout.count() / 3));
    options.tries = 2;
    ok_ =
        ares_init_options(&channel_, &options, ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES) == ARES_SUCCESS;
    if (ok_ && !config.servers.empty()) {
      std::string csv;
      for (const std::string& s : config.servers) csv += (csv.empty() ? "" : ",") + s;
      ok_ = ares_set_servers_ports_csv(channel_, csv.c_str()) == ARES_SUCCESS;
    }
    if (!ok_) log_error("dns: cannot set up a resolver channel: every lookup fails");
  }
  ~Channel() {
    if (channel_ != nullptr) ares_destroy(channel_);  // calls back every lookup in flight
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  bool ok() const { return ok_; }
  ares_channel get() { return channel_; }

  // Waits until a socket of the channel or `wake` is readable, or `until` (or c-ares's next
  // timeout, if sooner); processes what came, and the timeouts.
  void wait(int wake, Clock::time_point until) {
    ares_socket_t sockets[ARES_GETSOCK_MAXNUM];
    int bits = ok_ ? ares_getsock(channel_, sockets, ARES_GETSOCK_MAXNUM) : 0;
    std::vector<pollfd> fds{pollfd{.fd = wake, .events = POLLIN, .revents = 0}};
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      short events = (ARES_GETSOCK_READABLE(bits, i) ? POLLIN : 0) |
                     (ARES_GETSOCK_WRITABLE(bits, i) ? POLLOUT : 0);
      if (events != 0) fds.push_back(pollfd{.fd = sockets[i], .events = events, .revents = 0});
    }
    auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    long ms = std::clamp<long>(left.count(), 0, 60'000);
    timeval most{.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000}, tv{};
    if (ok_) {
      timeval* t = ares_timeout(channel_, &most, &tv);
      ms = t->tv_sec * 1000 + (t->tv_usec + 999) / 1000;
    }
    ::poll(fds.data(), fds.size(), static_cast<int>(ms));
    if (fds[0].revents != 0) {
      std::uint64_t n;
      (void)!::read(wake, &n, sizeof n);
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      const pollfd& p = fds[i];
      ares_process_fd(channel_, (p.revents & (POLLIN | POLLERR | POLLHUP)) ? p.fd : ARES_SOCKET_BAD,
                      (p.revents & POLLOUT) ? p.fd : ARES_SOCKET_BAD);
    }
    if (ok_) ares_process_fd(channel_, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts
  }

 private:
  ares_channel channel_ = nullptr;
  bool ok_ = false;
};

void dns_names(const Config& config, std::set<std::string>& hosts, std::set<std::string>& srv) {
  if (config.redis && !Address::from_host_port(config.redis->host, config.redis->port)) {
    hosts.insert(config.redis->host);
  }
  for (const UpstreamConfig& u : config.upstreams) {
    if (!u.srv.empty()) srv.insert(u.srv);
    for (const TargetConfig& t : u.targets) {
      if (!Address::from_host_port(t.host, t.port)) hosts.insert(t.host);
    }
  }
}

Discovery::Discovery(DnsConfig config)
    : config_(std::move(config)),
      wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      notify_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Discovery::~Discovery() {
  stopping_.store(true);
  if (thread_.joinable()) {
    wake();
    thread_.join();
  }
}

void Discovery::wake() {
  std::uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

void Discovery::keep(const DnsConfig& config, const std::set<std::string>& hosts,
                     const std::set<std::string>& srv) {
  {
    std::lock_guard guard(lock_);
    bool new_servers = config.servers != config_.servers || config.timeout != config_.timeout;
    config_serial_ += new_servers ? 1 : 0;
    config_ = config;
    bool same = hosts == config_hosts_ && srv.size() == services_.size() &&
                std::ranges::all_of(srv, [&](const auto& s) { return services_.contains(s); });
    if (same && !new_servers) return;
    config_hosts_ = hosts;
    std::erase_if(services_, [&](const auto& s) { return !srv.contains(s.first); });
    for (const std::string& name : srv) {
      if (!services_.contains(name)) services_[name].serial = ++serial_;
    }
    sync_hosts();
    publish();
  }
  if (!thread_.joinable() && !(hosts.empty() && srv.empty())) {
    thread_ = std::thread([this] { run(); });
  }
  wake();
}

void Discovery::sync_hosts() {
  std::set<std::string> wanted = config_hosts_;
  for (const auto& [_, service] : services_) {
    for (const auto& r : service.records) wanted.insert(r.host);
  }
  std::erase_if(hosts_, [&](const auto& h) { return !wanted.contains(h.first); });
  for (const std::string& name : wanted) {
    if (!hosts_.contains(name)) hosts_[name].serial = ++serial_;  // due at once
  }
}

bool Discovery::settled() {
  std::lock_guard guard(lock_);
  return std::ranges::all_of(hosts_, [](const auto& h) { return h.second.looked_up; }) &&
         std::ranges::all_of(services_, [](const auto& s) { return s.second.looked_up; });
}

bool Discovery::wait_settled(Clock::time_point until, int interrupt) {
  while (!settled()) {
    auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p[2] = {{.fd = notify_.get(), .events = POLLIN, .revents = 0},
                   {.fd = interrupt, .events = POLLIN, .revents = 0}};
    if (::poll(p, 2, static_cast<int>(std::min<long>(left, 100))) > 0) {
      std::uint64_t n;
      (void)!::read(notify_.get(), &n, sizeof n);  // else the next poll returns at once
      if (p[1].revents != 0) return settled();
    }
  }
  return true;
}

DnsAnswers Discovery::answers() {
  std::lock_guard guard(lock_);
  changed_ = false;
  return answers_;
}

std::optional<DnsAnswers> Discovery::changed() {
  std::uint64_t n;
  (void)!::read(notify_.get(), &n, sizeof n);
  std::lock_guard guard(lock_);
  if (!changed_) return std::nullopt;
  changed_ = false;
  return answers_;
}

std::size_t Discovery::stale() {
  std::lock_guard guard(lock_);
  std::size_t n = 0;
  for (const auto& [_, h] : hosts_) {
    for (int i = 0; i < 2; ++i) n += h.fresh[i].failing && !h.addresses[i].empty() ? 1 : 0;
  }
  for (const auto& [_, s] : services_) n += s.fresh.failing && !s.records.empty() ? 1 : 0;
  return n;
}

void Discovery::publish() {
  DnsAnswers answers;
  bool settled = true;
  for (const auto& [name, h] : hosts_) {
    settled = settled && h.looked_up;
    auto& all = answers.addresses[name];
    for (const auto& family : h.addresses) all.insert(all.end(), family.begin(), family.end());
    std::ranges::sort(all);
  }
  for (const auto& [name, s] : services_) {
    settled = settled && s.looked_up;
    answers.services[name] = s.records;
  }
  bool news = !(answers == answers_) || (settled && !was_settled_);
  was_settled_ = settled;
  if (!(answers == answers_)) {
    answers_ = std::move(answers);
    changed_ = true;
  }
  if (news) {
    std::uint64_t one = 1;
    (void)!::write(notify_.get(), &one, sizeof one);
  }
}

std::vector<Discovery::Ticket*> Discovery::due(Clock::time_point now, Clock::time_point& next) {
  std::vector<Ticket*> tickets;
  next = now + std::chrono::minutes(1);
  for (auto& [name, h] : hosts_) {
    // A name not checked against the hosts file yet waits for the next round (a moment).
    if (h.hosts_file || !h.checked || h.in_flight != 0) continue;
    // Each family on its own TTL (an AAAA that does not exist is asked on its negative TTL).
    for (Type type : {Type::kA, Type::kAaaa}) {
      Clock::time_point due = h.fresh[type == Type::kA ? 0 : 1].next;
      if (due > now) {
        next = std::min(next, due);
        continue;
      }
      tickets.push_back(new Ticket{this, name, type, h.serial});
      ++h.in_flight;
    }
  }
  if (std::ranges::any_of(hosts_, [](const auto& h) { return h.second.hosts_file; })) {
    next = std::min(next, hosts_file_next_);
  }
  for (auto& [name, s] : services_) {
    if (s.in_flight != 0) continue;
    if (s.fresh.next > now) {
      next = std::min(next, s.fresh.next);
      continue;
    }
    tickets.push_back(new Ticket{this, name, Type::kSrv, s.serial});
    s.in_flight = 1;
  }
  return tickets;
}

void Discovery::run() {
  std::unique_ptr<Channel> channel;
  std::uint64_t channel_serial = 0;
  while (!stopping_.load()) {
    {
      std::lock_guard guard(lock_);
      // New servers or timeout: a new channel at once. The lookups in flight on the old one
      // come back from its destruction (on_reply) to be asked again on the new one: waiting
      // for them to end could wait for good, lookups on a silent server overlapping.
      if (!channel || channel_serial != config_serial_) {
        channel.reset();
        channel = std::make_unique<Channel>(config_);
        channel_serial = config_serial_;
      }
    }
    std::vector<Ticket*> again = std::exchange(resend_, {});
    for (Ticket* ticket : again) send(*channel, ticket);
    check_hosts_file();
    Clock::time_point next;
    std::vector<Ticket*> tickets;
    {
      std::lock_guard guard(lock_);
      tickets = due(Clock::now(), next);
    }
    for (Ticket* ticket : tickets) send(*channel, ticket);
    channel->wait(wake_.get(), next);
  }
  channel.reset();
  for (Ticket* ticket : std::exchange(resend_, {})) delete ticket;
}

std::optional<std::string> Discovery::read_hosts_file() {
  // The file c-ares would read: $CARES_HOSTS if set, else /etc/hosts.
  const char* named = std::getenv("CARES_HOSTS");
  std::string path = named != nullptr && *named != '\0' ? named : "/etc/hosts";
  try {
    // As the configuration is read: opened non-blocking, only a regular file of bounded size,
    // so a FIFO or a device in its place is refused, never waited on (discovery's only thread
    // would wait, and every lookup and the exit with it).
    std::string text = read_config_file(path);
    hosts_file_trouble_.clear();
    return text;
  } catch (const ConfigError& e) {
    if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return std::string();
    if (hosts_file_trouble_ != e.what()) {
      hosts_file_trouble_ = e.what();
      log_warn("dns: hosts file {}: its names go to DNS until it can be read", e.what());
    }
    return std::nullopt;
  }
}

void Discovery::check_hosts_file() {
  std::vector<std::string> names;
  auto now = Clock::now();
  {
    std::lock_guard guard(lock_);
    // The hosts file's names are read again every min_ttl: an edit of the file is followed.
    bool reread = now >= hosts_file_next_;
    if (reread) hosts_file_next_ = now + config_.min_ttl;
    for (auto& [name, h] : hosts_) {
      if (!h.checked || (reread && h.hosts_file)) names.push_back(name);
    }
  }
  if (names.empty()) return;
  std::optional<std::string> text = read_hosts_file();
  auto found = hosts_file_addresses(text.value_or(""), names);
  std::lock_guard guard(lock_);
  for (const std::string& name : names) {
    auto it = hosts_.find(name);
    if (it == hosts_.end()) continue;
    Host& h = it->second;
    // A file that cannot be read now keeps the names it gave; new names go to DNS meanwhile.
    if (!text && h.checked) continue;
    h.checked = true;
    auto listed = found.find(name);
    // A name the file no longer lists goes to DNS from now on (due at once).
    if (listed == found.end()) {
      if (h.hosts_file) h = Host{.checked = true, .serial = h.serial};
      continue;
    }
    // Not DNS's to answer: its addresses are the file's.
    h.hosts_file = h.looked_up = true;
    h.addresses = std::move(listed->second);
  }
  publish();
}

void Discovery::send(Channel& channel, Ticket* ticket) {
  if (!channel.ok()) return on_reply(ticket, ARES_ECONNREFUSED, 0, nullptr, 0);
  int type = ticket->type == Type::kA ? ns_t_a : ticket->type == Type::kAaaa ? ns_t_aaaa : ns_t_srv;
  ares_query(channel.get(), ticket->name.c_str(), ns_c_in, type, &Discovery::on_reply, ticket);
}

void Discovery::on_reply(void* arg, int status, int, unsigned char* reply, int length) {
  std::unique_ptr<Ticket> ticket(static_cast<Ticket*>(arg));
  Discovery& self = *ticket->self;
  if (self.stopping_.load()) return;
  // Its channel was replaced (new servers): run() asks it again on the new one.
  if (status == ARES_EDESTRUCTION) return self.resend_.push_back(ticket.release());
  std::lock_guard guard(self.lock_);
  if (ticket->type == Type::kSrv) {
    self.merge_service(*ticket, status, reply, length);
  } else {
    self.merge_host(*ticket, status, reply, length);
  }
  self.publish();
}

namespace {

// What a lookup's reply says: `outcome` as c-ares's status says (a failure if it does not
// parse; a negative one if nothing usable is in it), the reply read, and `why` for the log.
DnsReply read_reply(Discovery::Type type, int status, const unsigned char* reply, int length,
                    Discovery::Outcome& outcome, const char*& why) {
  outcome = outcome_of(status);
  why = ares_strerror(status);
  if (outcome == Discovery::Outcome::kFailed) return {};
  if (reply == nullptr || length <= 0) return {};
  auto got = read_dns_reply(type, {reply, static_cast<std::size_t>(length)});
  if (!got) {
    outcome = Discovery::Outcome::kFailed;
    why = "a reply that does not parse";
    return {};
  }
  if (got->addresses.empty() && got->records.empty()) outcome = Discovery::Outcome::kNegative;
  return std::move(*got);
}

}  // namespace

void Discovery::merge_host(const Ticket& ticket, int status, const unsigned char* reply,
                           int length) {
  auto it = hosts_.find(ticket.name);
  if (it == hosts_.end() || it->second.serial != ticket.serial) return;  // no longer kept
  Host& host = it->second;
  int family = ticket.type == Type::kA ? 0 : 1;
  Outcome outcome;
  const char* why;
  DnsReply got = read_reply(ticket.type, status, reply, length, outcome, why);
  counts_[static_cast<int>(ticket.type)][static_cast<int>(outcome)].fetch_add(1);
  // A negative answer lasts its SOA's negative TTL; none, or a failure: min_ttl.
  take(config_, fmt::format("{} {}", ticket.name, type_name(ticket.type)), outcome, why,
       std::move(got.addresses), clamp_ttl(config_, got.ttl.value_or(std::chrono::seconds(0))),
       host.addresses[family], host.fresh[family]);
  if (--host.in_flight == 0) host.looked_up = true;
}

void Discovery::merge_service(const Ticket& ticket, int status, const unsigned char* reply,
                              int length) {
  auto it = services_.find(ticket.name);
  if (it == services_.end() || it->second.serial != ticket.serial) return;
  Service& service = it->second;
  Outcome outcome;
  const char* why;
  DnsReply got = read_reply(Type::kSrv, status, reply, length, outcome, why);
  counts_[static_cast<int>(Type::kSrv)][static_cast<int>(outcome)].fetch_add(1);
  // c-ares gives no SRV TTL: srv_refresh stands for it.
  take(config_, fmt::format("{} SRV", ticket.name), outcome, why, std::move(got.records),
       config_.srv_refresh, service.records, service.fresh);
  service.in_flight = 0;
  service.looked_up = true;
  sync_hosts();
}

std::map<std::string, std::array<std::vector<std::string>, 2>> hosts_file_addresses(
    std::string_view text, const std::vector<std::string>& names) {
  auto same = [](std::string_view a, std::string_view b) {
    return std::ranges::equal(a, b, [](char x, char y) {
      return std::tolower(static_cast<unsigned char>(x)) ==
             std::tolower(static_cast<unsigned char>(y));
    });
  };
  std::map<std::string, std::array<std::vector<std::string>, 2>> found;
  while (!text.empty()) {
    std::string_view line = text.substr(0, text.find('\n'));
    text.remove_prefix(std::min(text.size(), line.size() + 1));
    line = line.substr(0, line.find('#'));
    constexpr std::string_view kBlank = " \t\r\f\v";
    std::vector<std::string_view> words;
    for (std::size_t at = 0; (at = line.find_first_not_of(kBlank, at)) != line.npos;) {
      std::size_t end = std::min(line.find_first_of(kBlank, at), line.size());
      words.push_back(line.substr(at, end - at));
      at = end;
    }
    if (words.size() < 2) continue;
    std::string word(words[0]);
    int family = word.find(':') == std::string::npos ? AF_INET : AF_INET6;
    in6_addr bytes{};
    char ip[INET6_ADDRSTRLEN];
    if (::inet_pton(family, word.c_str(), &bytes) != 1 ||
        ::inet_ntop(family, &bytes, ip, sizeof ip) == nullptr) {
      continue;
    }
    for (std::size_t i = 1; i < words.size(); ++i) {
      for (const std::string& name : names) {
        if (same(words[i], name)) found[name][family == AF_INET ? 0 : 1].emplace_back(ip);
      }
    }
  }
  for (auto& [name, families] : found) {
    for (auto& family : families) {
      std::ranges::sort(family);
      family.erase(std::ranges::unique(family).begin(), family.end());
    }
  }
  return found;
}

}  // namespace spindle::proxy
