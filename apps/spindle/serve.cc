#include "serve.h"

#include <fmt/format.h>
#include <poll.h>
#include <spawn.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "config_watch.h"
#include "handover.h"
#include "instance.h"
#include "spindle/base/log.h"
#include "spindle/fiber/runtime.h"
#include "spindle/net/signal_set.h"
#include "spindle/proxy/config.h"
#include "spindle/proxy/gateway.h"
#include "systemd.h"

namespace spindle::app {
namespace {

using proxy::Config;
using proxy::ConfigError;
using proxy::load_config;
using proxy::parse_config;
using proxy::ServerConfig;

// The configuration used when no --config is given.
constexpr const char* kDefaultConfig = R"(# spindle's built-in configuration
threads: 0            # one worker per core
servers:
  - listen: 127.0.0.1:8080
    default_site: true
    access_log: {path: "-", format: combined}
)";

// True if the built-in server listens where the passed sockets do: no address is configured
// (neither --config nor --listen) and sockets were passed.
bool serves_where_passed(const ServeFlags& flags) {
  return flags.config.empty() && !flags.listen && !flags.passed.empty();
}

// The configuration to serve: the file's (`text`, its contents as read, if given), or the
// built-in one, with the command line's overrides.
Config effective_config(const ServeFlags& flags, const std::string* text = nullptr) {
  Config config = flags.config.empty() ? parse_config(kDefaultConfig, "(built-in configuration)")
                  : text != nullptr    ? parse_config(*text, flags.config)
                                       : load_config(flags.config);
  if (flags.threads) config.threads = *flags.threads;
  if (flags.listen) {
    auto address = Address::parse(*flags.listen);
    if (!address) {
      throw ConfigError(
          fmt::format("--listen: bad address '{}': expected IPv4:PORT, [IPv6]:PORT or unix:PATH",
                      *flags.listen));
    }
    config.servers.at(0).listen = *address;
  }
  if (flags.root) config.servers.at(0).root = *flags.root;
  if (serves_where_passed(flags)) {
    ServerConfig server = config.servers.at(0);
    config.servers.clear();
    for (const Address& address : flags.passed) {
      server.listen = address;
      config.servers.push_back(server);
    }
  }
  return config;
}

}  // namespace

int check_config(const std::string& file) {
  try {
    Config config = load_config(file);
    // What serve builds before it listens (upstream names resolved, TLS contexts, the route
    // table): a file check-config passes, serve starts with.
    if (!config.routes.empty()) {
      proxy::HealthRegistry health;
      (void)proxy::Gateway::build(config, 1, health);
    }
    auto count = [](std::size_t n, std::string_view what) {
      return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s");
    };
    fmt::print("{}: ok ({}, {}, {}, {})\n", file, count(config.servers.size(), "server"),
               count(config.routes.size(), "route"), count(config.services.size(), "service"),
               count(config.upstreams.size(), "upstream"));
    // Each route's middlewares in the order written, with the phases they act in.
    fmt::print("{}", proxy::describe_chains(config));
    return 0;
  } catch (const ConfigError& e) {
    fmt::print(stderr, "spindle: {}\n", e.what());
    return 1;
  }
}

namespace {

// The one-line STATUS= for systemd (systemctl status shows it).
std::string status_line(const Instance& instance, std::string_view prefix = {}) {
  const Config& config = instance.config();
  return fmt::format("STATUS={}{} server(s), {} route(s), {}", prefix, config.servers.size(),
                     config.routes.size(),
                     config.threads == 0 ? std::string("a worker per core")
                                         : fmt::format("{} worker(s)", config.threads));
}

// Waits until `fd` is readable or `timeout_ms` passes (-1: for ever); true if readable.
bool readable(int fd, int timeout_ms) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  int n;
  while ((n = ::poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  return n > 0;
}

// After a change of the configuration file, waits until its folder has been quiet for 50 ms
// (an editor or a ConfigMap update is several events), at most a second, and says what the
// file's state is then.
ConfigWatch::Change settle(ConfigWatch& watch, ConfigWatch::Change change) {
  using Change = ConfigWatch::Change;
  bool complete = change == Change::kComplete;
  bool writing = change == Change::kWriting;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < until && readable(watch.fd(), 50)) {
    Change more = watch.consume();
    writing = more == Change::kWriting;  // kNone: nobody writes it now either
    complete = complete || more == Change::kComplete;
  }
  return writing ? Change::kWriting : complete ? Change::kComplete : Change::kNone;
}

}  // namespace

namespace {

// Starts the binary at `exe` with `argv` (the same command line): with --handover it takes
// this process's listening sockets over. Returns its PID, or why not.
std::expected<pid_t, std::string> start_replacement(const std::string& exe,
                                                    const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);  // ours blocks the signals it reads
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, exe.c_str(), nullptr, &attributes, args.data(), environ);
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) return std::unexpected(fmt::format("cannot start {}: {}", exe, std::strerror(rc)));
  return pid;
}

}  // namespace

int upgrade(const std::string& handover) {
  auto connection = connect_handover(handover);
  if (!connection) {
    fmt::print(stderr, "spindle: {}: no spindle listens there (serve --handover {})\n", handover,
               handover);
    return 1;
  }
  if (!send_message(connection->get(), "upgrade")) {
    fmt::print(stderr, "spindle: {}: {}\n", handover, std::strerror(errno));
    return 1;
  }
  std::string answer = receive_message(connection->get(), 5000);
  if (!answer.starts_with("started ")) {
    fmt::print(stderr, "spindle: upgrade failed: {}\n", answer.empty() ? "no answer" : answer);
    return 1;
  }
  fmt::print("{}: the new process ({}) takes over; the old one drains, then exits\n", handover,
             answer.substr(8));
  return 0;
}

namespace {

// The binary as it is now, so that an upgrade starts whatever has replaced it since.
std::string current_executable(const ServeFlags& flags) {
  std::string exe = flags.argv.empty() ? std::string() : flags.argv[0];
  char path[4096];
  if (ssize_t n = ::readlink("/proc/self/exe", path, sizeof path); n > 0) {
    exe.assign(path, static_cast<std::size_t>(n));
    if (exe.ends_with(" (deleted)")) exe.resize(exe.size() - 10);
  }
  return exe;
}

// huge_page_stacks asks for what a kernel with transparent huge pages off cannot give: say so.
void warn_if_no_huge_pages() {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(thp, modes);
  if (modes.find("[never]") != std::string::npos) {
    log_warn(
        "huge_page_stacks: transparent huge pages are off in this kernel "
        "(/sys/kernel/mm/transparent_hugepage/enabled: {}): stacks use 4 KiB pages",
        modes);
  }
}

// Where the listening sockets come from when they are not bound afresh.
enum class Listeners { kBound, kHandedOver, kFromSystemd };

// The addresses of `listeners` (keyed by Address::to_string(); another key is no address).
std::vector<Address> addresses_of(const InheritedListeners& listeners) {
  std::vector<Address> addresses;
  for (const auto& [identity, sockets] : listeners) {
    if (auto address = Address::parse(identity)) addresses.push_back(*address);
  }
  return addresses;
}

// Takes the listening sockets of the spindle serving at `predecessor` (a binary upgrade), or
// those systemd holds (socket activation), into `instance`, and their addresses into
// `flags.passed`. Unexpected (printed) when the predecessor could not hand them over.
std::expected<Listeners, std::string> inherit_listeners(
    Instance& instance, ServeFlags& flags, const std::optional<UniqueFd>& predecessor) {
  if (predecessor) {
    auto inherited = take_listeners(predecessor->get());
    if (!inherited) {
      return std::unexpected(
          fmt::format("taking over from {}: {}", flags.handover, inherited.error().message()));
    }
    log_info("taking over {} listener(s) from the spindle at {}", inherited->size(),
             flags.handover);
    flags.passed = addresses_of(*inherited);
    instance.inherit(std::move(*inherited));
    return Listeners::kHandedOver;
  }
  if (auto from_systemd = systemd::take_listeners(); !from_systemd.empty()) {
    // Socket activation: the listeners systemd holds, matched to the configuration by address.
    log_info("taking {} listening socket(s) from systemd", from_systemd.size());
    flags.passed = addresses_of(from_systemd);
    instance.inherit(std::move(from_systemd));
    return Listeners::kFromSystemd;
  }
  return Listeners::kBound;
}

// What the main thread watches while the workers serve: the signals, the configuration file
// (a change reloads it as SIGHUP does, once its contents differ), the handover point (an
// upgrade asked for) and, during an upgrade, the new process and its handover connection.
class MainLoop {
 public:
  MainLoop(Instance& instance, const ServeFlags& flags, int signal_fd)
      : instance_(instance),
        flags_(flags),
        exe_(current_executable(flags)),
        signal_fd_(signal_fd) {}

  // Opens the handover point (with --handover), where upgrades are asked for and listening
  // sockets handed over; a failure is logged, and the process serves on without it.
  void listen_for_upgrades() {
    if (flags_.handover.empty()) return;
    auto listening = HandoverPoint::listen(flags_.handover);
    if (!listening) {
      log_warn("{}: cannot listen for upgrades: {}", flags_.handover, listening.error().message());
    } else {
      point_ = std::move(*listening);
    }
  }

  // Watches the configuration file with `watch` (none: SIGHUP still reloads); `text` is the
  // file's contents as loaded.
  void watch_config(std::optional<ConfigWatch> watch, std::string text) {
    watch_ = std::move(watch);
    loaded_ = std::move(text);
  }

  // At start, waits for the first answers of the DNS names of `config` (up to `until`) while
  // reading the signals: a stop signal ends the wait (false: the process stops, unserved);
  // the others are served once the loop runs (a SIGHUP then reloads the file).
  bool wait_for_names(const Config& config, std::chrono::steady_clock::time_point until) {
    while (!instance_.wait_for_names(config, until, signal_fd_)) {
      signalfd_siginfo info{};
      if (::read(signal_fd_, &info, sizeof info) != sizeof info) continue;
      int signo = static_cast<int>(info.ssi_signo);
      if (signo != SIGHUP && signo != SIGUSR1 && signo != SIGUSR2) {
        signo_ = signo;
        return false;
      }
      if (std::ranges::find(deferred_, signo) == deferred_.end()) deferred_.push_back(signo);
    }
    return true;
  }

  // The stop signal that ended wait_for_names().
  int stop_signal() const { return signo_; }

  // Runs until a stop signal (its number) or until a new process took over (0); then the
  // handover point is closed (the new process listens there now, or nobody will).
  int run() {
    for (int signo : deferred_) serve_signal(signo);
    deferred_.clear();
    while (signo_ == 0 && !handed_over_) turn();
    point_.reset();
    return signo_;
  }

 private:
  // A reload waiting for the first answers of the DNS names it brings.
  struct PendingReload {
    Config config;                                ///< the configuration to put in force
    std::string why;                              ///< what asked for it, for the log
    std::chrono::steady_clock::time_point until;  ///< when it goes in force regardless
  };

  // One wait for anything watched, at most a second, and what came.
  void turn() {
    pollfd fds[5] = {{.fd = signal_fd_, .events = POLLIN, .revents = 0},
                     {.fd = watch_ ? watch_->fd() : -1, .events = POLLIN, .revents = 0},
                     {.fd = point_ ? point_->fd() : -1, .events = POLLIN, .revents = 0},
                     {.fd = handing_over_.get(), .events = POLLIN, .revents = 0},
                     {.fd = instance_.dns_fd(), .events = POLLIN, .revents = 0}};
    // Every second at least, the admin listener's view of the listeners is brought up to date.
    int wait_ms = 1000;
    if (pending_) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(pending_->until -
                                                               std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::clamp<long>(left.count(), 0, wait_ms));
    }
    int ready = ::poll(fds, 5, wait_ms);
    instance_.refresh();
    instance_.rediscover();
    finish_pending_reload();
    check_successor();
    if (ready <= 0) return;  // the second passed, or EINTR
    if (fds[1].revents != 0) on_config_changed();
    if (fds[2].revents != 0) on_handover_point();
    if (fds[3].revents != 0) on_successor_answer();
    if (fds[0].revents != 0) on_signal();
  }

  // A new process that exited before it took over: this one serves on.
  void check_successor() {
    int status = 0;
    if (successor_ == 0 || ::waitpid(successor_, &status, WNOHANG) != successor_) return;
    log_error("upgrade: the new process exited ({}) before taking over; this one serves on",
              WIFEXITED(status) ? fmt::format("code {}", WEXITSTATUS(status))
                                : fmt::format("signal {}", WTERMSIG(status)));
    successor_ = 0;
    handing_over_.reset();
  }

  // The file changed: once a complete new version is there (its writer closed it, or it was
  // renamed into place) and its contents differ from the last loaded, it is reloaded.
  void on_config_changed() {
    ConfigWatch::Change change = settle(*watch_, watch_->consume());
    if (change != ConfigWatch::Change::kComplete) return;  // a writer has it: its close comes
    watch_->follow();
    const char* why = sighup_waits_ ? "SIGHUP" : "file changed";
    std::string text;
    try {
      text = proxy::read_config_file(flags_.config);
    } catch (const ConfigError& e) {
      sighup_waits_ = false;
      systemd::notify(systemd::reloading());
      return rejected(why, e.what());
    }
    if (text == loaded_ && !sighup_waits_) return;
    sighup_waits_ = false;
    loaded_ = text;
    reload(why, &text);
  }

  // Reads the configuration again (`text`: the file's contents as read; the built-in one
  // without --config) and puts it in force, or logs why not (the one in force stays). A
  // configuration that brings DNS names waits for their first answers first — in turn(), up
  // to twice dns.timeout (an SRV name, then the hosts it names) — while signals are served.
  // systemd is told it reloads, then ready again (whatever the outcome: the configuration in
  // force serves).
  void reload(std::string_view why, const std::string* text) {
    systemd::notify(systemd::reloading());
    pending_.reset();  // a newer version replaces the one waiting, whatever becomes of it
    Config config;
    try {
      config = effective_config(flags_, text);
    } catch (const ConfigError& e) {
      return rejected(why, e.what());
    }
    if (instance_.names_ready(config)) return put_in_force(std::move(config), why);
    auto wait = 2 * config.dns.timeout + std::chrono::milliseconds(200);
    log_info("reload ({}): waiting up to {} ms for the first answers of the DNS names it brings",
             why, wait.count());
    pending_ =
        PendingReload{std::move(config), std::string(why), std::chrono::steady_clock::now() + wait};
  }

  // The pending reload, once its names are answered or its time is up.
  void finish_pending_reload() {
    if (!pending_) return;
    if (!instance_.names_ready(pending_->config) &&
        std::chrono::steady_clock::now() < pending_->until) {
      return;
    }
    PendingReload pending = std::move(*pending_);
    pending_.reset();
    put_in_force(std::move(pending.config), pending.why);
  }

  void put_in_force(Config config, std::string_view why) {
    std::size_t routes = config.routes.size();
    if (auto applied = instance_.apply(std::move(config)); !applied) {
      return rejected(why, applied.error());
    }
    instance_.reloads().succeeded.fetch_add(1, std::memory_order_relaxed);
    log_info("reload ({}): configuration from {} in force ({} routes)", why,
             flags_.config.empty() ? "(built-in configuration)" : flags_.config, routes);
    systemd::notify("READY=1\n" + status_line(instance_, "reloaded; serving "));
  }

  void rejected(std::string_view why, std::string_view error) {
    // Discovery goes back to the names in force (a reload waiting had added its own).
    pending_.reset();
    (void)instance_.names_ready(instance_.config());
    instance_.reloads().failed.fetch_add(1, std::memory_order_relaxed);
    log_error("reload ({}) rejected: {}; the configuration in force stays", why, error);
    systemd::notify("READY=1\n" + status_line(instance_, "reload rejected; serving "));
  }

  // `spindle upgrade` asks for an upgrade; the new process asks for the listening sockets.
  void on_handover_point() {
    auto connection = point_->accept();
    if (!connection) return;
    std::string asked = receive_message(connection->get(), 1000);
    if (asked == "upgrade") {
      (void)send_message(connection->get(), upgrade_now());
    } else if (asked == "listeners" && !handing_over_) {
      if (send_listeners(connection->get(), instance_.listener_fds())) {
        handing_over_ = std::move(*connection);
      }
    }
  }

  // The new process serves ("ready"), or went away before it did.
  void on_successor_answer() {
    if (receive_message(handing_over_.get(), 0) == "ready") {
      handed_over_ = true;
    } else {
      log_error("upgrade: the new process went away before serving; this one serves on");
      handing_over_.reset();
    }
  }

  void on_signal() {
    signalfd_siginfo info{};
    if (::read(signal_fd_, &info, sizeof info) != sizeof info) return;
    serve_signal(static_cast<int>(info.ssi_signo));
  }

  void serve_signal(int signo) {
    if (signo == SIGHUP) {
      on_sighup();
    } else if (signo == SIGUSR1) {
      // logrotate's "reopen" (as nginx and Envoy take it): the files were renamed.
      instance_.reopen_logs();
      log_info("SIGUSR1: access log files opened again");
    } else if (signo == SIGUSR2) {
      std::string outcome = upgrade_now();
      if (outcome.starts_with("error ")) log_error("upgrade (SIGUSR2): {}", outcome.substr(6));
    } else {
      signo_ = signo;
    }
  }

  // SIGHUP reloads whatever the file holds now, once it is whole: while the watch sees a writer
  // holding it (modified in place, not closed since), the reload waits for that close, as a
  // change seen by the watch does (a half-written file can drop a route's auth).
  void on_sighup() {
    if (flags_.config.empty()) return reload("SIGHUP", nullptr);
    if (watch_ && settle(*watch_, watch_->consume()) == ConfigWatch::Change::kWriting) {
      sighup_waits_ = true;
      log_warn(
          "SIGHUP: {} is being written (its writer has it open): reloading once it is "
          "closed",
          flags_.config);
      return;
    }
    sighup_waits_ = false;
    if (watch_) watch_->follow();
    std::string text;
    try {
      text = proxy::read_config_file(flags_.config);
    } catch (const ConfigError& e) {
      systemd::notify(systemd::reloading());
      return rejected("SIGHUP", e.what());
    }
    loaded_ = text;
    reload("SIGHUP", &text);
  }

  // Starts the replacement process: "started PID", or "error WHY".
  std::string upgrade_now() {
    if (!point_) return "error serve was started without --handover PATH";
    if (successor_ != 0) return "error an upgrade is under way already";
    auto pid = start_replacement(exe_, flags_.argv);
    if (!pid) return "error " + pid.error();
    successor_ = *pid;
    log_info("upgrade: started {} (PID {}); it takes the listening sockets over", exe_, *pid);
    return fmt::format("started {}", *pid);
  }

  Instance& instance_;
  const ServeFlags& flags_;
  const std::string exe_;                 // the binary an upgrade starts
  const int signal_fd_;                   // the signalfd of the signals the process handles
  std::optional<HandoverPoint> point_;    // where upgrades are asked for (with --handover)
  std::optional<ConfigWatch> watch_;      // the configuration file's folder (with --config)
  std::string loaded_;                    // the file's text as last loaded
  std::optional<PendingReload> pending_;  // a reload waiting for DNS answers
  pid_t successor_ = 0;                   // the replacement process started, until it serves
  UniqueFd handing_over_;                 // its handover connection, once it asked
  int signo_ = 0;                         // the stop signal received
  std::vector<int> deferred_;             // signals received while start waited for names
  bool handed_over_ = false;              // the replacement serves: this process drains
  bool sighup_waits_ = false;             // a SIGHUP came while a writer had the file open
};

// Drains and stops: after a stop signal (`signo`), or after a new process took over (0).
void stop(Instance& instance, int signo, Listeners listeners) {
  const bool handed_over = signo == 0;
  if (handed_over) {
    log_info("upgrade: the new process serves; this one drains (up to {} ms) and exits",
             instance.config().drain_timeout.count());
  } else {
    systemd::notify(fmt::format("STOPPING=1\nSTATUS=draining (up to {} ms)",
                                instance.config().drain_timeout.count()));
    log_info("{}: stopping; requests in flight have {} ms to finish", strsignal(signo),
             instance.config().drain_timeout.count());
  }
  // After a handover, clients of idle connections may be sending right now: they get two
  // seconds to, and their next response says Connection: close. The same when systemd holds
  // the sockets: a stop is then most likely a restart, and a client whose connection was
  // accepted just before it must not see it closed unanswered.
  auto gentle = handed_over || listeners == Listeners::kFromSystemd
                    ? std::chrono::milliseconds(2000)
                    : std::chrono::milliseconds(0);
  if (!instance.shutdown(gentle)) log_warn("drain time over: closing the remaining connections");
}

}  // namespace

namespace {

// The watch on the configuration file (with --config), or nothing (logged).
std::optional<ConfigWatch> watch_file(const ServeFlags& flags) {
  if (flags.config.empty()) return std::nullopt;
  auto opened = ConfigWatch::open(flags.config);
  if (opened) return std::move(*opened);
  log_warn("{}: cannot watch for changes ({}): reload with SIGHUP", flags.config,
           opened.error().message());
  return std::nullopt;
}

}  // namespace

int serve(const ServeFlags& command_line) {
  ServeFlags flags = command_line;  // and, once taken, where the sockets passed listen
  // The watch before the file is read: a change made after the read is seen.
  std::optional<ConfigWatch> watch = watch_file(flags);
  std::string text;
  Config config;
  try {
    if (!flags.config.empty()) text = proxy::read_config_file(flags.config);
    config = effective_config(flags, flags.config.empty() ? nullptr : &text);
  } catch (const ConfigError& e) {
    fmt::print(stderr, "spindle: {}\n", e.what());
    return 1;
  }
  // Before the runtime, so that its threads inherit the blocked mask.
  SignalSet signals{SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2};
  auto signal_fd = signals.open_fd();
  if (!signal_fd) {
    fmt::print(stderr, "spindle: signalfd: {}\n", signal_fd.error().message());
    return 1;
  }
  if (config.huge_page_stacks) warn_if_no_huge_pages();
  Runtime runtime(
      RuntimeOptions{.workers = config.threads, .huge_page_stacks = config.huge_page_stacks});
  runtime.start();
  Instance instance(runtime);
  MainLoop loop(instance, flags, signal_fd->get());

  // A spindle serving at the handover point hands its listening sockets over.
  std::optional<UniqueFd> predecessor;
  if (!flags.handover.empty()) predecessor = connect_handover(flags.handover);
  auto listeners = inherit_listeners(instance, flags, predecessor);
  if (!listeners) {
    fmt::print(stderr, "spindle: {}\n", listeners.error());
    return 1;
  }
  if (serves_where_passed(flags)) {
    log_info("no address configured: the built-in server listens on the socket(s) passed");
    config = effective_config(flags);
  }
  // The handover point is open before anyone is told the servers listen (their "listening"
  // lines, READY=1), so that whoever saw them can upgrade at once; a predecessor keeps the path
  // until it has handed over, so a process taking over holds its lines back until then.
  if (predecessor) {
    instance.hold_listening_lines();
  } else {
    loop.listen_for_upgrades();
  }
  // The first answers of the DNS names, all asked at once in the background, bounded as a
  // reload's wait is; a stop signal meanwhile stops the process at once, nothing served.
  if (!loop.wait_for_names(config, std::chrono::steady_clock::now() + 2 * config.dns.timeout +
                                       std::chrono::milliseconds(200))) {
    log_info("{}: stopping before serving (waiting for the first DNS answers)",
             strsignal(loop.stop_signal()));
    return 0;  // a predecessor sees the connection close, and serves on
  }
  if (auto started = instance.apply(std::move(config)); !started) {
    fmt::print(stderr, "spindle: {}\n", started.error());
    return 1;  // the predecessor sees the connection close, and serves on
  }
  if (predecessor) {
    (void)send_message(predecessor->get(), "ready");
    predecessor.reset();
    loop.listen_for_upgrades();
    instance.release_listening_lines();
    // Under systemd (NotifyAccess=all), this process is the service's main one from now on.
    systemd::notify(fmt::format("MAINPID={}", ::getpid()));
  }
  systemd::notify("READY=1\n" + status_line(instance, "serving "));
  loop.watch_config(std::move(watch), std::move(text));
  stop(instance, loop.run(), *listeners);
  return 0;
}

}  // namespace spindle::app
