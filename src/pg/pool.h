#pragma once
// The connections of one worker (private to src/pg). Used only on that worker's thread.
//
// A call joins the first connection that keeps up (placement.h: the fewest connections that keep
// up carry the statements), else the least busy, and another connection opens while there is
// room; with none to join it waits for one. A transaction takes an idle one for itself. Calls that
// cannot be served wait in one queue and are served in order as connections open, drain or come
// back; a transaction first in line has a connection kept free of new calls until it drains.
// Connections are opened by fibers of their own (a call waiting for one gives up at its own
// deadline; the connection serves the next); after an open fails, the next waits a pause that
// doubles (kFirstPause to kLongestPause), and calls with no connection to use fail at once
// meanwhile.

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "connection.h"
#include "placement.h"
#include "spindle/pg/database.h"

namespace spindle {
class Waiter;
}

namespace spindle::pg {

class Pool : public std::enable_shared_from_this<Pool> {
 public:
  Pool(const Options& options, std::weak_ptr<Catalog> catalog)
      : options_(options), catalog_(std::move(catalog)) {}

  /// A connection for one call (`exclusive`: a transaction's, reserved until release()), or
  /// by `deadline` Errc::kTimedOut; or the last open's error when none can be had now. Every
  /// error is Error::not_sent.
  Expected<std::shared_ptr<Connection>> pick(bool exclusive, Deadline deadline);
  /// A connection is opening, or may open now: a call waiting would wait for an open (bounded
  /// by the connect timeout), not for other calls or transactions to end.
  bool opening() const { return opening_ > 0 || can_open(); }
  /// A transaction is over: the connection is shared again.
  void release(Connection* connection);
  /// A connection closed (its driver ended); `evicted` if for not answering.
  void remove(Connection* connection, bool evicted);
  /// A connection drained or is healthy again: the calls waiting may be served.
  void changed();
  /// Shuts every connection; later picks fail with Errc::kClosed.
  void close_all();
  Database::Stats stats() const;

 private:
  /// One call waiting for a connection (on its stack).
  struct Request {
    Waiter* waiter = nullptr;
    bool exclusive = false;
    bool parked = false;  ///< notified when served (not before it parks)
    std::shared_ptr<Connection> granted;
    std::optional<Error> failed;
  };

  /// pick() once: what it was granted may have become unusable meanwhile.
  Expected<std::shared_ptr<Connection>> pick_once(bool exclusive, Deadline deadline);
  /// A connection for a call now, or nullptr (then it waits).
  Connection* choose(bool exclusive);
  /// Room for one more connection, and no pause after a failed open in force.
  bool can_open() const;
  /// Hands `connection` to `request` (taken out of the queue by the caller).
  void grant(Request& request, Connection* connection);
  /// Serves the queue in order; opens connections for those left, while there is room.
  void serve();
  /// Keeps a connection free of new calls for the first transaction waiting (or none).
  void promise(bool transaction_waiting);
  /// Fails every waiting call with `why`.
  void fail_waiting(const Error& why);
  void open_one();
  void opened(Expected<std::shared_ptr<Connection>> outcome);
  void retire_old();
  bool any_usable() const;
  /// Past Options::max_lifetime: it takes no new call.
  bool past_lifetime(const Connection& c, Clock::time_point now) const;

  static constexpr std::chrono::milliseconds kFirstPause{100};
  static constexpr std::chrono::milliseconds kLongestPause{2000};

  Options options_;
  std::weak_ptr<Catalog> catalog_;  ///< the Database's (its connections hold it)
  std::vector<std::shared_ptr<Connection>> live_;
  std::vector<Lane> lanes_;     ///< scratch for choose()
  std::deque<Request*> queue_;  ///< calls waiting, in order
  std::size_t opening_ = 0;
  std::size_t opened_ = 0;
  std::size_t failed_ = 0;
  std::size_t evicted_ = 0;
  std::chrono::milliseconds pause_{0};  ///< after the last failed open (0: none failed)
  Clock::time_point retry_at_;          ///< no open before this
  std::optional<Error> last_failure_;   ///< of the last open, while pause_ is in force
  bool serving_ = false;                ///< serve() runs (it is not re-entered)
  bool closed_ = false;
};

}  // namespace spindle::pg
