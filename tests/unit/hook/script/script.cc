// The differential test's calls (script.h). A script holds a few socket descriptors (Unix
// stream, datagram and seqpacket pairs, TCP pairs on the loopback) and their duplicates, and
// at each step makes one call chosen by the seed: reads and writes of every form and size
// with MSG_DONTWAIT/MSG_WAITALL/MSG_PEEK, O_NONBLOCK set and cleared (fcntl, FIONBIO),
// timeouts, dup/dup2/dup3/F_DUPFD, closes seen and unseen by the hooks (close, fclose of
// fdopen, close_range, the bare system call) after which numbers are reused, a close from
// another thread (before a call, and under one in progress), stdio on a duplicate, poll,
// connects that succeed or are refused.
//
// A model of each socket (bytes on their way in and out, its flags as the script set them)
// says when a call would wait: then a helper thread makes it end the way a blocking call
// ends (the peer writes after a while, or reads everything), or a timeout does. Descriptor
// numbers are written relative to the lowest one free at the start (the hooked binary has its
// runtime's below it), and received data as a hash of its bytes.
#include "script.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace spindle::hook_script {
namespace {

using namespace std::chrono_literals;

enum class Kind { kUnixStream, kUnixDatagram, kUnixSeqPacket, kTcp };

const char* name_of(Kind kind) {
  switch (kind) {
    case Kind::kUnixStream:
      return "unix-stream";
    case Kind::kUnixDatagram:
      return "unix-dgram";
    case Kind::kUnixSeqPacket:
      return "unix-seqpacket";
    case Kind::kTcp:
      return "tcp";
  }
  return "?";
}

// One open file description of the script's (a socket), as the script believes it is.
struct File {
  Kind kind = Kind::kUnixStream;
  int peer = -1;                  // the other end, the helpers' side
  int references = 0;             // the script's descriptors of it
  bool nonblocking = false;       // O_NONBLOCK as the script set it
  bool receive_timeout = false;   // SO_RCVTIMEO set (kTimeout)
  bool send_timeout = false;      // SO_SNDTIMEO set
  bool peer_shut = false;         // the peer shut its sending side
  std::size_t in = 0;             // stream bytes sent by the peer, not read yet
  std::deque<std::size_t> grams;  // datagrams sent by the peer, not read yet (sizes)
  std::size_t out = 0;            // stream bytes sent to the peer, not read by it yet
  std::size_t grams_out = 0;      // datagrams sent to the peer, not read by it yet
  std::uint64_t peer_offset = 0;  // bytes the peer sent so far (their pattern's offset)
  std::uint64_t offset = 0;       // bytes the script sent so far
  bool stream() const { return kind == Kind::kUnixStream || kind == Kind::kTcp; }
};

constexpr int kTimeoutMs = 100;  // SO_RCVTIMEO / SO_SNDTIMEO when set
constexpr int kLaterMs = 5;      // how long a helper waits before it writes

// The byte at `offset` of what one side of a socket sends.
char pattern_at(std::uint64_t offset) {
  return static_cast<char>((offset * 7 + offset / 251) & 0xff);
}

std::vector<char> pattern(std::uint64_t offset, std::size_t size) {
  std::vector<char> data(size);
  for (std::size_t i = 0; i < size; ++i) data[i] = pattern_at(offset + i);
  return data;
}

std::uint64_t hash_of(const char* data, std::size_t size) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < size; ++i)
    h = (h ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
  return h;
}

// Sends all of `data` on `fd` (a helper's blocking sends).
void send_all(int fd, const std::vector<char>& data, bool datagram) {
  std::size_t at = 0;
  while (at < data.size() || (datagram && at == 0 && data.empty())) {
    ssize_t n = ::send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<std::size_t>(n);
    if (datagram) return;
  }
}

// Reads `count` stream bytes (or `count` datagrams) from `fd`, giving up after 3 s without
// any; what it got.
std::size_t drain(int fd, std::size_t count, bool datagrams) {
  std::vector<char> buffer(256 * 1024);
  std::size_t got = 0;
  while (got < count) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 3000) <= 0) break;
    ssize_t n = ::recv(fd, buffer.data(),
                       datagrams ? buffer.size() : std::min(buffer.size(), count - got), 0);
    if (n <= 0) break;
    got += datagrams ? 1 : static_cast<std::size_t>(n);
  }
  return got;
}

class Script {
 public:
  Script(std::uint64_t seed, std::FILE* out) : random_(seed), out_(out) {
    int probe = ::open("/dev/null", O_RDONLY);
    base_ = probe;
    ::close(probe);
  }
  ~Script() {
    for (auto& [fd, file] : held_) ::close(fd);
    for (File& f : files_) {
      if (f.references > 0) ::close(f.peer);
    }
  }

  void step(int index) {
    index_ = index;
    if (held_.empty() || (held_.size() < 3 && chance(10))) return open_pair();
    switch (pick({8, 10, 5, 6, 8, 6, 3, 24, 18, 6, 2, 4, 4, 2, 2, 2, 3})) {
      case 0:
        return open_pair();
      case 1:
        return close_one();
      case 2:
        return close_unseen();
      case 3:
        return duplicate();
      case 4:
        return set_flags();
      case 5:
        return look_at_flags();
      case 6:
        return set_timeout();
      case 7:
        return read_one();
      case 8:
        return write_one();
      case 9:
        return peer_sends();
      case 10:
        return peer_shuts();
      case 11:
        return poll_one();
      case 12:
        return close_elsewhere();
      case 13:
        return close_under_a_read();
      case 14:
        return stdio_write();
      case 15:
        return connect_refused();
      case 16:
        return open_pair();
    }
  }

 private:
  // ---- choosing ---------------------------------------------------------------------------

  int below(int n) { return static_cast<int>(random_() % static_cast<std::uint64_t>(n)); }
  bool chance(int percent) { return below(100) < percent; }
  int pick(std::initializer_list<int> weights) {
    int total = 0;
    for (int w : weights) total += w;
    int r = below(total), i = 0;
    for (int w : weights) {
      if (r < w) return i;
      r -= w;
      ++i;
    }
    return 0;
  }
  template <typename T>
  T one_of(std::initializer_list<T> choices) {
    return *(choices.begin() + below(static_cast<int>(choices.size())));
  }
  // A descriptor the script holds, and its file.
  std::pair<int, File*> any_fd() {
    auto it = held_.begin();
    std::advance(it, below(static_cast<int>(held_.size())));
    return {it->first, &files_[it->second]};
  }

  // ---- writing down -----------------------------------------------------------------------

  void line(const char* format, ...) {
    char text[512];
    va_list args;
    va_start(args, format);
    std::vsnprintf(text, sizeof text, format, args);
    va_end(args);
    std::fprintf(out_, "%d %s\n", index_, text);
    std::fflush(out_);
  }
  // A call's result: its value (a descriptor relative to the base when `fd`) and its errno.
  std::string result(long rc, int error, bool fd = false) {
    if (rc < 0) return "-1 " + std::string(strerrorname_np(error) ? strerrorname_np(error) : "?");
    return fd ? "fd+" + std::to_string(rc - base_) : std::to_string(rc);
  }
  int rel(int fd) const { return fd - base_; }

  // ---- descriptors ------------------------------------------------------------------------

  int add_file(Kind kind, int mine, int peer) {
    File f;
    f.kind = kind;
    f.peer = peer;
    f.references = 1;
    files_.push_back(f);
    held_[mine] = static_cast<int>(files_.size()) - 1;
    return mine;
  }

  // The script's descriptor `fd` is gone (closed, or replaced by dup2).
  void dropped(int fd) {
    auto it = held_.find(fd);
    if (it == held_.end()) return;
    File& f = files_[it->second];
    held_.erase(it);
    if (--f.references == 0) ::close(f.peer);
  }

  void open_pair() {
    if (held_.size() >= 12) return close_one();
    Kind kind = one_of({Kind::kUnixStream, Kind::kUnixStream, Kind::kUnixDatagram,
                        Kind::kUnixSeqPacket, Kind::kTcp, Kind::kTcp});
    if (kind == Kind::kTcp) return open_tcp();
    int type = kind == Kind::kUnixStream     ? SOCK_STREAM
               : kind == Kind::kUnixDatagram ? SOCK_DGRAM
                                             : SOCK_SEQPACKET;
    int fds[2];
    int rc = ::socketpair(AF_UNIX, type, 0, fds);
    int error = errno;
    if (rc != 0) return line("socketpair %s = %s", name_of(kind), result(rc, error).c_str());
    add_file(kind, fds[0], fds[1]);
    line("socketpair %s = fd+%d", name_of(kind), rel(fds[0]));
  }

  void open_tcp() {
    int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener, 4) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
      ::close(listener);
      return line("tcp listener failed");
    }
    int mine = ::socket(AF_INET, SOCK_STREAM, 0);
    int rc = ::connect(mine, reinterpret_cast<sockaddr*>(&address), sizeof address);
    int error = errno;
    int peer = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    if (rc != 0 || peer < 0) {
      ::close(mine);
      if (peer >= 0) ::close(peer);
      return line("tcp connect = %s", result(rc, error).c_str());
    }
    add_file(Kind::kTcp, mine, peer);
    line("tcp connect = 0 fd+%d", rel(mine));
  }

  void close_one() {
    auto [fd, f] = any_fd();
    int rc = ::close(fd);
    int error = errno;
    dropped(fd);
    line("close fd+%d = %s", rel(fd), result(rc, error).c_str());
  }

  // Closes where the hooks may not see it; the next socket made often takes the number.
  void close_unseen() {
    auto [fd, f] = any_fd();
    int how = below(3);
    int rc;
    if (how == 0) {
      FILE* stream = ::fdopen(fd, "r+");
      rc = stream == nullptr ? -1 : std::fclose(stream);
    } else if (how == 1) {
      rc = ::close_range(static_cast<unsigned>(fd), static_cast<unsigned>(fd), 0);
    } else {
      rc = static_cast<int>(::syscall(SYS_close, fd));
    }
    int error = errno;
    dropped(fd);
    line("close-%s fd+%d = %s",
         how == 0   ? "fclose"
         : how == 1 ? "range"
                    : "syscall",
         rel(fd), result(rc, error).c_str());
    if (chance(60)) open_pair();
  }

  void duplicate() {
    auto [fd, f] = any_fd();
    int file = held_[fd];
    int how = below(5);
    int target = -1;
    if (how == 1 || how == 2) {
      // Over another of the script's descriptors (which closes it), or onto a number past them.
      if (held_.size() > 1 && chance(50)) {
        target = any_fd().first;
      } else {
        target = base_ + 40 + below(8);
      }
      if (is_a_peer(target)) return look_at_flags();  // (the helpers' side is not the script's)
    }
    int rc;
    const char* name;
    switch (how) {
      case 0:
        name = "dup";
        rc = ::dup(fd);
        break;
      case 1:
        name = "dup2";
        rc = ::dup2(fd, target);
        break;
      case 2:
        name = "dup3-cloexec";
        rc = target == fd ? ::dup2(fd, target) : ::dup3(fd, target, O_CLOEXEC);
        break;
      case 3:
        name = "F_DUPFD";
        rc = ::fcntl(fd, F_DUPFD, base_ + below(20));
        break;
      default:
        name = "F_DUPFD_CLOEXEC";
        rc = ::fcntl(fd, F_DUPFD_CLOEXEC, base_ + below(20));
        break;
    }
    int error = errno;
    if (rc >= 0 && rc != fd) {
      dropped(rc);  // (dup2 over one of the script's)
      held_[rc] = file;
      ++files_[file].references;
    }
    int descriptor_flags = rc >= 0 ? ::fcntl(rc, F_GETFD) : -2;
    line("%s fd+%d (target %d) = %s cloexec=%d", name, rel(fd), target < 0 ? -1 : rel(target),
         result(rc, error, true).c_str(), descriptor_flags);
  }

  bool is_a_peer(int fd) const {
    for (const File& f : files_) {
      if (f.references > 0 && f.peer == fd) return true;
    }
    return false;
  }

  void set_flags() {
    auto [fd, f] = any_fd();
    bool on = chance(50);
    int rc;
    if (chance(50)) {
      int flags = ::fcntl(fd, F_GETFL);
      rc = ::fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK);
    } else {
      int value = on;
      rc = ::ioctl(fd, FIONBIO, &value);
    }
    int error = errno;
    if (rc == 0) f->nonblocking = on;
    line("nonblocking fd+%d %d = %s", rel(fd), on, result(rc, error).c_str());
  }

  void look_at_flags() {
    auto [fd, f] = any_fd();
    int flags = ::fcntl(fd, F_GETFL);
    int descriptor = ::fcntl(fd, F_GETFD);
    int queued = -1;
    if (f->stream()) settle(fd, *f);
    if (f->kind != Kind::kUnixDatagram && f->kind != Kind::kUnixSeqPacket) {
      ::ioctl(fd, FIONREAD, &queued);
    }
    line("flags fd+%d = %d %d queued %d", rel(fd), flags, descriptor, queued);
  }

  void set_timeout() {
    auto [fd, f] = any_fd();
    bool receive = chance(50), on = chance(60);
    timeval t{0, on ? kTimeoutMs * 1000 : 0};
    int rc = ::setsockopt(fd, SOL_SOCKET, receive ? SO_RCVTIMEO : SO_SNDTIMEO, &t, sizeof t);
    int error = errno;
    if (rc == 0) (receive ? f->receive_timeout : f->send_timeout) = on;
    line("timeout fd+%d %s %d = %s", rel(fd), receive ? "rcv" : "snd", on,
         result(rc, error).c_str());
  }

  // Waits until a TCP socket has all the model says was sent to it (the loopback delivers
  // soon, not at once): its reads are then the same each run.
  void settle(int fd, const File& f) {
    if (f.kind != Kind::kTcp) return;
    for (int i = 0; i < 2000; ++i) {
      int queued = 0;
      if (::ioctl(fd, FIONREAD, &queued) != 0) return;
      if (static_cast<std::size_t>(queued) >= f.in) {
        char c;
        // And the peer's end, once it shut down, is there to be seen.
        if (!f.peer_shut || f.in > 0 || ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) return;
      }
      std::this_thread::sleep_for(1ms);
    }
  }

  // ---- reads ------------------------------------------------------------------------------

  // Reads into `buffer` by read (how 0), recv (1), recvmsg (2), readv (3) or recvfrom (4);
  // `name` says which. recvmsg's msg_flags go into `flags`' upper half (written down).
  static ssize_t receive_by(int how, int fd, std::vector<char>& buffer, int& flags,
                            const char*& name) {
    std::size_t size = buffer.size();
    switch (how) {
      case 0:
        name = "read";
        return ::read(fd, buffer.data(), size);
      case 1:
        name = "recv";
        return ::recv(fd, buffer.data(), size, flags);
      case 3: {
        name = "readv";
        std::size_t half = size / 2;
        iovec parts[2] = {{buffer.data(), half}, {buffer.data() + half, size - half}};
        return ::readv(fd, parts, 2);
      }
      case 4: {
        name = "recvfrom";
        sockaddr_storage from{};
        socklen_t length = sizeof from;
        return ::recvfrom(fd, buffer.data(), size, flags, reinterpret_cast<sockaddr*>(&from),
                          &length);
      }
      default: {
        name = "recvmsg";
        std::size_t third = size / 3;
        iovec parts[2] = {{buffer.data(), third}, {buffer.data() + third, size - third}};
        msghdr m{};
        m.msg_iov = parts;
        m.msg_iovlen = 2;
        ssize_t n = ::recvmsg(fd, &m, flags);
        int error = errno;
        if (n >= 0) flags |= m.msg_flags << 16;
        errno = error;
        return n;
      }
    }
  }

  void read_one() {
    auto [fd, f] = any_fd();
    const int how = below(5);  // read, recv, recvmsg, readv, recvfrom
    const bool has_flags = how == 1 || how == 2 || how == 4;
    int flags = 0;
    if (has_flags) {
      flags = one_of<int>({0, 0, MSG_DONTWAIT, MSG_WAITALL, MSG_WAITALL, MSG_PEEK,
                           MSG_PEEK | MSG_WAITALL, MSG_WAITALL | MSG_DONTWAIT});
    }
    std::size_t size = one_of<std::size_t>({1, 7, 100, 4096, 70000});
    if (!f->stream()) size = one_of<std::size_t>({1, 100, 5000});
    const bool nonblocking = f->nonblocking || (flags & MSG_DONTWAIT) != 0;
    const bool peek = (flags & MSG_PEEK) != 0, all = (flags & MSG_WAITALL) != 0;
    // What the peer sends later, for a read that would otherwise wait for good.
    std::size_t later = 0;
    if (f->stream()) {
      std::size_t need = all && !(peek && f->kind != Kind::kTcp) ? size : 1;
      if (peek && all && f->kind != Kind::kTcp && f->in > 0) need = 1;
      if (!nonblocking && f->in < need && !f->peer_shut && !f->receive_timeout) {
        later = all ? need - f->in : 1 + static_cast<std::size_t>(below(4000));
      }
    } else if (!nonblocking && f->grams.empty() && !f->peer_shut && !f->receive_timeout) {
      later = 1 + static_cast<std::size_t>(below(4000));
    }
    settle(fd, *f);
    std::thread writer;
    if (later > 0) {
      auto data = pattern(f->peer_offset, later);
      if (f->stream()) {
        f->peer_offset += later;
        f->in += later;
      } else {
        f->grams.push_back(later);
        f->peer_offset += later;
      }
      writer = std::thread([peer = f->peer, data, datagram = !f->stream()] {
        std::this_thread::sleep_for(std::chrono::milliseconds(kLaterMs));
        send_all(peer, data, datagram);
      });
    }
    std::vector<char> buffer(size);
    const char* name = nullptr;
    ssize_t n = receive_by(how, fd, buffer, flags, name);
    int error = errno;
    if (writer.joinable()) writer.join();
    // The model follows what happened.
    if (n > 0 && !peek) {
      if (f->stream()) {
        f->in -= std::min<std::size_t>(f->in, static_cast<std::size_t>(n));
      } else if (!f->grams.empty()) {
        f->grams.pop_front();
      }
    }
    line("%s fd+%d size %zu flags %#x = %s hash %llx", name, rel(fd), size, flags,
         result(n, error).c_str(),
         static_cast<unsigned long long>(n > 0 ? hash_of(buffer.data(), static_cast<std::size_t>(n))
                                               : 0));
  }

  // ---- writes -----------------------------------------------------------------------------

  // Writes `data` by write (how 0), send (1), sendmsg (2), writev (3) or sendto (4).
  static ssize_t send_by(int how, int fd, std::vector<char>& data, int flags, const char*& name) {
    std::size_t size = data.size();
    switch (how) {
      case 0:
        name = "write";
        return ::write(fd, data.data(), size);
      case 1:
        name = "send";
        return ::send(fd, data.data(), size, flags);
      case 3: {
        name = "writev";
        std::size_t half = size / 2;
        iovec parts[2] = {{data.data(), half}, {data.data() + half, size - half}};
        return ::writev(fd, parts, 2);
      }
      case 4:
        name = "sendto";
        return ::sendto(fd, data.data(), size, flags, nullptr, 0);
      default: {
        name = "sendmsg";
        std::size_t third = size / 3;
        iovec parts[2] = {{data.data(), third}, {data.data() + third, size - third}};
        msghdr m{};
        m.msg_iov = parts;
        m.msg_iovlen = 2;
        return ::sendmsg(fd, &m, flags);
      }
    }
  }

  void write_one() {
    auto [fd, f] = any_fd();
    const int how = below(5);  // write, send, sendmsg, writev, sendto
    const bool has_flags = how == 1 || how == 2 || how == 4;
    int flags =
        has_flags ? one_of<int>({0, MSG_NOSIGNAL, MSG_DONTWAIT, MSG_DONTWAIT | MSG_NOSIGNAL}) : 0;
    std::size_t size = f->stream() ? one_of<std::size_t>({1, 100, 10000, 300000, 3 << 20})
                                   : one_of<std::size_t>({1, 100, 4000});
    const bool nonblocking = f->nonblocking || (flags & MSG_DONTWAIT) != 0;
    if (f->kind == Kind::kTcp && (nonblocking || f->send_timeout) && f->out + size > 4000) {
      size = 100;  // a TCP send that may not all fit depends on the peer's timing
      if (f->out + size > 4000) return look_at_flags();
    }
    // A helper that reads what was sent, for a write that would otherwise wait for good.
    bool drained = false;
    std::size_t expect = 0;
    if (!nonblocking) {
      if (f->stream() && f->out + size > (f->kind == Kind::kTcp ? 8000u : 65536u) &&
          !(f->send_timeout && f->kind == Kind::kUnixStream)) {
        drained = true;
        expect = f->out + size;
      } else if (!f->stream() && f->grams_out >= 8 && !f->send_timeout) {
        drained = true;
        expect = f->grams_out + 1;
      }
    }
    std::thread reader;
    std::size_t got = 0;
    if (drained) {
      reader = std::thread(
          [&, peer = f->peer, datagrams = !f->stream()] { got = drain(peer, expect, datagrams); });
    }
    auto data = pattern(f->offset, size);
    const char* name = nullptr;
    ssize_t n = send_by(how, fd, data, flags, name);
    int error = errno;
    if (reader.joinable()) reader.join();
    if (n > 0) f->offset += static_cast<std::size_t>(n);
    if (f->stream()) {
      if (n > 0) f->out += static_cast<std::size_t>(n);
      if (drained) f->out -= std::min(f->out, got);
    } else {
      if (n >= 0) ++f->grams_out;
      if (drained) f->grams_out -= std::min(f->grams_out, got);
    }
    line("%s fd+%d size %zu flags %#x = %s%s", name, rel(fd), size, flags, result(n, error).c_str(),
         drained ? (got == expect ? " drained" : " drained-short") : "");
  }

  void peer_sends() {
    auto [fd, f] = any_fd();
    if (f->peer_shut) return look_at_flags();
    std::size_t size = 1 + static_cast<std::size_t>(below(5000));
    if (f->stream() ? f->in + size > 30000 : f->grams.size() >= 8) return read_one();
    if (!f->stream()) size = std::min<std::size_t>(size, 4000);
    auto data = pattern(f->peer_offset, size);
    ssize_t n = ::send(f->peer, data.data(), size, MSG_NOSIGNAL);
    int error = errno;
    if (n > 0) {
      f->peer_offset += static_cast<std::size_t>(n);
      if (f->stream()) {
        f->in += static_cast<std::size_t>(n);
      } else {
        f->grams.push_back(static_cast<std::size_t>(n));
      }
    }
    line("peer-send fd+%d size %zu = %s", rel(fd), size, result(n, error).c_str());
  }

  void peer_shuts() {
    auto [fd, f] = any_fd();
    if (f->kind == Kind::kUnixDatagram) return peer_sends();  // (a datagram peer's end is not ours)
    int rc = ::shutdown(f->peer, SHUT_WR);
    int error = errno;
    f->peer_shut = true;
    line("peer-shutdown fd+%d = %s", rel(fd), result(rc, error).c_str());
  }

  void poll_one() {
    auto [fd, f] = any_fd();
    short events =
        f->kind == Kind::kTcp ? POLLIN : one_of<short>({POLLIN, POLLOUT, POLLIN | POLLOUT});
    int timeout = one_of({0, 30});
    settle(fd, *f);
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, timeout);
    int error = errno;
    line("poll fd+%d events %d timeout %d = %s revents %d", rel(fd), events, timeout,
         result(n, error).c_str(), p.revents);
  }

  // Another thread closes the descriptor; then a call on its number (which a new socket may
  // have taken meanwhile) says what libc says.
  void close_elsewhere() {
    auto [fd, f] = any_fd();
    int rc = -1, error = 0;
    std::thread([&, fd = fd] {
      rc = ::close(fd);
      error = errno;
    }).join();
    dropped(fd);
    line("close-elsewhere fd+%d = %s", rel(fd), result(rc, error).c_str());
    if (chance(50)) open_pair();
    char c;
    ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
    error = errno;
    if (n > 0 && held_.count(fd) != 0) {
      File& now = files_[held_[fd]];
      if (now.stream()) {
        --now.in;
      } else if (!now.grams.empty()) {
        now.grams.pop_front();
      }
    }
    line("recv-after-close fd+%d = %s", rel(fd), result(n, error).c_str());
  }

  // Another thread closes the descriptor while a blocking read waits on it, then the peer
  // ends. libc's read goes on with the file and ends at its end (0); the hooks end a fiber's
  // read at the close (EBADF). Either is "ended".
  void close_under_a_read() {
    auto [fd, f] = any_fd();
    if (!f->stream() || f->in > 0 || f->peer_shut || f->nonblocking || f->receive_timeout) {
      return look_at_flags();
    }
    int peer = f->peer;
    std::thread closer([fd = fd, peer] {
      std::this_thread::sleep_for(20ms);
      ::close(fd);
      std::this_thread::sleep_for(20ms);
      ::shutdown(peer, SHUT_WR);
    });
    char c;
    ssize_t n = ::read(fd, &c, 1);
    int error = errno;
    closer.join();
    f->peer_shut = true;
    dropped(fd);
    bool ended = n == 0 || (n < 0 && error == EBADF);
    line("read-under-close fd+%d = %s", rel(fd), ended ? "ended" : result(n, error).c_str());
  }

  // A duplicate written through stdio (its writes are libc's own, no hook sees them).
  void stdio_write() {
    auto [fd, f] = any_fd();
    if (!f->stream() || f->nonblocking || f->send_timeout) return look_at_flags();
    std::size_t size = one_of<std::size_t>({10, 5000, 200000});
    std::thread reader;
    std::size_t got = 0, expect = f->out + size;
    bool drained = expect > (f->kind == Kind::kTcp ? 8000u : 65536u);
    if (drained) reader = std::thread([&, peer = f->peer] { got = drain(peer, expect, false); });
    FILE* stream = ::fdopen(::dup(fd), "w");
    auto data = pattern(f->offset, size);
    std::size_t written = stream ? std::fwrite(data.data(), 1, size, stream) : 0;
    int flushed = stream ? std::fflush(stream) : -2;
    int closed = stream ? std::fclose(stream) : -2;
    if (reader.joinable()) reader.join();
    f->offset += written;
    f->out += written;
    if (drained) f->out -= std::min(f->out, got);
    line("stdio fd+%d size %zu = %zu %d %d%s", rel(fd), size, written, flushed, closed,
         drained ? (got == expect ? " drained" : " drained-short") : "");
  }

  void connect_refused() {
    int unused = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    ::bind(unused, reinterpret_cast<sockaddr*>(&address), sizeof address);
    ::getsockname(unused, reinterpret_cast<sockaddr*>(&address), &size);
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    int rc = ::connect(s, reinterpret_cast<sockaddr*>(&address), sizeof address);
    int error = errno;
    ::close(s);
    ::close(unused);
    line("connect-refused = %s", result(rc, error).c_str());
  }

  std::mt19937_64 random_;
  std::FILE* out_;
  int base_ = 0;
  int index_ = 0;
  std::vector<File> files_;
  std::map<int, int> held_;  // the script's descriptors: fd -> its file
};

}  // namespace

void run(std::uint64_t seed, int steps, std::FILE* out) {
  Script script(seed, out);
  for (int i = 0; i < steps; ++i) script.step(i);
}

}  // namespace spindle::hook_script
