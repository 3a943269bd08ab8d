// Discovery against a name server of the test's own (UDP on loopback, answers from a function):
// each family alone, the last answer kept through failures, every name asked at once, and a
// stop that does not wait for lookups in flight. Where threads meet (discovery's thread, the
// caller's, c-ares's callbacks): run under TSan too.
#include "spindle/proxy/discovery.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "dns_testing.h"

using namespace std::chrono_literals;
using namespace spindle::proxy;
using namespace spindle::proxy::testing;
using Clock = std::chrono::steady_clock;

namespace {

// A name server on 127.0.0.1 (UDP): `answer` gives the reply to (labels, type, id), or
// nothing (silence). Notes when each question came.
class NameServer {
 public:
  using Answer = std::function<std::optional<Reply>(const std::vector<std::string>& name,
                                                    std::uint16_t type, std::uint16_t id)>;

  explicit NameServer(Answer answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t n = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &n);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~NameServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // When each question (name, type) came.
  std::vector<std::pair<Clock::time_point, std::uint16_t>> asked() {
    std::lock_guard guard(lock_);
    return asked_;
  }

 private:
  void serve() {
    std::uint8_t q[512];
    while (!stop_) {
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      sockaddr_in peer{};
      socklen_t n = sizeof peer;
      ssize_t got = ::recvfrom(fd_, q, sizeof q, 0, reinterpret_cast<sockaddr*>(&peer), &n);
      if (got < 17) continue;
      std::vector<std::string> labels;
      std::size_t at = 12;
      while (at < static_cast<std::size_t>(got) && q[at] != 0) {
        labels.emplace_back(reinterpret_cast<char*>(q + at + 1), q[at]);
        at += 1 + q[at];
      }
      std::uint16_t type = static_cast<std::uint16_t>((q[at + 1] << 8) | q[at + 2]);
      {
        std::lock_guard guard(lock_);
        asked_.emplace_back(Clock::now(), type);
      }
      auto reply = answer_(labels, type, static_cast<std::uint16_t>((q[0] << 8) | q[1]));
      if (!reply) continue;
      auto bytes = reply->bytes();
      ::sendto(fd_, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&peer), n);
    }
  }

  Answer answer_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex lock_;
  std::vector<std::pair<Clock::time_point, std::uint16_t>> asked_;
  std::thread thread_;
};

DnsConfig config_for(const NameServer& server, std::chrono::milliseconds timeout = 600ms,
                     std::chrono::milliseconds min_ttl = 200ms) {
  DnsConfig config;
  config.servers = {server.address()};
  config.min_ttl = min_ttl;
  config.timeout = timeout;
  return config;
}

}  // namespace

TEST(Discovery, EachFamilyStandsAloneAndAFailureKeepsTheLastAnswer) {
  std::atomic<bool> a_fails{false};
  NameServer server([&](const auto& name, std::uint16_t type, std::uint16_t id) {
    if (type == kA && !a_fails) return std::optional(Reply(type, 0, name, id).a("10.0.0.1", 1));
    return std::optional(Reply(type, 2, name, id));  // SERVFAIL
  });
  Discovery discovery(config_for(server));
  discovery.keep(config_for(server), {"api.test"}, {});
  ASSERT_TRUE(discovery.wait_settled(Clock::now() + 5s));
  EXPECT_EQ(discovery.answers().addresses.at("api.test"), std::vector<std::string>{"10.0.0.1"});
  // A fails from now on: its answer stays (the grace is an hour), counted as stale.
  a_fails = true;
  auto failed = discovery.lookups(Discovery::Type::kA, Discovery::Outcome::kFailed);
  auto until = Clock::now() + 10s;
  while (discovery.lookups(Discovery::Type::kA, Discovery::Outcome::kFailed) == failed &&
         Clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GT(discovery.lookups(Discovery::Type::kA, Discovery::Outcome::kFailed), failed);
  EXPECT_EQ(discovery.answers().addresses.at("api.test"), std::vector<std::string>{"10.0.0.1"});
  EXPECT_EQ(discovery.stale(), 1u);
}

TEST(Discovery, EveryNameIsAskedAtOnceAndAStopDoesNotWaitForThem) {
  NameServer server([](const auto&, std::uint16_t, std::uint16_t) {
    return std::optional<Reply>();  // silence
  });
  std::set<std::string> names;
  for (int i = 0; i < 6; ++i) names.insert("n" + std::to_string(i) + ".test");
  auto discovery = std::make_unique<Discovery>(config_for(server, 10s));
  discovery->keep(config_for(server, 10s), names, {});
  auto until = Clock::now() + 5s;
  while (server.asked().size() < 12 && Clock::now() < until) std::this_thread::sleep_for(10ms);
  auto asked = server.asked();
  ASSERT_GE(asked.size(), 12u);
  // Twelve questions within a moment (one after another, each would wait 10 s for nothing).
  EXPECT_LT(asked[11].first - asked[0].first, 1s);
  EXPECT_FALSE(discovery->settled());
  auto stopping = Clock::now();
  discovery.reset();
  EXPECT_LT(Clock::now() - stopping, 1s);
}

TEST(Discovery, ANameKeptAgainKeepsItsAnswerAndANewOneIsAskedAtOnce) {
  NameServer server([](const auto& name, std::uint16_t type, std::uint16_t id) {
    // two.test answers late (well within a try of the 600 ms timeout), so that the check that a new
    // name unsettles discovery is not raced by its answer.
    if (name[0] == "two" && type == kA) std::this_thread::sleep_for(100ms);
    if (type != kA) return std::optional(Reply(type, 0, name, id));  // no AAAA
    return std::optional(Reply(type, 0, name, id).a(name[0] == "one" ? "10.0.0.1" : "10.0.0.2"));
  });
  // min_ttl 10 s: nothing is asked again during the test.
  Discovery discovery(config_for(server, 600ms, 10s));
  discovery.keep(config_for(server, 600ms, 10s), {"one.test"}, {});
  ASSERT_TRUE(discovery.wait_settled(Clock::now() + 5s));
  auto before = server.asked().size();
  discovery.keep(config_for(server, 600ms, 10s), {"one.test", "two.test"}, {});
  EXPECT_FALSE(discovery.settled());
  ASSERT_TRUE(discovery.wait_settled(Clock::now() + 5s));
  auto answers = discovery.answers();
  EXPECT_EQ(answers.addresses.at("one.test"), std::vector<std::string>{"10.0.0.1"});
  EXPECT_EQ(answers.addresses.at("two.test"), std::vector<std::string>{"10.0.0.2"});
  EXPECT_EQ(server.asked().size(), before + 2);  // two.test's A and AAAA, not one.test again
  discovery.keep(config_for(server, 600ms, 10s), {"two.test"}, {});
  EXPECT_FALSE(discovery.answers().addresses.contains("one.test"));
}

// A name of the hosts file is answered from the file, on discovery's thread (the gateway never
// looks a name up), never asked of DNS (here a server that is silent), and the file is read
// again: an edit is followed. c-ares reads $CARES_HOSTS in place of /etc/hosts.
TEST(Discovery, NamesOfTheHostsFileAreAnsweredFromItWithoutDns) {
  char dir[] = "/tmp/spindle-hosts-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/hosts";
  auto write = [&](const std::string& text) {
    std::string tmp = path + ".new";
    FILE* f = std::fopen(tmp.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
    ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
  };
  write("10.1.2.3 alias.test\n::5 alias.test other.test\n");
  ::setenv("CARES_HOSTS", path.c_str(), 1);
  {
    NameServer silent([](const auto&, std::uint16_t, std::uint16_t) -> std::optional<Reply> {
      return std::nullopt;
    });
    Discovery discovery(config_for(silent, 3000ms));
    discovery.keep(config_for(silent, 3000ms), {"alias.test", "other.test"}, {});
    // Settled long before a DNS lookup could time out.
    ASSERT_TRUE(discovery.wait_settled(Clock::now() + 1500ms));
    auto answers = discovery.answers();
    EXPECT_EQ(answers.addresses.at("alias.test"), (std::vector<std::string>{"10.1.2.3", "::5"}));
    EXPECT_EQ(answers.addresses.at("other.test"), std::vector<std::string>{"::5"});
    write("10.9.9.9 alias.test\n::5 other.test\n");
    auto until = Clock::now() + 5s;
    while (discovery.answers().addresses.at("alias.test") != std::vector<std::string>{"10.9.9.9"} &&
           Clock::now() < until) {
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(discovery.answers().addresses.at("alias.test"), std::vector<std::string>{"10.9.9.9"});
    EXPECT_TRUE(silent.asked().empty());
  }
  ::unsetenv("CARES_HOSTS");
  std::remove(path.c_str());
  ::rmdir(dir);
}
