#pragma once
// The connections of one worker (private to src/pg). Used only on that worker's thread.

#include <memory>
#include <vector>

#include "connection.h"
#include "spindle/pg/database.h"

namespace spindle {
class Waiter;
}

namespace spindle::pg {

class Pool : public std::enable_shared_from_this<Pool> {
 public:
  Pool(const Options& options, std::weak_ptr<Catalog> catalog)
      : options_(options), catalog_(std::move(catalog)) {}

  /// A connection for one call: an idle one if there is one, else a new one while there is
  /// room, else the least busy (its statements go out behind those in flight). `exclusive`
  /// (a transaction): one with nothing in flight, reserved until release(); waits for one.
  Expected<std::shared_ptr<Connection>> pick(bool exclusive, Deadline deadline);
  /// A transaction is over: the connection is shared again.
  void release(Connection* connection);
  /// A connection closed (its driver ended).
  void remove(Connection* connection);
  /// A connection has nothing in flight any more (a transaction may be waiting for one).
  void idle(Connection* connection);
  /// Shuts every connection; later picks fail with Errc::kClosed.
  void close_all();
  Database::Stats stats() const;

 private:
  void wake_waiters();

  Options options_;
  std::weak_ptr<Catalog> catalog_;  ///< the Database's (its connections hold it)
  std::vector<std::shared_ptr<Connection>> live_;
  std::size_t opening_ = 0;
  std::size_t opened_ = 0;
  std::vector<Waiter*> waiters_;  ///< fibers waiting for a connection
  bool closed_ = false;
};

}  // namespace spindle::pg
