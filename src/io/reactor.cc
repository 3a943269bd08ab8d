#include "spindle/io/reactor.h"

#include <sys/eventfd.h>

#include <algorithm>
#include <cassert>
#include <functional>

namespace spindle {
namespace {

std::uint64_t cookie_of(const IoSlot& slot) {
  return (std::uint64_t{slot.generation} << 32) | slot.index;
}

}  // namespace

Reactor::Reactor()
    : epoll_(::epoll_create1(EPOLL_CLOEXEC)), wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!epoll_ || !wake_fd_) throw std::system_error(last_errno(), "reactor: epoll/eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.u64 = kWakeCookie;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) {
    throw std::system_error(last_errno(), "reactor: register eventfd");
  }
}

Result<IoSlot*> Reactor::add(int fd) {
  IoSlot* slot;
  if (!free_.empty()) {
    // The lowest free index: the table's tail empties first, so trim() can drop it.
    std::pop_heap(free_.begin(), free_.end(), std::greater<>{});
    slot = &slot_at(free_.back());
    free_.pop_back();
  } else {
    std::uint32_t i = slot_count_;
    if (i % kSlotsPerBlock == 0) {
      blocks_.push_back(std::make_unique<IoSlot[]>(kSlotsPerBlock));
      in_use_.push_back(0);
    }
    slot = &slot_at(i);
    slot->index = i;
    // Above every generation a dropped block had: no stale cookie can match it.
    slot->generation = next_generation_;
    ++slot_count_;
  }
  ++in_use_[slot->index / kSlotsPerBlock];
  slot->fd = fd;
  slot->watches_writable = false;
  slot->drained = false;
  slot->hung_up = false;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLPRI | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = cookie_of(*slot);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    auto ec = last_errno();
    release(slot);
    return fail(ec);
  }
  return slot;
}

std::error_code Reactor::watch_writable(IoSlot& slot) {
  if (slot.watches_writable) return {};
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLPRI | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = cookie_of(slot);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, slot.fd, &ev) != 0) return last_errno();
  slot.watches_writable = true;
  return {};
}

void Reactor::release(IoSlot* slot) {
  assert(slot->reader == nullptr && slot->writer == nullptr && slot->read_ahead == nullptr);
  slot->fd = -1;
  slot->on_readable = nullptr;
  slot->owner = nullptr;
  ++slot->generation;
  --in_use_[slot->index / kSlotsPerBlock];
  free_.push_back(slot->index);
  std::push_heap(free_.begin(), free_.end(), std::greater<>{});
}

bool Reactor::trimmable() const { return blocks_.size() > 1 && in_use_.back() == 0; }

std::size_t Reactor::trim() {
  std::size_t freed = 0;
  while (trimmable()) {
    auto first = static_cast<std::uint32_t>((blocks_.size() - 1) * kSlotsPerBlock);
    for (std::uint32_t i = first; i < slot_count_; ++i) {
      next_generation_ = std::max(next_generation_, slot_at(i).generation + 1);
    }
    slot_count_ = first;
    blocks_.pop_back();
    in_use_.pop_back();
    freed += kSlotsPerBlock * sizeof(IoSlot);
  }
  if (freed > 0) {
    std::erase_if(free_, [&](std::uint32_t i) { return i >= slot_count_; });
    std::make_heap(free_.begin(), free_.end(), std::greater<>{});
    free_.shrink_to_fit();
  }
  return freed;
}

IoSlot* Reactor::slot_for(std::uint64_t cookie) {
  auto index = static_cast<std::uint32_t>(cookie);
  auto generation = static_cast<std::uint32_t>(cookie >> 32);
  if (index >= slot_count_) return nullptr;
  IoSlot& slot = slot_at(index);
  return slot.generation == generation && slot.fd >= 0 ? &slot : nullptr;
}

void Reactor::wake() {
  if (wake_pending_.exchange(true, std::memory_order_acq_rel)) return;
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_.get(), &one, sizeof one);
}

void Reactor::drain_wake() {
  std::uint64_t value;
  [[maybe_unused]] auto n = ::read(wake_fd_.get(), &value, sizeof value);
  // Only now clear the flag. Cleared before the read, a racing wake() could write between the
  // two, have its count read away here, and leave the flag set with no event to come: every
  // later wake() would then be skipped. The exchange also acquires what the last waker
  // published before its wake(), which the owner looks at next.
  wake_pending_.exchange(false, std::memory_order_acq_rel);
}

}  // namespace spindle
