#pragma once
// Delivering bytes to a peer in pieces a test chooses, as a network may: each piece is written
// only once the peer has read everything before it, so that the peer's reads see exactly those
// pieces. Over AF_UNIX stream sockets, where SIOCOUTQ counts what the peer has not read yet
// (over TCP it counts what the peer's kernel has not acknowledged, which says nothing about
// the reader).
//
// segmentations() lists the ways to cut a message: whole, one byte per read, in two at every
// offset (so every head, chunk-size line and field is split everywhere), and random cuts.

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace spindle::testing {

/// One way of cutting a message: its pieces, in order, and a name for failure messages.
struct Segmentation {
  std::string name;
  std::vector<std::string_view> pieces;
};

/// The ways a network may cut `message` into reads: whole; one byte per read (if
/// `message.size() <= max_bytewise`); in two at every offset in [from, to) (every offset by
/// default); and `random` random cuts into 2 to 12 pieces (seeded: the same list each run).
inline std::vector<Segmentation> segmentations(std::string_view message, int random = 32,
                                               std::size_t max_bytewise = 1 << 16,
                                               std::size_t from = 1,
                                               std::size_t to = std::string_view::npos) {
  std::vector<Segmentation> out;
  out.push_back({"whole", {message}});
  if (message.size() > 1 && message.size() <= max_bytewise) {
    Segmentation bytes{"one byte per read", {}};
    for (std::size_t i = 0; i < message.size(); ++i) bytes.pieces.push_back(message.substr(i, 1));
    out.push_back(std::move(bytes));
  }
  to = std::min(to, message.size());
  for (std::size_t at = from; at < to; ++at) {
    out.push_back({"split at " + std::to_string(at), {message.substr(0, at), message.substr(at)}});
  }
  std::mt19937 rng(static_cast<unsigned>(message.size()));
  for (int r = 0; r < random && message.size() > 2; ++r) {
    std::uniform_int_distribution<std::size_t> count_of(2, 12), offset(1, message.size() - 1);
    std::vector<std::size_t> cuts;
    for (std::size_t n = count_of(rng); n > 1; --n) cuts.push_back(offset(rng));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    Segmentation s{"random cuts #" + std::to_string(r), {}};
    std::size_t last = 0;
    for (std::size_t cut : cuts) {
      s.pieces.push_back(message.substr(last, cut - last));
      last = cut;
    }
    s.pieces.push_back(message.substr(last));
    out.push_back(std::move(s));
  }
  return out;
}

/// Waits until the peer of AF_UNIX stream socket `fd` has read everything written to it, or
/// `patience` passes (a peer that stops reading is not waited for); false then.
inline bool wait_until_read(int fd, std::chrono::milliseconds patience) {
  auto until = std::chrono::steady_clock::now() + patience;
  for (;;) {
    int queued = 0;
    if (::ioctl(fd, SIOCOUTQ, &queued) != 0 || queued == 0) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

/// Writes every byte of `data` to blocking socket `fd`; false on error.
inline bool write_fully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

/// Writes `pieces` to AF_UNIX stream socket `fd` (blocking), each once the peer has read all
/// before it; false if a write failed.
inline bool write_pieces(int fd, const std::vector<std::string_view>& pieces,
                         std::chrono::milliseconds patience = std::chrono::seconds(2)) {
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) (void)wait_until_read(fd, patience);
    if (!write_fully(fd, pieces[i])) return false;
  }
  return true;
}

/// A blocking AF_UNIX stream socket connected to `path`, or -1.
inline int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// A fresh path for a Unix socket under /tmp, unique to this process and `tag`.
inline std::string unix_socket_path(std::string_view tag) {
  static int next = 0;
  return "/tmp/spindle-" + std::string(tag) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(next++) + ".sock";
}

}  // namespace spindle::testing
