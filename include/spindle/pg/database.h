#pragma once
/// spindle's PostgreSQL client: libpq's non-blocking API in pipeline mode, driven by the
/// worker's reactor. No hooks: a fiber that queries parks, its worker goes on.
///
///   pg::Database db(runtime, {.conninfo = "host=/run/postgresql dbname=app"});
///   auto by_id = db.prepare("SELECT id, name FROM users WHERE id = $1");
///   // on a fiber of `runtime`:
///   auto rows = db.query(by_id, {pg::param(42)}, Deadline::after(1s));
///   if (!rows) log_error("{} ({})", rows.error().message, rows.error().sqlstate);
///
/// Each worker has its own pool of connections (Options::connections of them, opened when
/// first needed). Calls from the fibers of one worker share its connections: each statement
/// is its own Bind/Execute/Sync, written at once behind the ones already in flight, and the
/// results come back in order to whoever is waiting for each — so concurrent requests, and the
/// several statements of one request sent with start(), do not wait for each other's round
/// trips. A Transaction holds one connection for itself until it ends.
///
/// Every call has a deadline and returns by it, whatever the server or the network does: with
/// Errc::kTimedOut, whose Error::not_sent says whether the statement never left (a connection
/// was not free or not opened in time) or may have run. A statement the server is running when
/// its call gives up is canceled, if nothing is pipelined behind it (a cancel stops whatever
/// runs when it arrives); a connection that then sends nothing for Options::cancel_grace is
/// closed. A connection that breaks (server restart, pg_terminate_backend) fails the calls on
/// it with Errc::kConnectionLost and leaves the pool; the next call opens a new one, and opens
/// that fail are retried after a pause that doubles (docs/database.md).

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "spindle/io/deadline.h"
#include "spindle/pg/result.h"

namespace spindle {
class Runtime;
class Waiter;
}  // namespace spindle

namespace spindle::pg {

struct Options {
  /// Any libpq connection string or URI (host, port, dbname, user, password, sslmode,
  /// sslrootcert, application_name, options, ...): passed to libpq as it is.
  std::string conninfo;
  /// Connections per worker (opened on demand, up to this many).
  std::size_t connections = 2;
  /// A worker's calls share the fewest connections that answer within about this long: a call
  /// joins the first connection whose server answered something within it and whose
  /// statements in flight take less at the server's recent pace; when none does, another is
  /// used (or opened). Well above a busy machine's scheduling delays, which another connection
  /// would not shorten.
  std::chrono::microseconds spread_after{10'000};
  /// How long opening a connection may take (a call waiting for it gives up at its own
  /// deadline; the connection, once open, serves the calls after it). A connect_timeout in the
  /// conninfo takes its place.
  std::chrono::milliseconds connect_timeout{5000};
  /// Once a call on a connection gave up unanswered (its deadline passed; a cancel went to the
  /// server if it could), how long the connection may go without a byte from the server, once
  /// no caller waits for any statement on it, before it is closed: a stopped backend, a dead
  /// network path. A caller still waiting is bounded by its own deadline.
  std::chrono::milliseconds cancel_grace{1000};
  /// A connection unused this long is closed (0: never).
  std::chrono::milliseconds idle_timeout{60'000};
  /// A connection older than this is retired once its calls are answered (0: never).
  std::chrono::milliseconds max_lifetime{30 * 60'000};
};

/// A statement registered once with Database::prepare, prepared on each connection the first
/// time it runs there (the Parse goes out in the same write as its first Execute).
struct Statement {
  std::uint32_t id = 0;
};

class Connection;
class Pool;

/// One statement sent, its result still to come. Get it with result(); destroying a Query
/// without asking leaves its result to be thrown away when it comes. A Query from
/// Database::start() made while no connection was free holds its statement (and a copy of its
/// parameters) until result() sends it, waiting for a connection until its deadline; destroyed
/// first, it is sent once a connection frees.
class Query {
 public:
  Query() = default;
  Query(Query&& other) noexcept;
  Query& operator=(Query&& other) noexcept;
  ~Query();

  /// Waits for the result until `deadline` (then Errc::kTimedOut, and a cancel for the server).
  Expected<Result> result(Deadline deadline = Deadline::never());

 private:
  friend class Connection;
  friend class Database;
  friend class Transaction;
  /// A Query whose result() is `why`.
  static Query failed(Error why);
  void detach();
  /// A statement not sent yet: no connection was free when it was started.
  struct Pending;
  std::shared_ptr<Pending> pending_;  ///< (shared: Pending is incomplete here)
  std::shared_ptr<Connection> connection_;
  std::uint64_t sequence_ = 0;
  std::optional<Expected<Result>> outcome_;
  Waiter* waiter_ = nullptr;
  bool sent_ = false;  ///< left the client: never reported "not sent" after
};

/// A transaction on one connection: BEGIN when made, COMMIT by commit(), ROLLBACK if it ends
/// without one. Statements in it go out pipelined like any other.
class Transaction {
 public:
  Transaction(Transaction&&) noexcept;
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();

  Query start(const Statement& statement, std::span<const Param> params);
  Query start(std::string_view sql, std::span<const Param> params = {});
  Expected<Result> query(const Statement& statement, std::span<const Param> params,
                         Deadline deadline = Deadline::never());
  Expected<Result> query(std::string_view sql, std::span<const Param> params = {},
                         Deadline deadline = Deadline::never());
  Expected<Result> query(const Statement& statement, std::initializer_list<Param> params,
                         Deadline deadline = Deadline::never()) {
    return query(statement, std::span<const Param>(params.begin(), params.size()), deadline);
  }
  Expected<Result> query(std::string_view sql, std::initializer_list<Param> params,
                         Deadline deadline = Deadline::never()) {
    return query(sql, std::span<const Param>(params.begin(), params.size()), deadline);
  }
  /// COMMIT; an error if it (or anything before it in the transaction) failed.
  Expected<void> commit(Deadline deadline = Deadline::never());
  /// ROLLBACK now, and wait for it.
  Expected<void> rollback(Deadline deadline = Deadline::never());

 private:
  friend class Database;
  Transaction(std::shared_ptr<Pool> pool, std::shared_ptr<Connection> connection);
  /// Sends COMMIT or ROLLBACK; if it cannot be sent, closes the connection (never shared with
  /// the transaction open).
  Query send_end(std::string_view sql, Deadline deadline = Deadline::never());
  void release();
  std::shared_ptr<Pool> pool_;
  std::shared_ptr<Connection> connection_;
};

class Database {
 public:
  /// Opens nothing yet: connections are made by the first calls on each worker.
  Database(Runtime& runtime, Options options);
  /// Closes every connection (close()).
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  /// Registers a statement (any thread, any time).
  Statement prepare(std::string sql);

  /// Sends a statement and returns at once (pipelined behind those in flight; with no
  /// connection free, result() sends it). On a fiber of the runtime; an error is reported by
  /// the Query's result().
  Query start(const Statement& statement, std::span<const Param> params);
  Query start(std::string_view sql, std::span<const Param> params = {});

  /// start() then result().
  Expected<Result> query(const Statement& statement, std::span<const Param> params,
                         Deadline deadline = Deadline::never());
  Expected<Result> query(const Statement& statement, std::initializer_list<Param> params,
                         Deadline deadline = Deadline::never()) {
    return query(statement, std::span<const Param>(params.begin(), params.size()), deadline);
  }
  Expected<Result> query(std::string_view sql, std::span<const Param> params = {},
                         Deadline deadline = Deadline::never());
  Expected<Result> query(std::string_view sql, std::initializer_list<Param> params,
                         Deadline deadline = Deadline::never()) {
    return query(sql, std::span<const Param>(params.begin(), params.size()), deadline);
  }

  /// A connection of its own for a transaction: waits for one no other call is using, in turn
  /// with the other calls waiting for a connection (new calls stop joining the connection it
  /// will have, so that it drains).
  Expected<Transaction> begin(Deadline deadline = Deadline::never());

  /// Counts for tests and metrics, for the calling worker's pool.
  struct Stats {
    std::size_t open = 0;       ///< connections open
    std::size_t opened = 0;     ///< connections opened so far
    std::size_t in_flight = 0;  ///< statements sent, result not yet in
    std::size_t failed = 0;     ///< opens that failed (refused, timed out, bad settings)
    std::size_t evicted = 0;    ///< connections closed for not answering after a call gave up
  };
  Stats stats() const;

  /// Closes every connection of every worker (calls in flight end with Errc::kClosed). Call it
  /// before the runtime stops; the destructor does.
  void close();

 private:
  friend class Pool;
  struct Shared;
  Pool* pool_here() const;
  Expected<std::shared_ptr<Connection>> pick(bool exclusive, Deadline deadline) const;
  /// start(): sent now if a connection is free, else a Query that result() sends.
  Query start_now_or_later(const Statement* statement, std::string_view sql,
                           std::span<const Param> params);
  std::shared_ptr<Shared> shared_;
  Runtime* runtime_;
};

}  // namespace spindle::pg
