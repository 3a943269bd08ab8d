#include "systemd.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <ctime>

#include "spindle/base/log.h"
#include "spindle/net/address.h"

namespace spindle::app::systemd {
namespace {

constexpr int kFirstFd = 3;  // SD_LISTEN_FDS_START

template <typename T>
bool parse_number(std::string_view text, T& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

bool notify(std::string_view state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  std::string_view where = path;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (where.size() >= sizeof address.sun_path || (where[0] != '/' && where[0] != '@')) {
    log_warn("NOTIFY_SOCKET={}: not a socket path: systemd is not told", where);
    return false;
  }
  where.copy(address.sun_path, where.size());
  if (where[0] == '@') address.sun_path[0] = '\0';  // the abstract namespace
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + where.size());
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  // Never waited for: a service manager that does not read its socket cannot hold a reload
  // or a shutdown (the message is lost, and said).
  ssize_t sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
                          reinterpret_cast<const sockaddr*>(&address), length);
  int error = errno;
  ::close(fd);
  if (sent != static_cast<ssize_t>(state.size())) {
    log_warn("NOTIFY_SOCKET={}: {}", where, std::strerror(error));
    return false;
  }
  return true;
}

std::string reloading() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return fmt::format("RELOADING=1\nMONOTONIC_USEC={}",
                     static_cast<long long>(now.tv_sec) * 1'000'000 + now.tv_nsec / 1000);
}

InheritedListeners take_listeners() {
  InheritedListeners out;
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  if (pid == nullptr || fds == nullptr) return out;
  pid_t for_pid = 0;
  int count = 0;
  bool ours = parse_number(pid, for_pid) && for_pid == ::getpid();
  bool valid = parse_number(std::string_view(fds), count) && count >= 0 && count < 4096;
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  if (!ours) return out;  // meant for another process (a parent's, left in the environment)
  if (!valid) {
    log_warn("LISTEN_FDS={}: not a count: no socket taken from systemd", fds);
    return out;
  }
  for (int fd = kFirstFd; fd < kFirstFd + count; ++fd) {
    UniqueFd socket(fd);
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    int listening = 0;
    socklen_t size = sizeof listening;
    sockaddr_storage storage{};
    socklen_t length = sizeof storage;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || !listening ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
      log_warn("systemd passed descriptor {}, which is not a listening socket: closed", fd);
      continue;
    }
    auto address = Address::from_sockaddr(reinterpret_cast<const sockaddr*>(&storage), length);
    if (!address) {
      log_warn("systemd passed descriptor {}, of an address spindle does not serve: closed", fd);
      continue;
    }
    out[address->to_string()].push_back(std::move(socket));
  }
  return out;
}

}  // namespace spindle::app::systemd
