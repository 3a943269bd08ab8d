#pragma once
// Zero-downtime upgrade: the listening sockets of a running spindle handed to the spindle that
// replaces it, over a Unix socket (SOCK_SEQPACKET, descriptors passed with SCM_RIGHTS), so
// that no connection waiting in a listen queue is lost and no address is ever unbound.
//
// The protocol, one message each:
//   new -> old   "listeners"
//   old -> new   "fd IDENTITY" with one descriptor attached, once per listening socket
//   old -> new   "end"
//   new -> old   "ready"            (it serves: the old one drains and exits)
//   cli -> old   "upgrade"          (spindle upgrade: start the new binary, which connects)
//   old -> cli   "started PID" or "error WHY"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/io/unique_fd.h"

namespace spindle::app {

/// Listening sockets by listener identity (see Instance).
using InheritedListeners = std::map<std::string, std::vector<UniqueFd>>;

/// The running process's side: a Unix socket at a path that the replacing process (or
/// `spindle upgrade`) connects to.
class HandoverPoint {
 public:
  /// Binds `path` (a stale socket file left there is replaced).
  [[nodiscard]] static Result<HandoverPoint> listen(const std::string& path);
  /// Readable when someone connects.
  int fd() const { return fd_.get(); }
  /// Accepts one connection (blocking for it no more than a moment).
  [[nodiscard]] Result<UniqueFd> accept() const;

 private:
  explicit HandoverPoint(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

/// One message of at most 4 KiB from `fd` ("" at the end of the connection or on an error),
/// waiting up to `timeout_ms`.
std::string receive_message(int fd, int timeout_ms);
/// Sends `text`, with `attached` (if >= 0) passed along.
bool send_message(int fd, std::string_view text, int attached = -1);
/// Sends every socket of `listeners` (identity -> descriptors), then "end".
bool send_listeners(int fd, const std::map<std::string, std::vector<int>>& listeners);

/// The replacing process's side: connects to `path`; nullopt when nothing listens there (no
/// process to take over from: bind fresh).
std::optional<UniqueFd> connect_handover(const std::string& path);
/// Asks for the listening sockets and receives them. Fails if the old process does not
/// answer within a few seconds.
[[nodiscard]] Result<InheritedListeners> take_listeners(int fd);

}  // namespace spindle::app
