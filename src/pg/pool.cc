#include "pool.h"

#include <algorithm>

#include "connect.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/waiter.h"

namespace spindle::pg {

Expected<std::shared_ptr<Connection>> Pool::pick(bool exclusive, Deadline deadline) {
  for (;;) {
    auto picked = pick_once(exclusive, deadline);
    // Granted while it waited, the connection broke or closed before the call could send:
    // nothing was sent, so the call waits in line again (choose() hands out usable ones).
    if (!picked || (*picked)->usable() || closed_) return picked;
    if (exclusive) (*picked)->reserved = false;
  }
}

Expected<std::shared_ptr<Connection>> Pool::pick_once(bool exclusive, Deadline deadline) {
  if (closed_) return std::unexpected(unsent_error(Errc::kClosed, "the database is closed"));
  if (queue_.empty()) {
    if (Connection* c = choose(exclusive)) {
      if (exclusive) c->reserved = true;
      return c->shared_from_this();
    }
  }
  // In line behind the calls already waiting.
  Waiter waiter;
  Request request{.waiter = &waiter, .exclusive = exclusive};
  queue_.push_back(&request);
  serve();
  std::error_code ec;
  if (!request.granted && !request.failed) {
    request.parked = true;
    ec = park(waiter, deadline);
    request.parked = false;
  }
  std::erase(queue_, &request);
  if (request.granted) --request.granted->pending_picks;
  if (request.failed) return std::unexpected(std::move(*request.failed));
  if (!ec) return std::move(request.granted);
  // Its deadline passed (or its fiber was canceled), maybe as a connection came: nothing sent.
  if (request.granted && exclusive) request.granted->reserved = false;
  request.granted.reset();
  serve();  // what it held or was promised goes to the next
  std::string message =
      ec == std::errc::timed_out
          ? "no connection was free before the deadline: the statement was not sent"
          : "canceled while waiting for a connection: the statement was not sent";
  if (last_failure_) message += " (the last attempt to connect: " + last_failure_->message + ")";
  return std::unexpected(
      unsent_error(ec == std::errc::timed_out ? Errc::kTimedOut : Errc::kCanceled, message));
}

Connection* Pool::choose(bool exclusive) {
  retire_old();
  if (exclusive) {
    Clock::time_point now = Clock::now();
    for (const auto& c : live_) {
      if (!c->reserved && c->healthy() && c->in_flight() + c->pending_picks == 0 &&
          !past_lifetime(*c, now)) {
        return c.get();
      }
    }
    return nullptr;
  }
  lanes_.clear();
  Clock::time_point now = Clock::now();
  for (const auto& c : live_) {
    std::chrono::nanoseconds stalled = c->stalled_for(now);
    // Its answers wait in the socket: this worker is late in reading them, not the server (a
    // busy or descheduled worker), and another connection would not answer sooner.
    if (stalled >= options_.spread_after && c->answers_waiting()) stalled = {};
    lanes_.push_back(Lane{
        .open_to_calls = !c->reserved && c->healthy() && !c->promised && !past_lifetime(*c, now),
        .depth = c->in_flight() + c->pending_picks,
        .stalled = stalled,
        .per_statement = c->per_statement()});
  }
  // One open at a time to spread: the calls go on what is open meanwhile.
  Placement placed = place(lanes_, opening_ == 0 && can_open(), options_.spread_after);
  if (placed.open_another) open_one();
  return placed.lane ? live_[*placed.lane].get() : nullptr;
}

bool Pool::can_open() const {
  if (closed_ || live_.size() + opening_ >= std::max<std::size_t>(options_.connections, 1)) {
    return false;
  }
  return pause_.count() == 0 || Clock::now() >= retry_at_;
}

void Pool::grant(Request& request, Connection* connection) {
  if (request.exclusive) {
    connection->reserved = true;
    connection->promised = false;
  }
  ++connection->pending_picks;  // until the call sends (pick takes it off)
  request.granted = connection->shared_from_this();
  if (request.parked) request.waiter->notify();
}

void Pool::serve() {
  if (serving_ || closed_) return;
  serving_ = true;
  bool transaction_waiting = false;
  std::size_t waiting = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    Request& r = **it;
    if (Connection* c = choose(r.exclusive)) {
      grant(r, c);
      it = queue_.erase(it);
      continue;
    }
    transaction_waiting = transaction_waiting || r.exclusive;
    ++waiting;
    ++it;
  }
  promise(transaction_waiting);
  while (waiting > opening_ && can_open()) open_one();
  // Nothing will serve them: no connection to use, none opening, and a pause after a failed
  // open: they fail now, with its error, rather than at their deadlines.
  if (!queue_.empty() && opening_ == 0 && last_failure_ && !can_open() && !any_usable()) {
    fail_waiting(*last_failure_);
  }
  serving_ = false;
}

void Pool::promise(bool transaction_waiting) {
  Connection* kept = nullptr;
  for (const auto& c : live_) {
    if (!c->promised) continue;
    if (transaction_waiting && kept == nullptr && c->healthy() && !c->reserved) {
      kept = c.get();
    } else {
      c->promised = false;
    }
  }
  // A new connection will do, if one may be opened.
  if (!transaction_waiting || kept != nullptr || can_open()) return;
  Connection* best = nullptr;
  for (const auto& c : live_) {
    if (c->reserved || !c->healthy()) continue;
    if (best == nullptr ||
        c->in_flight() + c->pending_picks < best->in_flight() + best->pending_picks) {
      best = c.get();
    }
  }
  if (best != nullptr) best->promised = true;
}

void Pool::fail_waiting(const Error& why) {
  for (Request* r : std::exchange(queue_, {})) {
    r->failed = why;
    if (r->parked) r->waiter->notify();
  }
}

void Pool::open_one() {
  auto catalog = catalog_.lock();
  if (!catalog) return;
  ++opening_;
  auto conninfos = catalog->connect_params().connect_timeout;
  Deadline deadline = Deadline::after(conninfos.count() > 0 ? conninfos : options_.connect_timeout);
  spawn([self = shared_from_this(), catalog = std::move(catalog), deadline] {
    self->opened(Connection::open(self->options_, catalog, self, deadline));
  }).detach();
}

void Pool::opened(Expected<std::shared_ptr<Connection>> outcome) {
  --opening_;
  if (!outcome) {
    ++failed_;
    last_failure_ = std::move(outcome.error());
    pause_ = pause_.count() == 0 ? kFirstPause : std::min(pause_ * 2, kLongestPause);
    retry_at_ = Clock::now() + pause_;
  } else if (closed_) {
    (*outcome)->shut(Errc::kClosed);
  } else {
    ++opened_;
    pause_ = std::chrono::milliseconds(0);
    last_failure_.reset();
    live_.push_back(std::move(*outcome));
  }
  serve();
}

void Pool::retire_old() {
  // Connections past their lifetime take no new calls; they close once answered.
  if (options_.max_lifetime.count() <= 0) return;
  auto now = std::chrono::steady_clock::now();
  std::erase_if(live_, [&](const std::shared_ptr<Connection>& c) {
    // One handed to a call that has not sent yet is retired once that call sent: the call
    // was promised it (past its lifetime, choose() gives it no other).
    if (c->reserved || c->pending_picks > 0 || !past_lifetime(*c, now)) return false;
    c->retire();
    return true;
  });
}

bool Pool::past_lifetime(const Connection& c, Clock::time_point now) const {
  return options_.max_lifetime.count() > 0 && now - c.born() >= options_.max_lifetime;
}

bool Pool::any_usable() const {
  return std::any_of(live_.begin(), live_.end(), [](const auto& c) { return c->usable(); });
}

void Pool::release(Connection* connection) {
  connection->reserved = false;
  serve();
}

void Pool::changed() {
  if (!queue_.empty()) serve();
}

void Pool::remove(Connection* connection, bool evicted) {
  if (evicted) ++evicted_;
  std::erase_if(live_, [&](const auto& c) { return c.get() == connection; });
  serve();
}

void Pool::close_all() {
  closed_ = true;
  auto live = std::move(live_);
  live_.clear();
  for (const auto& c : live) c->shut(Errc::kClosed);
  fail_waiting(unsent_error(Errc::kClosed, "the database is closed"));
}

Database::Stats Pool::stats() const {
  Database::Stats s;
  s.open = live_.size();
  s.opened = opened_;
  s.failed = failed_;
  s.evicted = evicted_;
  for (const auto& c : live_) s.in_flight += c->in_flight();
  return s;
}

}  // namespace spindle::pg
