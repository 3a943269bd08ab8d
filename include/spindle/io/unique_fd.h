#pragma once
/// UniqueFd: sole owner of a file descriptor; closes it on destruction.

#include <unistd.h>

#include <utility>

namespace spindle {

/// Owns one file descriptor (or none, as -1). Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  /// Takes ownership of `fd` (may be -1).
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  /// The descriptor, or -1.
  int get() const { return fd_; }
  /// True if a descriptor is owned.
  explicit operator bool() const { return fd_ >= 0; }
  /// Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  /// Closes the current descriptor (if any) and owns `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  /// The owned descriptor, or -1.
  int fd_ = -1;
};

}  // namespace spindle
