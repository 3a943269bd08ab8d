#pragma once
// What the hooks know of each descriptor number (private to src/hook). The hooks never change a
// descriptor's flags: its O_NONBLOCK is its program's, and a call they make cooperative on a
// fiber is made with MSG_DONTWAIT. What they keep is what spares them a system call on every
// call (is it a socket, of which type, did its program make it non-blocking, its timeouts) and
// its registration with the reactor of the worker whose fibers wait on it.
//
// Any thread may use a descriptor while another closes it (libc survives that race, so must
// the hooks): the facts are one atomic word, the registration changes under the entry's lock,
// and entries live in blocks that are never freed. What the hooks could not see (a descriptor
// closed or made by a bare system call) is found out when it matters: a socket call on what is
// no longer a socket says ENOTSOCK, and a fiber parked on a registration that is no longer the
// descriptor's looks again now and then (wait.h).

#include <atomic>
#include <cstdint>
#include <mutex>

#include "spindle/fiber/spin_lock.h"
#include "spindle/io/reactor.h"

namespace spindle {
class Worker;
}

/// The vforks under way in the process (hook.cc's vfork counts them).
extern "C" int spindle_hook_vforks;

namespace spindle::hook::detail {

/// What is known of the descriptor at a number: bits of FdState::facts.
enum Fact : std::uint32_t {
  kKnown = 1u << 0,        ///< the other bits are about the descriptor now at this number
  kSocket = 1u << 1,       ///< a socket: the only kind a call waits for on a fiber
  kStream = 1u << 2,       ///< SOCK_STREAM: a blocking write or MSG_WAITALL read is whole
  kSeqPacket = 1u << 3,    ///< SOCK_SEQPACKET: write(2) sends with MSG_EOR
  kLocal = 1u << 4,        ///< AF_UNIX: a peek with MSG_WAITALL does not wait for all
  kNonBlocking = 1u << 5,  ///< its program made it non-blocking (as last seen by the hooks)
  kShared = 1u << 6,       ///< may be shared with descriptors the hooks do not follow (dup,
                           ///< fork, inherited): its O_NONBLOCK is asked of the kernel
  kMade = 1u << 7,         ///< made through a hooked call (socket, socketpair, accept)
};

/// The facts of a socket made with `type` (SOCK_STREAM, ... with SOCK_NONBLOCK) in `domain`.
std::uint32_t socket_facts(int domain, int type);

/// One descriptor number's state.
struct FdState {
  /// Fact bits (0: nothing known yet).
  std::atomic<std::uint32_t> facts{0};
  /// Bumped whenever the descriptor at this number goes (close, dup2 over it, a new one made
  /// there): a call that sees it change was using a descriptor that is gone (EBADF).
  std::atomic<std::uint32_t> generation{0};
  /// SO_RCVTIMEO and SO_SNDTIMEO in microseconds (0: none), when kKnown.
  std::atomic<std::int64_t> receive_timeout_us{0};
  std::atomic<std::int64_t> send_timeout_us{0};
  /// SO_RCVLOWAT, when more than 1: a blocking stream read waits until that many bytes came.
  std::atomic<int> receive_low_water{0};
  /// An error a cooperative call took from the socket after it had moved bytes (it returned
  /// the count, as a blocking call does): the next call on the descriptor returns it.
  std::atomic<int> pending_error{0};
  /// Guards changes of owner and slot (and resets of the whole entry).
  SpinLock lock;
  /// The worker whose reactor has the descriptor registered, and the slot there (nullptr:
  /// none). The slot is used on the owner's thread only.
  std::atomic<Worker*> owner{nullptr};
  std::atomic<IoSlot*> slot{nullptr};
};

/// A fiber's registration, as FdTable::slot_for finds it.
struct Registration {
  /// Where to park (nullptr: the fiber cannot park on this worker; it looks now and then).
  IoSlot* slot = nullptr;
  /// The registration was not for the descriptor now at the number: made again (and the
  /// facts forgotten, to be learned again).
  bool renewed = false;
};

/// True on the thread that called fork(), in the child: it has none of its parent's workers,
/// so no call made there parks (threads the child starts itself are not concerned).
bool in_forked_child();

/// True in a child made by vfork() (own descriptor table, its parent's memory: this table is
/// the parent's, and the child's closes and copies must leave it alone). Costs one atomic load
/// unless a vfork is under way.
bool in_vforked_child();

/// The process's table.
class FdTable {
 public:
  /// The entry of `fd` (made on first use); nullptr for a negative or too large number.
  FdState* entry(int fd);
  /// The entry of `fd` if its block exists (nothing is made).
  FdState* find(int fd) const;

  /// The facts of `fd`, learned (fstat, fcntl, getsockopt) if not known yet. 0 if the number
  /// holds no descriptor.
  std::uint32_t facts(int fd, FdState& state);
  /// Records a descriptor the hooks just saw made at `fd` (0: made, nothing known of it).
  void made(int fd, std::uint32_t facts);
  /// Records `to` as a duplicate of `from` (dup, dup2, dup3, F_DUPFD): one open file
  /// description, so both are marked shared.
  void copied(int from, int to);
  /// Forgets `fd` before it is closed: fibers parked on it wake (their call says EBADF), its
  /// registration is released on its worker's thread.
  void forget(int fd);
  /// Wakes the fibers parked on `fd` (they try their call again): for what changes a socket
  /// without an edge of its own readiness (its own shutdown ends a blocked write).
  void wake(int fd);
  /// Forgets every descriptor in [first, last] (close_range, closefrom).
  void forget_range(unsigned first, unsigned last);
  /// Its program set O_NONBLOCK on `fd` on or off (fcntl, ioctl FIONBIO).
  void set_nonblocking(int fd, bool on);
  /// Its program set SO_RCVLOWAT on `fd` to `bytes`.
  void set_low_water(int fd, int bytes);
  /// Its program set a timeout (SO_RCVTIMEO when `receive`, else SO_SNDTIMEO).
  void set_timeout(int fd, bool receive, std::int64_t microseconds);

  /// Where a fiber of `worker` parks for `fd`: its registration there, made if it has none.
  /// With `look_again`, the registration is first checked to be for the descriptor now at the
  /// number (one epoll_ctl). No slot if `generation` is no longer the entry's, if another
  /// worker has the descriptor registered, or if epoll refuses it (a regular file).
  Registration slot_for(int fd, FdState& state, std::uint32_t generation, Worker& worker,
                        bool look_again);

  /// The one table.
  static FdTable& instance();

 private:
  friend struct ForkHandlers;
  static constexpr int kBlock = 1024;
  static constexpr int kBlocks = 1024;  // room for 1,048,576 descriptors
  /// Empties `state` for a descriptor that is gone or new (`facts` and timeouts of the new
  /// one), waking the fibers parked on it. Under its lock.
  void reset(FdState& state, std::uint32_t facts, std::int64_t receive_us, std::int64_t send_us);
  /// Calls `each` for every entry of every block made so far.
  template <typename Each>
  void for_each(Each each);
  std::mutex grow_lock_;
  std::atomic<FdState*> blocks_[kBlocks] = {};
};

}  // namespace spindle::hook::detail
