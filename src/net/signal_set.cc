#include "spindle/net/signal_set.h"

#include <pthread.h>
#include <sys/signalfd.h>

#include "spindle/net/socket.h"

namespace spindle {

SignalSet::SignalSet(std::initializer_list<int> signals) {
  sigemptyset(&set_);
  for (int s : signals) sigaddset(&set_, s);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
}

Result<int> SignalSet::wait(Deadline deadline) {
  // A signalfd per wait keeps the set free of worker affinity; waits are rare.
  UniqueFd fd(::signalfd(-1, &set_, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!fd) return fail_errno();
  auto registered = Socket::adopt(std::move(fd));
  if (!registered) return fail(registered.error());
  signalfd_siginfo info{};
  auto n = registered->retry(IoDirection::kRead, deadline,
                             [&] { return ::read(registered->fd(), &info, sizeof info); });
  if (!n) return fail(n.error());
  return static_cast<int>(info.ssi_signo);
}

Result<UniqueFd> SignalSet::open_fd() const {
  UniqueFd fd(::signalfd(-1, &set_, SFD_CLOEXEC));
  if (!fd) return fail_errno();
  return fd;
}

}  // namespace spindle
