#pragma once
/// spindle::hook — an opt-in library that makes the blocking libc calls of third-party code
/// (libpq, libpqxx, hiredis, libcurl's easy interface, ...) cooperative on spindle's fibers.
///
/// Link it into a program (CMake: `target_link_libraries(app PRIVATE spindle::hook)`) and the
/// program's own definitions of socket, connect, accept/accept4, read/readv/recv/recvfrom/
/// recvmsg, write/writev/send/sendto/sendmsg, poll/ppoll, select, sleep/usleep/nanosleep/
/// clock_nanosleep, close, dup/dup2/dup3, fcntl, ioctl(FIONBIO), setsockopt and getaddrinfo
/// come before libc's. Called on a spindle fiber, on a socket the caller has not made
/// non-blocking itself, such a call parks the fiber (not the thread) until the socket is ready,
/// and honours SO_RCVTIMEO/SO_SNDTIMEO as deadlines; poll and select park until one of their
/// descriptors is; the sleeps park for their time; getaddrinfo runs on a helper thread. On a
/// plain thread, on anything but a socket, or on a socket the caller made non-blocking, each is
/// exactly the libc call. spindle's own I/O does not go through them (its fibers are the
/// primary API: docs/database.md says when to use which).
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
