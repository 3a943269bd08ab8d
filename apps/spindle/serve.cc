#include "serve.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "config_watch.h"
#include "instance.h"
#include "spindle/base/log.h"
#include "spindle/fiber/runtime.h"
#include "spindle/net/signal_set.h"
#include "spindle/proxy/config.h"

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

Config effective_config(const ServeFlags& flags) {
  Config config = flags.config.empty() ? parse_config(kDefaultConfig, "(built-in configuration)")
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
  return config;
}

}  // namespace

int check_config(const std::string& file) {
  try {
    Config config = load_config(file);
    auto count = [](std::size_t n, std::string_view what) {
      return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s");
    };
    fmt::print("{}: ok ({}, {}, {}, {})\n", file, count(config.servers.size(), "server"),
               count(config.routes.size(), "route"), count(config.services.size(), "service"),
               count(config.upstreams.size(), "upstream"));
    return 0;
  } catch (const ConfigError& e) {
    fmt::print(stderr, "spindle: {}\n", e.what());
    return 1;
  }
}

namespace {

// The whole text of `file` ("" if it cannot be read).
std::string read_text(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Loads the configuration again and puts it in force, or logs why not (the one in force
// stays). `why`: what asked for it, for the log.
void reload(Instance& instance, const ServeFlags& flags, std::string_view why) {
  Config config;
  try {
    config = effective_config(flags);
  } catch (const ConfigError& e) {
    instance.reloads().failed.fetch_add(1, std::memory_order_relaxed);
    log_error("reload ({}) rejected: {}; the configuration in force stays", why, e.what());
    return;
  }
  std::size_t routes = config.routes.size();
  if (auto applied = instance.apply(std::move(config)); !applied) {
    instance.reloads().failed.fetch_add(1, std::memory_order_relaxed);
    log_error("reload ({}) rejected: {}; the configuration in force stays", why, applied.error());
    return;
  }
  instance.reloads().succeeded.fetch_add(1, std::memory_order_relaxed);
  log_info("reload ({}): configuration from {} in force ({} routes)", why,
           flags.config.empty() ? "(built-in configuration)" : flags.config, routes);
}

// Waits until `fd` is readable or `timeout_ms` passes (-1: for ever); true if readable.
bool readable(int fd, int timeout_ms) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  int n;
  while ((n = ::poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  return n > 0;
}

// After a change in the configuration's folder, waits until it has been quiet for 50 ms (an
// editor or a ConfigMap update is several events), at most a second.
void settle(ConfigWatch& watch) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < until && readable(watch.fd(), 50)) watch.consume();
}

}  // namespace

int serve(const ServeFlags& flags) {
  Config config;
  try {
    config = effective_config(flags);
  } catch (const ConfigError& e) {
    fmt::print(stderr, "spindle: {}\n", e.what());
    return 1;
  }
  // Before the runtime, so that its threads inherit the blocked mask.
  SignalSet signals{SIGINT, SIGTERM, SIGQUIT, SIGHUP};
  auto signal_fd = signals.open_fd();
  if (!signal_fd) {
    fmt::print(stderr, "spindle: signalfd: {}\n", signal_fd.error().message());
    return 1;
  }
  Runtime runtime(RuntimeOptions{.workers = config.threads});
  runtime.start();
  Instance instance(runtime);
  if (auto started = instance.apply(std::move(config)); !started) {
    fmt::print(stderr, "spindle: {}\n", started.error());
    return 1;
  }

  // The file is watched too: a change reloads it as SIGHUP does (once its contents differ).
  std::optional<ConfigWatch> watch;
  std::string loaded;
  if (!flags.config.empty()) {
    auto opened = ConfigWatch::open(flags.config);
    if (opened) {
      watch = std::move(*opened);
      loaded = read_text(flags.config);
    } else {
      log_warn("{}: cannot watch for changes ({}): reload with SIGHUP", flags.config,
               opened.error().message());
    }
  }

  // The main thread waits for signals and file changes; the workers serve.
  int signo = 0;
  while (signo == 0) {
    pollfd fds[2] = {{.fd = signal_fd->get(), .events = POLLIN, .revents = 0},
                     {.fd = watch ? watch->fd() : -1, .events = POLLIN, .revents = 0}};
    // Every second at least, the admin listener's view of the listeners is brought up to date.
    int ready = ::poll(fds, 2, 1000);
    instance.refresh();
    if (ready <= 0) continue;  // the second passed, or EINTR
    if (fds[1].revents != 0) {
      watch->consume();
      settle(*watch);
      std::string text = read_text(flags.config);
      if (text != loaded) {
        loaded = std::move(text);
        reload(instance, flags, "file changed");
      }
    }
    if (fds[0].revents != 0) {
      signalfd_siginfo info{};
      if (::read(signal_fd->get(), &info, sizeof info) != sizeof info) continue;
      if (info.ssi_signo == SIGHUP) {
        if (watch) loaded = read_text(flags.config);
        reload(instance, flags, "SIGHUP");
      } else {
        signo = static_cast<int>(info.ssi_signo);
      }
    }
  }
  log_info("{}: stopping; requests in flight have {} ms to finish", strsignal(signo),
           instance.config().drain_timeout.count());
  if (!instance.shutdown()) log_warn("drain time over: closing the remaining connections");
  return 0;
}

}  // namespace spindle::app
