#include "fd_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <new>
#include <vector>

#include "spindle/fiber/io_wait.h"
#include "spindle/fiber/worker.h"
#include "spindle/sync/event.h"

namespace spindle::hook::detail {

FdTable& FdTable::instance() {
  // Never destroyed (hooked calls may come from other static destructors), and not on the
  // heap: memory the process keeps until it ends, as libc keeps its own tables (so a leak
  // checker sees nothing left in use at exit).
  alignas(FdTable) static unsigned char storage[sizeof(FdTable)];
  static FdTable* table = new (storage) FdTable;
  return *table;
}

FdState* FdTable::entry(int fd) {
  if (fd < 0 || fd >= kBlock * kBlocks) return nullptr;
  std::atomic<FdState*>& block = blocks_[fd / kBlock];
  FdState* states = block.load(std::memory_order_acquire);
  if (states == nullptr) {
    std::lock_guard guard(grow_lock_);
    states = block.load(std::memory_order_relaxed);
    if (states == nullptr) {
      // Never freed (see fd_table.h): mapped, not allocated, like the table itself.
      void* memory = ::mmap(nullptr, sizeof(FdState) * kBlock, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (memory == MAP_FAILED) return nullptr;  // then the descriptor is simply not hooked
      states = static_cast<FdState*>(memory);
      for (int i = 0; i < kBlock; ++i) new (&states[i]) FdState();
      block.store(states, std::memory_order_release);
    }
  }
  return &states[fd % kBlock];
}

namespace {

// Lets go of `s`'s description, if it has one (its last descriptor frees it).
void drop_file(FdState* s) {
  if (s->file != nullptr && s->file->references.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    delete s->file;
  }
  s->file = nullptr;
}

}  // namespace

FdState* FdTable::get(int fd) {
  FdState* s = entry(fd);
  if (s == nullptr || s->known.load(std::memory_order_acquire) != 0) return s;
  // Raw system calls: the hooked fcntl would ask this table again.
  struct stat st {};
  s->socket = ::syscall(SYS_fstat, fd, &st) == 0 && S_ISSOCK(st.st_mode);
  long flags = s->socket ? ::syscall(SYS_fcntl, fd, F_GETFL) : 0;
  s->file = new Description;
  s->file->user_nonblock = flags >= 0 && (flags & O_NONBLOCK) != 0;
  s->known.store(1, std::memory_order_release);
  return s;
}

void FdTable::made(int fd, bool socket, bool user_nonblock) {
  FdState* s = entry(fd);
  if (s == nullptr) return;
  drop_file(s);  // a number closed where no hook saw it (inside libc) and made again
  s->socket = socket;
  s->file = new Description;
  s->file->user_nonblock = user_nonblock;
  s->owner = nullptr;
  s->slot = nullptr;
  s->known.store(1, std::memory_order_release);
}

void FdTable::copied(int from, int to) {
  FdState* a = get(from);
  FdState* b = entry(to);
  if (a == nullptr || b == nullptr) return;
  if (b == a) return;
  drop_file(b);
  b->socket = a->socket;
  a->file->references.fetch_add(1, std::memory_order_relaxed);
  b->file = a->file;
  b->owner = nullptr;
  b->slot = nullptr;
  b->known.store(1, std::memory_order_release);
}

namespace {

// Wakes the fibers parked on `slot` (their wait reports a cancellation, which the hooks turn
// into EBADF) and releases it. On its worker's thread.
void release_on_owner(Worker& owner, IoSlot* slot) {
  cancel_waits(*slot);
  owner.reactor().release(slot);
}

// The descriptors registered with this thread's worker: released when the thread ends (its
// reactor goes with the worker), so that a later close does not post to a worker that is gone.
struct Registrations {
  Worker* worker = nullptr;
  std::vector<FdState*> states;
  ~Registrations() {
    for (FdState* s : states) {
      if (s->owner != worker || s->slot == nullptr) continue;  // closed, or registered again
      release_on_owner(*worker, s->slot);
      s->slot = nullptr;
      s->owner = nullptr;
    }
  }
};

thread_local Registrations t_registrations;

}  // namespace

bool FdTable::register_with(int fd, FdState& state, Worker& worker) {
  if (state.slot != nullptr) return state.owner == &worker;
  auto slot = worker.reactor().add(fd);
  if (!slot) return false;
  state.owner = &worker;
  state.slot = *slot;
  Registrations& here = t_registrations;
  if (here.worker != &worker) {
    here.worker = &worker;
    here.states.clear();
  }
  // Closed descriptors leave their entries: drop them now and then, not on every close.
  if (here.states.size() >= 64 && here.states.size() == here.states.capacity()) {
    std::erase_if(here.states, [&](FdState* s) { return s->owner != &worker; });
  }
  here.states.push_back(&state);
  return true;
}

void FdTable::forget(int fd) {
  FdState* s = entry(fd);
  if (s == nullptr || s->known.load(std::memory_order_acquire) == 0) return;
  s->generation.fetch_add(1, std::memory_order_acq_rel);
  if (s->slot != nullptr) {
    Worker* owner = s->owner;
    IoSlot* slot = s->slot;
    s->slot = nullptr;
    s->owner = nullptr;
    if (Worker::current() == owner) {
      release_on_owner(*owner, slot);
    } else {
      // Closed from another thread: the slot is its worker's to release, and the descriptor
      // may be closed only after that (its number could be reused at once).
      auto done = std::make_shared<Event>();
      owner->post([owner, slot, done] {
        release_on_owner(*owner, slot);
        done->set();
      });
      (void)done->wait(Deadline::never(), kNotCancellable);
    }
  }
  s->known.store(0, std::memory_order_release);
  drop_file(s);
}

}  // namespace spindle::hook::detail
