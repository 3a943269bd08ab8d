#pragma once
// What the adversarial review's hook tests share (review_*_test.cc): a call's result as libc
// reports it (its value and errno), the same call made on a plain thread (libc's answer: the
// hooks pass every call there through) and on a fiber, fibers bounded in time (cancelled when
// they outstay their patience, so that a hooked wait that should have ended ends with EINTR),
// and loopback TCP and UDP sockets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <ostream>
#include <thread>
#include <utility>
#include <vector>

#include "hook_testing.h"
#include "spindle/fiber/runtime.h"

namespace spindle::hook_review {

using namespace std::chrono_literals;
using hook_testing::Pair;
using hook_testing::Watchdog;

/// What a call returned, and errno when that was negative.
struct Outcome {
  long value = 0;
  int error = 0;
  bool operator==(const Outcome&) const = default;
};

inline std::ostream& operator<<(std::ostream& out, const Outcome& o) {
  out << o.value;
  if (o.value < 0) out << " (" << std::strerror(o.error) << ")";
  return out;
}

/// Makes `call` (returning a number, negative with errno) and reports what it gave.
template <typename Call>
Outcome outcome_of(Call call) {
  errno = 0;
  long value = static_cast<long>(call());
  return {value, value < 0 ? errno : 0};
}

/// `call` made on a plain thread of its own: libc's answer.
template <typename Call>
Outcome on_thread(Call call) {
  Outcome o;
  std::thread([&] { o = outcome_of(call); }).join();
  return o;
}

/// Runs `fibers` on a one-worker runtime of their own. If they have not all ended within
/// `patience`, every fiber is asked to stop (a hooked wait then ends with EINTR): true then.
inline bool outstayed(std::chrono::milliseconds patience,
                      std::vector<std::function<void()>> fibers) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  Watchdog watchdog(patience, [&] { runtime.cancel_fibers(); });
  (void)hook_testing::on_runtime(runtime, std::move(fibers));
  return watchdog.dismiss();
}

/// `call` made on a fiber; `outstayed` says whether it had to be stopped after `patience`.
template <typename Call>
Outcome on_fiber(Call call, std::chrono::milliseconds patience = 3000ms,
                 bool* outstayed_patience = nullptr) {
  Outcome o;
  bool late = outstayed(patience, {[&] { o = outcome_of(call); }});
  if (outstayed_patience != nullptr) *outstayed_patience = late;
  return o;
}

/// read(2) of one byte of `fd`.
inline int read_one(int fd) {
  char c;
  return static_cast<int>(::read(fd, &c, 1));
}

/// A loopback address with port `port` (network order).
inline sockaddr_in loopback(in_port_t port = 0) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = port;
  return a;
}

inline sockaddr* any_address(sockaddr_in& a) { return reinterpret_cast<sockaddr*>(&a); }

/// A socket of `type` bound to a free loopback port; its address in `address`.
inline int bound_socket(int type, sockaddr_in& address) {
  int fd = ::socket(AF_INET, type, 0);
  address = loopback();
  EXPECT_EQ(::bind(fd, any_address(address), sizeof address), 0);
  socklen_t size = sizeof address;
  EXPECT_EQ(::getsockname(fd, any_address(address), &size), 0);
  return fd;
}

/// A listening loopback TCP socket (blocking), closed when it goes.
struct Listener {
  sockaddr_in address{};
  int fd = -1;
  explicit Listener(int backlog = 16) : fd(bound_socket(SOCK_STREAM, address)) {
    EXPECT_EQ(::listen(fd, backlog), 0);
  }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  ~Listener() {
    if (fd >= 0) ::close(fd);
  }
  /// A new blocking socket connected to it (made on a plain thread).
  int connected() {
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(::connect(c, any_address(address), sizeof address), 0);
    return c;
  }
};

/// A connected loopback TCP pair (blocking), closed when it goes.
struct Tcp {
  int a = -1, b = -1;
  Tcp() {
    Listener l;
    a = l.connected();
    b = ::accept(l.fd, nullptr, nullptr);
  }
  Tcp(const Tcp&) = delete;
  Tcp& operator=(const Tcp&) = delete;
  ~Tcp() {
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
  }
};

/// Two UDP sockets on the loopback, each connected to the other, closed when they go.
struct Udp {
  sockaddr_in address_a{}, address_b{};
  int a = -1, b = -1;
  Udp() : a(bound_socket(SOCK_DGRAM, address_a)), b(bound_socket(SOCK_DGRAM, address_b)) {
    EXPECT_EQ(::connect(a, any_address(address_b), sizeof address_b), 0);
    EXPECT_EQ(::connect(b, any_address(address_a), sizeof address_a), 0);
  }
  Udp(const Udp&) = delete;
  Udp& operator=(const Udp&) = delete;
  ~Udp() {
    ::close(a);
    ::close(b);
  }
};

/// Milliseconds from `from` to `to`.
inline long long ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

}  // namespace spindle::hook_review
