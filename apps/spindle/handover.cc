#include "handover.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace spindle::app {
namespace {

constexpr int kAnswerTimeoutMs = 5000;

Result<sockaddr_un> unix_address(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof address.sun_path) {
    return fail(std::make_error_code(std::errc::filename_too_long));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

}  // namespace

Result<HandoverPoint> HandoverPoint::listen(const std::string& path) {
  auto address = unix_address(path);
  if (!address) return fail(address.error());
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) return fail_errno();
  ::unlink(path.c_str());  // a socket left by the process this one replaced, or a crash
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*address), sizeof *address) != 0 ||
      ::listen(fd.get(), 4) != 0) {
    return fail_errno();
  }
  return HandoverPoint(std::move(fd));
}

Result<UniqueFd> HandoverPoint::accept() const {
  UniqueFd fd(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!fd) return fail_errno();
  return fd;
}

std::string receive_message(int fd, int timeout_ms) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  int ready;
  while ((ready = ::poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  if (ready <= 0) return "";
  char buffer[4096];
  ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
}

bool send_message(int fd, std::string_view text, int attached) {
  iovec part{const_cast<char*>(text.data()), text.size()};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (attached >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &attached, sizeof(int));
  }
  ssize_t n;
  while ((n = ::sendmsg(fd, &message, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  return n == static_cast<ssize_t>(text.size());
}

bool send_listeners(int fd, const std::map<std::string, std::vector<int>>& listeners) {
  for (const auto& [identity, fds] : listeners) {
    for (int listener : fds) {
      if (!send_message(fd, "fd " + identity, listener)) return false;
    }
  }
  return send_message(fd, "end");
}

std::optional<UniqueFd> connect_handover(const std::string& path) {
  auto address = unix_address(path);
  if (!address) return std::nullopt;
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) return std::nullopt;
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*address), sizeof *address) != 0) {
    return std::nullopt;  // no file, or nobody listening on it (a stale one)
  }
  return fd;
}

Result<InheritedListeners> take_listeners(int fd) {
  if (!send_message(fd, "listeners")) return fail_errno();
  InheritedListeners listeners;
  for (;;) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, kAnswerTimeoutMs) <= 0) {
      return fail(std::make_error_code(std::errc::timed_out));
    }
    char buffer[4096];
    iovec part{buffer, sizeof buffer};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
    if (n <= 0) return fail(std::make_error_code(std::errc::connection_aborted));
    std::string text(buffer, static_cast<std::size_t>(n));
    if (text == "end") return listeners;
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    if (!text.starts_with("fd ") || header == nullptr || header->cmsg_type != SCM_RIGHTS) {
      return fail(std::make_error_code(std::errc::protocol_error));
    }
    int received = -1;
    std::memcpy(&received, CMSG_DATA(header), sizeof(int));
    listeners[text.substr(3)].emplace_back(received);
  }
}

}  // namespace spindle::app
