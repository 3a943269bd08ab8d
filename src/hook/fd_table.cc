#include "fd_table.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <vector>

#include "spindle/fiber/io_wait.h"
#include "spindle/fiber/worker.h"

namespace spindle::hook::detail {

std::uint32_t socket_facts(int domain, int type) {
  std::uint32_t facts = kKnown | kSocket;
  int kind = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (kind == SOCK_STREAM) facts |= kStream;
  if (kind == SOCK_SEQPACKET) facts |= kSeqPacket;
  if (domain == AF_UNIX) facts |= kLocal;
  if ((type & SOCK_NONBLOCK) != 0) facts |= kNonBlocking;
  return facts;
}

FdTable& FdTable::instance() {
  // Never destroyed (hooked calls may come from other static destructors), and not on the
  // heap: memory the process keeps until it ends, as libc keeps its own tables (so a leak
  // checker sees nothing left in use at exit).
  alignas(FdTable) static unsigned char storage[sizeof(FdTable)];
  static FdTable* table = new (storage) FdTable;
  return *table;
}

FdState* FdTable::find(int fd) const {
  if (fd < 0 || fd >= kBlock * kBlocks) return nullptr;
  FdState* states = blocks_[fd / kBlock].load(std::memory_order_acquire);
  return states == nullptr ? nullptr : &states[fd % kBlock];
}

FdState* FdTable::entry(int fd) {
  if (FdState* s = find(fd)) return s;
  if (fd < 0 || fd >= kBlock * kBlocks) return nullptr;
  std::atomic<FdState*>& block = blocks_[fd / kBlock];
  std::lock_guard guard(grow_lock_);
  FdState* states = block.load(std::memory_order_relaxed);
  if (states == nullptr) {
    // Never freed (see fd_table.h): mapped, not allocated, like the table itself.
    void* memory = ::mmap(nullptr, sizeof(FdState) * kBlock, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return nullptr;  // then the descriptor is simply not hooked
    states = static_cast<FdState*>(memory);
    for (int i = 0; i < kBlock; ++i) new (&states[i]) FdState();
    block.store(states, std::memory_order_release);
  }
  return &states[fd % kBlock];
}

template <typename Each>
void FdTable::for_each(Each each) {
  for (auto& block : blocks_) {
    FdState* states = block.load(std::memory_order_acquire);
    if (states == nullptr) continue;
    for (int i = 0; i < kBlock; ++i) each(states[i]);
  }
}

namespace {

std::int64_t microseconds_of(const timeval& t) {
  return std::int64_t{t.tv_sec} * 1'000'000 + t.tv_usec;
}

// A socket option's timeout in microseconds (0: none, or it could not be read).
std::int64_t timeout_of(int fd, int name) {
  timeval t{};
  socklen_t size = sizeof t;
  return ::getsockopt(fd, SOL_SOCKET, name, &t, &size) == 0 ? microseconds_of(t) : 0;
}

int int_option(int fd, int name) {
  int value = -1;
  socklen_t size = sizeof value;
  return ::getsockopt(fd, SOL_SOCKET, name, &value, &size) == 0 ? value : -1;
}

// Wakes the fibers parked on `slot` (their wait reports a cancellation; the hooks look at the
// descriptor's generation to tell why) and releases it. On its worker's thread.
void release_here(Worker& owner, IoSlot* slot) {
  cancel_waits(*slot);
  owner.reactor().release(slot);
}

// The registrations made by this thread's worker: released when the thread ends (its reactor
// goes with the worker), so that no entry names a worker that is gone.
struct Registrations {
  Worker* worker = nullptr;
  std::vector<FdState*> states;
  ~Registrations() {
    for (FdState* s : states) {
      std::lock_guard guard(s->lock);
      if (s->owner.load(std::memory_order_relaxed) != worker) continue;  // let go since
      release_here(*worker, s->slot.load(std::memory_order_relaxed));
      s->slot.store(nullptr, std::memory_order_relaxed);
      s->owner.store(nullptr, std::memory_order_release);
    }
  }
  void add(Worker& here, FdState& state) {
    if (worker != &here) {
      worker = &here;
      states.clear();
    }
    // Entries let go since stay listed: dropped now and then, not on every close.
    if (states.size() >= 64 && states.size() == states.capacity()) {
      std::erase_if(states, [&](FdState* s) { return s->owner.load() != &here; });
    }
    states.push_back(&state);
  }
};

thread_local Registrations t_registrations;

}  // namespace

void FdTable::reset(FdState& s, std::uint32_t facts, std::int64_t receive_us,
                    std::int64_t send_us) {
  s.generation.fetch_add(1, std::memory_order_acq_rel);
  s.receive_timeout_us.store(receive_us, std::memory_order_relaxed);
  s.send_timeout_us.store(send_us, std::memory_order_relaxed);
  s.pending_error.store(0, std::memory_order_relaxed);
  s.receive_low_water.store(0, std::memory_order_relaxed);
  s.facts.store(facts, std::memory_order_release);
  Worker* owner = s.owner.load(std::memory_order_relaxed);
  if (owner == nullptr) return;
  IoSlot* slot = s.slot.load(std::memory_order_relaxed);
  s.slot.store(nullptr, std::memory_order_relaxed);
  s.owner.store(nullptr, std::memory_order_release);
  if (Worker::current() == owner) {
    release_here(*owner, slot);
  } else {
    // The slot is its worker's to release. Posted under the entry's lock: the worker cannot
    // end meanwhile (its thread's last act, ~Registrations, takes this lock first).
    owner->post([owner, slot] { release_here(*owner, slot); });
  }
}

std::uint32_t FdTable::facts(int fd, FdState& s) {
  std::uint32_t known = s.facts.load(std::memory_order_acquire);
  if (known != 0) return known;
  std::uint32_t generation = s.generation.load(std::memory_order_acquire);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  // Not made through a hook: it may be shared with other processes (inherited).
  std::uint32_t facts = kKnown | kShared;
  std::int64_t receive_us = 0, send_us = 0;
  int low_water = 0;
  if (S_ISSOCK(st.st_mode)) {
    facts = socket_facts(int_option(fd, SO_DOMAIN), int_option(fd, SO_TYPE)) | kShared;
    long flags = ::syscall(SYS_fcntl, fd, F_GETFL);  // (the hooked fcntl would ask this table)
    if (flags >= 0 && (flags & O_NONBLOCK) != 0) facts |= kNonBlocking;
    receive_us = timeout_of(fd, SO_RCVTIMEO);
    send_us = timeout_of(fd, SO_SNDTIMEO);
    if (facts & kStream) low_water = int_option(fd, SO_RCVLOWAT);
  }
  std::lock_guard guard(s.lock);
  // Kept only if the number still holds what was looked at.
  if (s.generation.load(std::memory_order_relaxed) != generation) return facts;
  if (s.facts.load(std::memory_order_relaxed) != 0) return s.facts.load();
  s.receive_timeout_us.store(receive_us, std::memory_order_relaxed);
  s.send_timeout_us.store(send_us, std::memory_order_relaxed);
  s.receive_low_water.store(low_water, std::memory_order_relaxed);
  s.facts.store(facts, std::memory_order_release);
  return facts;
}

void FdTable::made(int fd, std::uint32_t facts) {
  if (in_vforked_child()) return;
  FdState* s = entry(fd);
  if (s == nullptr) return;
  std::lock_guard guard(s->lock);
  reset(*s, facts, 0, 0);
}

void FdTable::copied(int from, int to) {
  if (in_vforked_child()) return;
  FdState* a = entry(from);
  FdState* b = entry(to);
  if (a == nullptr || b == nullptr || a == b) return;
  std::uint32_t facts = a->facts.load(std::memory_order_acquire);
  if (facts != 0) {
    facts |= kShared;
    a->facts.fetch_or(kShared, std::memory_order_acq_rel);
  }
  std::int64_t receive_us = a->receive_timeout_us.load(std::memory_order_relaxed);
  std::int64_t send_us = a->send_timeout_us.load(std::memory_order_relaxed);
  int low_water = a->receive_low_water.load(std::memory_order_relaxed);
  std::lock_guard guard(b->lock);
  reset(*b, facts, receive_us, send_us);
  b->receive_low_water.store(low_water, std::memory_order_relaxed);
}

void FdTable::forget(int fd) {
  if (in_vforked_child()) return;
  FdState* s = find(fd);
  if (s == nullptr) return;
  std::lock_guard guard(s->lock);
  reset(*s, 0, 0, 0);
}

void FdTable::wake(int fd) {
  FdState* s = find(fd);
  if (s == nullptr || s->owner.load(std::memory_order_acquire) == nullptr) return;
  std::lock_guard guard(s->lock);
  Worker* owner = s->owner.load(std::memory_order_relaxed);
  IoSlot* slot = s->slot.load(std::memory_order_relaxed);
  if (owner == nullptr) return;
  if (Worker::current() == owner) {
    cancel_waits(*slot);
    return;
  }
  // On the owner's thread, and only if the slot is still the entry's (one let go meanwhile
  // may be another descriptor's; its release is posted after this task). Posted under the
  // lock: see reset.
  owner->post([s, owner, slot] {
    std::lock_guard again(s->lock);
    if (s->owner.load(std::memory_order_relaxed) == owner &&
        s->slot.load(std::memory_order_relaxed) == slot) {
      cancel_waits(*slot);
    }
  });
}

void FdTable::forget_range(unsigned first, unsigned last) {
  if (in_vforked_child()) return;
  last = std::min<unsigned>(last, kBlock * kBlocks - 1);
  for (unsigned fd = first; fd <= last; fd = fd + 1) {
    if (blocks_[fd / kBlock].load(std::memory_order_acquire) == nullptr) {
      fd = (fd / kBlock + 1) * kBlock - 1;  // a block never made: nothing in it to forget
      continue;
    }
    forget(static_cast<int>(fd));
  }
}

void FdTable::set_nonblocking(int fd, bool on) {
  FdState* s = find(fd);
  if (s == nullptr) return;
  std::uint32_t facts = s->facts.load(std::memory_order_relaxed);
  while (facts != 0) {
    std::uint32_t wanted = on ? facts | kNonBlocking : facts & ~kNonBlocking;
    if (s->facts.compare_exchange_weak(facts, wanted, std::memory_order_acq_rel)) return;
  }
}

void FdTable::set_low_water(int fd, int bytes) {
  if (FdState* s = entry(fd)) s->receive_low_water.store(bytes, std::memory_order_relaxed);
}

void FdTable::set_timeout(int fd, bool receive, std::int64_t microseconds) {
  if (FdState* s = entry(fd)) {
    (receive ? s->receive_timeout_us : s->send_timeout_us)
        .store(microseconds, std::memory_order_relaxed);
  }
}

Registration FdTable::slot_for(int fd, FdState& s, std::uint32_t generation, Worker& worker,
                               bool look_again) {
  Worker* owner = s.owner.load(std::memory_order_acquire);
  if (owner == &worker && !look_again) return {s.slot.load(std::memory_order_relaxed), false};
  if (owner != nullptr && owner != &worker) return {};  // another worker's: look now and then
  // Register; or, looking again, see whether epoll has this descriptor (the file now at the
  // number) registered already: EEXIST says the registration is still good.
  auto added = worker.reactor().add(fd);
  if (!added) {
    if (added.error() == std::errc::file_exists && owner == &worker) {
      return {s.slot.load(std::memory_order_relaxed), false};
    }
    return {};  // refused (a regular file), closed, or registered by spindle's own code
  }
  std::lock_guard guard(s.lock);
  Worker* now = s.owner.load(std::memory_order_relaxed);
  if (s.generation.load(std::memory_order_relaxed) != generation ||
      (now != nullptr && now != &worker)) {
    release_here(worker, *added);
    return {};
  }
  bool renewed = now == &worker;
  if (renewed) {
    // The old registration was for a descriptor that went where no hook saw it: so did what
    // was known of it.
    release_here(worker, s.slot.load(std::memory_order_relaxed));
    s.facts.store(0, std::memory_order_release);
  } else {
    t_registrations.add(worker, s);
  }
  s.slot.store(*added, std::memory_order_relaxed);
  s.owner.store(&worker, std::memory_order_release);
  return {*added, renewed};
}

namespace {

// The process's id (a forked child's once its fork handler ran).
pid_t process_id = ::getpid();

}  // namespace

// A forked child has none of its parent's threads: no worker's registration is its, and every
// descriptor the two share is shared. The table's growth lock is held across the fork.
struct ForkHandlers {
  static void prepare() { FdTable::instance().grow_lock_.lock(); }
  static void parent() {
    FdTable& table = FdTable::instance();
    table.grow_lock_.unlock();
    table.for_each([](FdState& s) {
      if (s.facts.load(std::memory_order_relaxed) != 0) {
        s.facts.fetch_or(kShared, std::memory_order_relaxed);
      }
    });
  }
  static void child() {
    FdTable& table = FdTable::instance();
    table.grow_lock_.unlock();
    table.for_each([](FdState& s) {
      new (&s.lock) SpinLock();  // it may have been held by a thread the child does not have
      s.owner.store(nullptr, std::memory_order_relaxed);
      s.slot.store(nullptr, std::memory_order_relaxed);
      if (s.facts.load(std::memory_order_relaxed) != 0) {
        s.facts.fetch_or(kShared, std::memory_order_relaxed);
      }
    });
    forked_thread = true;
    __atomic_store_n(&process_id, ::getpid(), __ATOMIC_RELAXED);
  }
  // The thread that forked, in the child: the one thread the child has of its parent. Its
  // fibers (if it was a worker) have no worker; threads the child starts (a Runtime of its
  // own) are not it, and their calls park as in any program.
  static thread_local bool forked_thread;
};

thread_local bool ForkHandlers::forked_thread = false;

bool in_forked_child() { return ForkHandlers::forked_thread; }

bool in_vforked_child() {
  return __atomic_load_n(&spindle_hook_vforks, __ATOMIC_ACQUIRE) != 0 &&
         ::getpid() != __atomic_load_n(&process_id, __ATOMIC_RELAXED);
}

namespace {

[[gnu::constructor]] void install_fork_handlers() {
  ::pthread_atfork(&ForkHandlers::prepare, &ForkHandlers::parent, &ForkHandlers::child);
}

}  // namespace

}  // namespace spindle::hook::detail
