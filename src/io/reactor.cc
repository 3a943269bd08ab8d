#include "spindle/io/reactor.h"

#include <sys/eventfd.h>

#include <cassert>

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
    slot = &slot_at(free_.back());
    free_.pop_back();
  } else {
    std::uint32_t i = slot_count_;
    if (i % kSlotsPerBlock == 0) blocks_.push_back(std::make_unique<IoSlot[]>(kSlotsPerBlock));
    slot = &slot_at(i);
    slot->index = i;
    ++slot_count_;
  }
  slot->fd = fd;
  slot->watches_writable = false;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
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
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = cookie_of(slot);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, slot.fd, &ev) != 0) return last_errno();
  slot.watches_writable = true;
  return {};
}

void Reactor::release(IoSlot* slot) {
  assert(slot->reader == nullptr && slot->writer == nullptr);
  slot->fd = -1;
  slot->on_readable = nullptr;
  slot->owner = nullptr;
  ++slot->generation;
  free_.push_back(slot->index);
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
