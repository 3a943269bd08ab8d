#pragma once
/// SignalSet: receive POSIX signals (SIGINT, SIGTERM, SIGHUP, ...) as values in a fiber, through
/// a signalfd, instead of in an async handler.

#include <csignal>
#include <initializer_list>

#include "spindle/base/error.h"
#include "spindle/io/deadline.h"
#include "spindle/io/unique_fd.h"

namespace spindle {

/// A set of signals that are blocked for normal delivery and read through wait().
class SignalSet {
 public:
  /// Blocks `signals` in the calling thread. Construct it before the Runtime, so that the
  /// worker threads inherit the mask and no thread takes the signals the usual way.
  SignalSet(std::initializer_list<int> signals);
  SignalSet(const SignalSet&) = delete;
  SignalSet& operator=(const SignalSet&) = delete;

  /// Waits for one of the signals (in a fiber: parks it) and returns its number. Fails with
  /// std::errc::timed_out or std::errc::operation_canceled.
  [[nodiscard]] Result<int> wait(Deadline deadline = Deadline::never());

  /// A blocking signalfd for the set, for a thread outside the runtime that polls it beside
  /// other descriptors; each read(2) of it gives one signalfd_siginfo.
  [[nodiscard]] Result<UniqueFd> open_fd() const;

 private:
  /// The signals.
  sigset_t set_;
};

}  // namespace spindle
