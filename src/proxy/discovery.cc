// DNS discovery with c-ares, on a thread of its own: each lookup runs a c-ares channel to its
// end (poll on its sockets), which is all a thread that only resolves needs.

#include "spindle/proxy/discovery.h"

#include <ares.h>
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <fmt/format.h>
#include <poll.h>

#include <algorithm>

#include "spindle/base/log.h"
#include "spindle/net/address.h"

namespace spindle::proxy {
namespace {

using Clock = std::chrono::steady_clock;

// One lookup's outcome.
struct HostAnswer {
  bool ok = false;
  std::vector<std::string> addresses;
  std::chrono::seconds ttl{0};
};

struct SrvAnswer {
  bool ok = false;
  std::vector<DnsAnswers::Srv> records;
};

// A c-ares channel set up from `config`, freed on scope exit.
class Channel {
 public:
  explicit Channel(const DnsConfig& config) {
    static const int initialised = ares_library_init(ARES_LIB_INIT_ALL);
    (void)initialised;
    ares_options options{};
    options.timeout = static_cast<int>(std::max<long>(100, config.timeout.count() / 2));
    options.tries = 2;
    int mask = ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES;
    ok_ = ares_init_options(&channel_, &options, mask) == ARES_SUCCESS;
    if (ok_ && !config.servers.empty()) {
      std::string csv;
      for (const std::string& s : config.servers) csv += (csv.empty() ? "" : ",") + s;
      ok_ = ares_set_servers_ports_csv(channel_, csv.c_str()) == ARES_SUCCESS;
    }
  }
  ~Channel() {
    if (channel_ != nullptr) ares_destroy(channel_);
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  bool ok() const { return ok_; }
  ares_channel get() { return channel_; }

  // Runs the queries sent until all are answered (or have timed out).
  void run() {
    for (;;) {
      ares_socket_t sockets[ARES_GETSOCK_MAXNUM];
      int bits = ares_getsock(channel_, sockets, ARES_GETSOCK_MAXNUM);
      std::vector<pollfd> fds;
      for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
        short events = 0;
        if (ARES_GETSOCK_READABLE(bits, i)) events |= POLLIN;
        if (ARES_GETSOCK_WRITABLE(bits, i)) events |= POLLOUT;
        if (events != 0) fds.push_back(pollfd{.fd = sockets[i], .events = events, .revents = 0});
      }
      if (fds.empty()) return;
      timeval tv{};
      timeval* wait = ares_timeout(channel_, nullptr, &tv);
      int ms = wait ? static_cast<int>(wait->tv_sec * 1000 + wait->tv_usec / 1000) : 1000;
      ::poll(fds.data(), fds.size(), ms);
      for (const pollfd& p : fds) {
        ares_process_fd(channel_, (p.revents & POLLIN) ? p.fd : ARES_SOCKET_BAD,
                        (p.revents & POLLOUT) ? p.fd : ARES_SOCKET_BAD);
      }
      ares_process_fd(channel_, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts
    }
  }

 private:
  ares_channel channel_ = nullptr;
  bool ok_ = false;
};

// True if `name` is in the hosts file (/etc/hosts): such a name is not DNS's to answer, and is
// left to the system resolver, once, as names were before discovery.
bool in_hosts_file(const DnsConfig& config, const std::string& name) {
  Channel channel(config);
  if (!channel.ok()) return false;
  for (int family : {AF_INET, AF_INET6}) {
    hostent* host = nullptr;
    if (ares_gethostbyname_file(channel.get(), name.c_str(), family, &host) == ARES_SUCCESS) {
      ares_free_hostent(host);
      return true;
    }
  }
  return false;
}

// A and AAAA of `name`.
HostAnswer lookup_host(const DnsConfig& config, const std::string& name) {
  Channel channel(config);
  HostAnswer answer;
  if (!channel.ok()) return answer;
  struct Query {
    HostAnswer* answer;
    int family;
    bool done = false;
    bool ok = false;
  };
  auto callback = [](void* arg, int status, int, unsigned char* abuf, int alen) {
    auto* q = static_cast<Query*>(arg);
    q->done = true;
    if (status == ARES_ENODATA || status == ARES_ENOTFOUND) {
      q->ok = true;  // answered: no such address
      return;
    }
    if (status != ARES_SUCCESS) return;
    constexpr int kMax = 64;
    int count = kMax;
    char text[INET6_ADDRSTRLEN];
    std::int64_t lowest = -1;
    if (q->family == AF_INET) {
      ares_addrttl found[kMax];
      if (ares_parse_a_reply(abuf, alen, nullptr, found, &count) != ARES_SUCCESS) return;
      for (int i = 0; i < count; ++i) {
        ::inet_ntop(AF_INET, &found[i].ipaddr, text, sizeof text);
        q->answer->addresses.emplace_back(text);
        if (lowest < 0 || found[i].ttl < lowest) lowest = found[i].ttl;
      }
    } else {
      ares_addr6ttl found[kMax];
      if (ares_parse_aaaa_reply(abuf, alen, nullptr, found, &count) != ARES_SUCCESS) return;
      for (int i = 0; i < count; ++i) {
        ::inet_ntop(AF_INET6, &found[i].ip6addr, text, sizeof text);
        q->answer->addresses.emplace_back(text);
        if (lowest < 0 || found[i].ttl < lowest) lowest = found[i].ttl;
      }
    }
    q->ok = true;
    if (lowest >= 0 && (q->answer->ttl.count() == 0 || lowest < q->answer->ttl.count())) {
      q->answer->ttl = std::chrono::seconds(lowest);
    }
  };
  Query a{&answer, AF_INET}, aaaa{&answer, AF_INET6};
  ares_query(channel.get(), name.c_str(), ns_c_in, ns_t_a, callback, &a);
  ares_query(channel.get(), name.c_str(), ns_c_in, ns_t_aaaa, callback, &aaaa);
  channel.run();
  answer.ok = a.ok && aaaa.ok;
  std::ranges::sort(answer.addresses);
  answer.addresses.erase(std::ranges::unique(answer.addresses).begin(), answer.addresses.end());
  return answer;
}

// The SRV records of `name` (those of the lowest priority: the others are fallbacks).
SrvAnswer lookup_srv(const DnsConfig& config, const std::string& name) {
  Channel channel(config);
  SrvAnswer answer;
  if (!channel.ok()) return answer;
  auto callback = [](void* arg, int status, int, unsigned char* abuf, int alen) {
    auto* a = static_cast<SrvAnswer*>(arg);
    if (status == ARES_ENODATA || status == ARES_ENOTFOUND) {
      a->ok = true;
      return;
    }
    ares_srv_reply* records = nullptr;
    if (status != ARES_SUCCESS || ares_parse_srv_reply(abuf, alen, &records) != ARES_SUCCESS) {
      return;
    }
    a->ok = true;
    unsigned short best = 0xffff;
    for (auto* r = records; r != nullptr; r = r->next) best = std::min(best, r->priority);
    for (auto* r = records; r != nullptr; r = r->next) {
      if (r->priority != best || r->port == 0) continue;
      // Weight 0 means "rarely": it gets the smallest share there is.
      a->records.push_back({r->host, r->port, std::max<unsigned>(1, r->weight)});
    }
    ares_free_data(records);
  };
  ares_query(channel.get(), name.c_str(), ns_c_in, ns_t_srv, callback, &answer);
  channel.run();
  std::ranges::sort(answer.records, [](const auto& x, const auto& y) {
    return std::tie(x.host, x.port, x.weight) < std::tie(y.host, y.port, y.weight);
  });
  return answer;
}

std::chrono::milliseconds clamp_ttl(const DnsConfig& config, std::chrono::seconds ttl) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(ttl);
  return std::clamp(ms, config.min_ttl, config.max_ttl);
}

// Looks every name of `hosts` and `srv` up into `answers` (keeping an old answer when a lookup
// fails); returns when each is due next.
std::map<std::string, Clock::time_point> refresh(const DnsConfig& config,
                                                 const std::set<std::string>& hosts,
                                                 const std::set<std::string>& srv,
                                                 DnsAnswers& answers) {
  std::map<std::string, Clock::time_point> due;
  std::set<std::string> all_hosts = hosts;
  for (const std::string& name : srv) {
    SrvAnswer found = lookup_srv(config, name);
    if (found.ok) {
      answers.services[name] = found.records;
    } else {
      log_warn("dns: SRV {}: no answer; keeping the last one", name);
    }
    for (const auto& record : answers.services[name]) all_hosts.insert(record.host);
    due["srv " + name] = Clock::now() + config.srv_refresh;
  }
  for (auto it = all_hosts.begin(); it != all_hosts.end();) {
    if (in_hosts_file(config, *it)) {
      it = all_hosts.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& name : all_hosts) {
    HostAnswer found = lookup_host(config, name);
    if (found.ok) {
      answers.addresses[name] = found.addresses;
    } else {
      log_warn("dns: {}: no answer; keeping the last one", name);
      answers.addresses.try_emplace(name);
    }
    due["host " + name] =
        Clock::now() +
        (found.ok && !found.addresses.empty() ? clamp_ttl(config, found.ttl) : config.min_ttl);
  }
  // Names no longer asked for are forgotten.
  std::erase_if(answers.addresses, [&](const auto& e) { return !all_hosts.contains(e.first); });
  std::erase_if(answers.services, [&](const auto& e) { return !srv.contains(e.first); });
  return due;
}

}  // namespace

void dns_names(const Config& config, std::set<std::string>& hosts, std::set<std::string>& srv) {
  for (const UpstreamConfig& u : config.upstreams) {
    if (!u.srv.empty()) srv.insert(u.srv);
    for (const TargetConfig& t : u.targets) {
      if (!Address::from_host_port(t.host, t.port)) hosts.insert(t.host);
    }
  }
}

Discovery::Discovery(DnsConfig config) : config_(std::move(config)) {
  thread_ = std::thread([this] { run(); });
}

Discovery::~Discovery() {
  {
    std::lock_guard guard(lock_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

DnsAnswers Discovery::resolve(const DnsConfig& config, const std::set<std::string>& hosts,
                              const std::set<std::string>& srv) {
  DnsAnswers answers;
  {
    std::lock_guard guard(lock_);
    answers = answers_;
  }
  (void)refresh(config, hosts, srv, answers);
  return answers;
}

void Discovery::keep(const DnsConfig& config, const std::set<std::string>& hosts,
                     const std::set<std::string>& srv, DnsAnswers answers) {
  {
    std::lock_guard guard(lock_);
    config_ = config;
    hosts_ = hosts;
    srv_ = srv;
    answers_ = std::move(answers);
    changed_ = false;
    ++generation_;
  }
  wake_.notify_all();
}

std::optional<DnsAnswers> Discovery::changed() {
  std::lock_guard guard(lock_);
  if (!changed_) return std::nullopt;
  changed_ = false;
  return answers_;
}

void Discovery::run() {
  std::unique_lock guard(lock_);
  std::map<std::string, Clock::time_point> due;
  std::uint64_t generation = generation_;
  for (;;) {
    if (stopping_) return;
    if (generation != generation_) {
      // keep() has just been given fresh answers: the schedule starts again.
      generation = generation_;
      due.clear();
    }
    if (hosts_.empty() && srv_.empty()) {
      wake_.wait(guard);
      continue;
    }
    auto next =
        due.empty()
            ? Clock::now() + config_.min_ttl
            : std::ranges::min_element(due, {}, [](const auto& e) { return e.second; })->second;
    if (due.empty() || Clock::now() < next) {
      if (due.empty()) {
        // First round after keep(): everything is looked up again after the shortest TTL
        // allowed, and on the TTLs the answers give from then on.
        due["first"] = next;
      }
      wake_.wait_until(guard, next);
      continue;
    }
    // Something is due: look everything up (names are few; one round keeps SRV targets and
    // their hosts consistent).
    DnsConfig config = config_;
    std::set<std::string> hosts = hosts_, srv = srv_;
    DnsAnswers answers = answers_;
    guard.unlock();
    auto next_due = refresh(config, hosts, srv, answers);
    guard.lock();
    if (generation != generation_) continue;  // keep() came meanwhile: its answers stand
    due = std::move(next_due);
    if (!(answers == answers_)) {
      answers_ = std::move(answers);
      changed_ = true;
    }
  }
}

}  // namespace spindle::proxy
