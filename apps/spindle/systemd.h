#pragma once
// systemd's two protocols, written from their documentation (sd_notify(3), sd_listen_fds(3))
// rather than linked from libsystemd: a datagram to $NOTIFY_SOCKET, and descriptors from 3 on
// announced by $LISTEN_PID/$LISTEN_FDS/$LISTEN_FDNAMES. Both are no-ops outside systemd.

#include <string>
#include <string_view>

#include "handover.h"

namespace spindle::app::systemd {

/// Sends `state` ("READY=1\nSTATUS=...") to the service manager, if $NOTIFY_SOCKET names one;
/// false if there is none or it could not be sent.
bool notify(std::string_view state);

/// "RELOADING=1\nMONOTONIC_USEC=<now>", as Type=notify-reload asks.
std::string reloading();

/// The listening sockets passed to this process ($LISTEN_PID is ours), by the address each
/// listens on (Address::to_string(): how a configuration's `listen` is recognised), made
/// close-on-exec; the variables are then removed from the environment, so that processes
/// started later do not take them for theirs. Sockets that do not listen are logged and
/// closed.
InheritedListeners take_listeners();

}  // namespace spindle::app::systemd
