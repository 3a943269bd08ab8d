#include "pool.h"

#include <algorithm>

#include "spindle/fiber/waiter.h"

namespace spindle::pg {
Expected<std::shared_ptr<Connection>> Pool::pick(bool exclusive, Deadline deadline) {
  for (;;) {
    if (closed_) return std::unexpected(client_error(Errc::kClosed, "the database is closed"));
    // Connections past their lifetime take no new calls; they close once answered.
    if (options_.max_lifetime.count() > 0) {
      auto now = std::chrono::steady_clock::now();
      std::erase_if(live_, [&](const std::shared_ptr<Connection>& c) {
        if (c->reserved || now - c->born() < options_.max_lifetime) return false;
        c->retire();
        return true;
      });
    }
    Connection* best = nullptr;
    for (const auto& c : live_) {
      if (c->reserved || !c->usable()) continue;
      if (best == nullptr || c->in_flight() < best->in_flight()) best = c.get();
    }
    auto found = [&](Connection* c) -> std::shared_ptr<Connection> {
      if (exclusive) c->reserved = true;
      return c->shared_from_this();
    };
    if (best != nullptr && best->in_flight() == 0) return found(best);
    if (live_.size() + opening_ < std::max<std::size_t>(options_.connections, 1)) {
      auto catalog = catalog_.lock();
      if (!catalog) return std::unexpected(client_error(Errc::kClosed, "the database is closed"));
      ++opening_;
      auto opened = Connection::open(options_, std::move(catalog), weak_from_this());
      --opening_;
      if (opened && closed_) (*opened)->shut(Errc::kClosed);
      if (opened && !closed_) {
        ++opened_;
        live_.push_back(*opened);
        if (exclusive) (*opened)->reserved = true;
        wake_waiters();  // the others may share it now
        return *opened;
      }
      wake_waiters();  // one of them may open it again
      if (!opened && live_.empty()) return std::unexpected(opened.error());
      continue;  // there is a connection after all (opened while this one failed)
    }
    if (best != nullptr && !exclusive) return found(best);
    // All taken by transactions, or still being opened: wait for a change.
    Waiter waiter;
    waiters_.push_back(&waiter);
    std::error_code ec = park(waiter, deadline);
    std::erase(waiters_, &waiter);
    if (ec == std::errc::timed_out) {
      return std::unexpected(client_error(Errc::kTimedOut, "no connection was free in time"));
    }
    if (ec)
      return std::unexpected(
          client_error(Errc::kCanceled, "canceled while waiting for a connection"));
  }
}

void Pool::release(Connection* connection) {
  connection->reserved = false;
  wake_waiters();
}

void Pool::idle(Connection*) {
  if (!waiters_.empty()) wake_waiters();
}

void Pool::remove(Connection* connection) {
  std::erase_if(live_, [&](const auto& c) { return c.get() == connection; });
  wake_waiters();
}

void Pool::close_all() {
  closed_ = true;
  auto live = std::move(live_);
  live_.clear();
  for (const auto& c : live) c->shut(Errc::kClosed);
  wake_waiters();
}

Database::Stats Pool::stats() const {
  Database::Stats s;
  s.open = live_.size();
  s.opened = opened_;
  for (const auto& c : live_) s.in_flight += c->in_flight();
  return s;
}

void Pool::wake_waiters() {
  auto waiters = std::move(waiters_);
  waiters_.clear();
  for (Waiter* w : waiters) w->notify();
}

}  // namespace spindle::pg
