#pragma once
/// spindle::hook — an opt-in library that makes the blocking libc calls of third-party code
/// (libpq, libpqxx, hiredis, libcurl's easy interface, ...) cooperative on spindle's fibers.
///
/// Link it into a program (CMake: `target_link_libraries(app PRIVATE spindle::hook)`) and the
/// program's own definitions of socket, socketpair, connect, accept/accept4, read/readv/recv/
/// recvfrom/recvmsg, write/writev/send/sendto/sendmsg, poll/ppoll, select/pselect,
/// epoll_wait/epoll_pwait, __poll_chk/__ppoll_chk, sleep/usleep/
/// nanosleep/clock_nanosleep, close/close_range/closefrom, fclose/freopen, dup/dup2/dup3, fcntl,
/// ioctl(FIONBIO), setsockopt, shutdown, vfork and getaddrinfo come before libc's.
///
/// Every call gives what libc's gives for the program's view of the descriptor (blocking or
/// not, as the program set it). On a spindle fiber, a call on a socket the program has not made
/// non-blocking is made with MSG_DONTWAIT and parks the fiber (not the thread) until the socket
/// is ready, keeping what a blocking call promises (whole stream writes, whole MSG_WAITALL
/// reads, SO_RCVTIMEO/SO_SNDTIMEO as deadlines); poll, select and epoll_wait park until one of
/// their descriptors is; the sleeps park for their time; getaddrinfo runs on a helper thread. On a
/// plain thread each is exactly libc's call. The hooks never change a descriptor's flags (the
/// one exception: a blocking connect on a fiber, for the connect(2) call alone, of a socket made
/// through the hooks). spindle's own I/O does not go through them (its fibers are the primary
/// API: docs/database.md says when to use which, and the rules in full).
///
/// What cannot be hooked — calls made inside glibc itself (its resolver's own sockets), raw
/// syscall(2), libraries linked statically or loaded with dlopen after start without their
/// symbols resolved against the program — is written down in docs/database.md with what to do
/// instead.

namespace spindle::hook {

/// True: the hooks are linked into this program. (Referencing it is not needed to link them:
/// the library's CMake target does that.)
bool linked();

}  // namespace spindle::hook
