#pragma once
/// bare_recv: how spindle reads a socket on the request path (TcpStream's reads, the worker's
/// reads ahead, the TLS read-ahead BIO), in one place.

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace spindle {

/// recv(fd, data, size, 0) made as a bare system call, again after EINTR: glibc's recv is a
/// pthread cancellation point and switches asynchronous cancellation on and off around every
/// call, which spindle never uses and which costs more than the call's own userspace part.
/// Returns what recv returns (errno set when negative).
inline ssize_t bare_recv(int fd, void* data, std::size_t size) {
  ssize_t n;
  do {
    n = ::syscall(SYS_recvfrom, fd, data, size, 0, nullptr, nullptr);
  } while (n < 0 && errno == EINTR);
  return n;
}

}  // namespace spindle
