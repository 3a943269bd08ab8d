// Database, Query and Transaction: the calls, routed to the calling worker's pool.
#include "spindle/pg/database.h"

#include <deque>
#include <mutex>

#include "connect.h"
#include "connection.h"
#include "pool.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/waiter.h"
#include "spindle/fiber/worker.h"
#include "spindle/net/resolver.h"

namespace spindle::pg {
struct Database::Shared : Catalog {
  explicit Shared(Options o)
      : options(std::move(o)), params(pg::connect_params(options.conninfo)) {}

  std::optional<std::string> sql(std::uint32_t id) const override {
    std::lock_guard guard(lock);
    if (id == 0 || id > statements.size()) return std::nullopt;
    return statements[id - 1];
  }
  const ConnectParams& connect_params() const override { return params; }
  Resolver& resolver() override {
    std::call_once(resolver_made, [this] { names = std::make_unique<Resolver>(2); });
    return *names;
  }
  std::shared_ptr<std::atomic<int>> cancels() override { return cancels_running; }

  Options options;
  ConnectParams params;
  mutable std::mutex lock;
  std::vector<std::string> statements;  ///< statement id n is statements[n - 1]
  std::once_flag resolver_made;
  std::unique_ptr<Resolver> names;  ///< for host names (helper threads), made when first needed
  std::shared_ptr<std::atomic<int>> cancels_running = std::make_shared<std::atomic<int>>(0);
  std::vector<std::shared_ptr<Pool>> pools;  ///< one per worker, made with the Database
  std::atomic<bool> closed{false};
};

namespace {

// A call whose deadline passed before it could send is not sent (rather than sent to be
// given up at once, its outcome unknown).
Error expired_before_sending() {
  return unsent_error(Errc::kTimedOut, "the deadline passed before the statement was sent");
}

}  // namespace

// --- Query -------------------------------------------------------------------------------

struct Query::Pending {
  std::shared_ptr<Pool> pool;
  std::optional<Statement> statement;
  std::string sql;
  std::deque<std::string> copies;  ///< the parameters' text and bytes (params points here)
  std::vector<Param> params;

  Pending(std::shared_ptr<Pool> p, const Statement* s, std::string_view text,
          std::span<const Param> given)
      : pool(std::move(p)), sql(text) {
    if (s != nullptr) statement = *s;
    for (const Param& param : given) {
      if (const auto* t = std::get_if<std::string_view>(&param)) {
        params.emplace_back(std::string_view(copies.emplace_back(*t)));
      } else if (const auto* b = std::get_if<Bytes>(&param)) {
        params.emplace_back(Bytes{copies.emplace_back(b->data)});
      } else {
        params.push_back(param);
      }
    }
  }
  /// Waits for a connection until `deadline` and sends on it.
  Query send(Deadline deadline) {
    auto connection = pool->pick(false, deadline);
    if (!connection) return Query::failed(std::move(connection.error()));
    if (deadline.expired()) return Query::failed(expired_before_sending());
    return (*connection)->send(statement ? &*statement : nullptr, sql, params, deadline);
  }
};

Query::Query(Query&& other) noexcept
    : pending_(std::move(other.pending_)),
      connection_(std::move(other.connection_)),
      sequence_(other.sequence_),
      outcome_(std::move(other.outcome_)),
      sent_(other.sent_) {
  other.outcome_.reset();
  if (connection_) connection_->rebind(sequence_, this);
}

Query& Query::operator=(Query&& other) noexcept {
  if (this != &other) {
    detach();
    pending_ = std::move(other.pending_);
    connection_ = std::move(other.connection_);
    sequence_ = other.sequence_;
    outcome_ = std::move(other.outcome_);
    sent_ = other.sent_;
    other.outcome_.reset();
    if (connection_) connection_->rebind(sequence_, this);
  }
  return *this;
}

Query::~Query() { detach(); }

void Query::detach() {
  if (pending_ && Worker::current() != nullptr) {
    // Started, never asked for: sent once a connection frees, its result thrown away (as for
    // a Query sent at once and dropped).
    spawn([pending = std::move(pending_)] {
      Query sent = pending->send(Deadline::never());
    }).detach();
  }
  pending_.reset();
  if (connection_) connection_->abandon(sequence_, /*cancel=*/false);
  connection_.reset();
}

Query Query::failed(Error why) {
  Query query;
  query.outcome_ = std::unexpected(std::move(why));
  return query;
}

Expected<Result> Query::result(Deadline deadline) {
  if (pending_) {
    auto pending = std::move(pending_);
    *this = pending->send(deadline);
  }
  if (!outcome_ && connection_) {
    Waiter waiter;
    waiter_ = &waiter;
    std::error_code ec = park(waiter, deadline);
    waiter_ = nullptr;
    if (!outcome_) {
      // Gave up first: the result is thrown away when it comes, the server asked to stop.
      if (connection_) connection_->abandon(sequence_, /*cancel=*/true);
      connection_.reset();
      return std::unexpected(
          ec == std::errc::timed_out
              ? client_error(Errc::kTimedOut,
                             "the deadline passed after the statement was sent: it may have run "
                             "(its outcome is unknown)")
              : client_error(Errc::kCanceled,
                             "the calling fiber was canceled after the statement was sent: it "
                             "may have run (its outcome is unknown)"));
    }
  }
  if (!outcome_ && sent_) {
    // Asked again after its result was taken or given up: what it did is not known here.
    return std::unexpected(client_error(
        Errc::kClosed, "the statement's result was already taken or given up: it may have run"));
  }
  if (!outcome_) return std::unexpected(unsent_error(Errc::kClosed, "no statement was sent"));
  Expected<Result> out = std::move(*outcome_);
  outcome_.reset();
  return out;
}

// --- Transaction -------------------------------------------------------------------------

Transaction::Transaction(std::shared_ptr<Pool> pool, std::shared_ptr<Connection> connection)
    : pool_(std::move(pool)), connection_(std::move(connection)) {}

Transaction::Transaction(Transaction&& other) noexcept
    : pool_(std::move(other.pool_)), connection_(std::move(other.connection_)) {}

Transaction::~Transaction() {
  // Ended without commit() or rollback(): ROLLBACK goes out pipelined, nobody waits for it,
  // and the connection is shared again at once (what comes next runs after the ROLLBACK).
  if (connection_) Query rollback = send_end("ROLLBACK");
  release();
}

Query Transaction::send_end(std::string_view sql, Deadline deadline) {
  Query end = connection_->send(nullptr, sql, {}, deadline);
  // Not sent, the transaction stays open on the server: the connection must never be shared
  // so. Closed instead, the server rolls it back.
  if (end.outcome_ && !end.outcome_->has_value() && end.outcome_->error().not_sent) {
    connection_->shut(Errc::kConnectionLost, "a transaction's end could not be sent");
  }
  return end;
}

void Transaction::release() {
  if (connection_ && pool_) pool_->release(connection_.get());
  connection_.reset();
  pool_.reset();
}

Query Transaction::start(const Statement& statement, std::span<const Param> params) {
  if (!connection_) return Query::failed(unsent_error(Errc::kClosed, "the transaction has ended"));
  return connection_->send(&statement, {}, params);
}

Query Transaction::start(std::string_view sql, std::span<const Param> params) {
  if (!connection_) return Query::failed(unsent_error(Errc::kClosed, "the transaction has ended"));
  return connection_->send(nullptr, sql, params);
}

Expected<Result> Transaction::query(const Statement& statement, std::span<const Param> params,
                                    Deadline deadline) {
  if (deadline.expired()) return std::unexpected(expired_before_sending());
  if (!connection_)
    return std::unexpected(unsent_error(Errc::kClosed, "the transaction has ended"));
  return connection_->send(&statement, {}, params, deadline).result(deadline);
}

Expected<Result> Transaction::query(std::string_view sql, std::span<const Param> params,
                                    Deadline deadline) {
  if (deadline.expired()) return std::unexpected(expired_before_sending());
  if (!connection_)
    return std::unexpected(unsent_error(Errc::kClosed, "the transaction has ended"));
  return connection_->send(nullptr, sql, params, deadline).result(deadline);
}

Expected<void> Transaction::commit(Deadline deadline) {
  if (!connection_)
    return std::unexpected(unsent_error(Errc::kClosed, "the transaction has ended"));
  auto done = send_end("COMMIT", deadline).result(deadline);
  release();
  if (!done) return std::unexpected(done.error());
  // The server answers COMMIT in a failed transaction with ROLLBACK, and no error.
  if (done->command() == "ROLLBACK") {
    return std::unexpected(Error{make_error_code(Errc::kServerError), "25P02",
                                 "the transaction had failed: rolled back"});
  }
  return {};
}

Expected<void> Transaction::rollback(Deadline deadline) {
  if (!connection_)
    return std::unexpected(unsent_error(Errc::kClosed, "the transaction has ended"));
  auto done = send_end("ROLLBACK", deadline).result(deadline);
  release();
  if (!done) return std::unexpected(done.error());
  return {};
}

// --- Database ----------------------------------------------------------------------------

Database::Database(Runtime& runtime, Options options)
    : shared_(std::make_shared<Shared>(std::move(options))), runtime_(&runtime) {
  for (std::size_t i = 0; i < runtime.size(); ++i) {
    shared_->pools.push_back(
        std::make_shared<Pool>(shared_->options, std::weak_ptr<Catalog>(shared_)));
  }
}

Database::~Database() { close(); }

Statement Database::prepare(std::string sql) {
  std::lock_guard guard(shared_->lock);
  shared_->statements.push_back(std::move(sql));
  return Statement{static_cast<std::uint32_t>(shared_->statements.size())};
}

Pool* Database::pool_here() const {
  Worker* worker = Worker::current();
  if (worker == nullptr || &worker->runtime() != runtime_ || shared_->closed.load()) {
    return nullptr;
  }
  return shared_->pools[worker->index()].get();
}

Expected<std::shared_ptr<Connection>> Database::pick(bool exclusive, Deadline deadline) const {
  Pool* pool = pool_here();
  if (pool == nullptr) {
    return std::unexpected(
        shared_->closed.load()
            ? unsent_error(Errc::kClosed, "the database is closed")
            : unsent_error(Errc::kNotOnWorker, "called outside a fiber of the database's runtime"));
  }
  return pool->pick(exclusive, deadline);
}

Query Database::start(const Statement& statement, std::span<const Param> params) {
  return start_now_or_later(&statement, {}, params);
}

Query Database::start(std::string_view sql, std::span<const Param> params) {
  return start_now_or_later(nullptr, sql, params);
}

Query Database::start_now_or_later(const Statement* statement, std::string_view sql,
                                   std::span<const Param> params) {
  // With no connection free and none opening (transactions hold them, or the pool is full and
  // behind), it returns at once and result() sends it: its deadline bounds the wait. While one
  // opens, it waits for it (bounded by the connect timeout) so that the statements started in
  // turn go out pipelined, in order.
  Pool* pool = pool_here();
  bool wait = pool != nullptr && pool->opening();
  auto connection = pick(false, wait ? Deadline::never() : Deadline::no_wait());
  if (connection) return (*connection)->send(statement, sql, params);
  if (connection.error().code != make_error_code(Errc::kTimedOut)) {
    return Query::failed(connection.error());
  }
  Query later;
  later.pending_ = std::make_shared<Query::Pending>(shared_->pools[Worker::current()->index()],
                                                    statement, sql, params);
  return later;
}

Expected<Result> Database::query(const Statement& statement, std::span<const Param> params,
                                 Deadline deadline) {
  auto connection = pick(false, deadline);
  if (!connection) return std::unexpected(connection.error());
  if (deadline.expired()) return std::unexpected(expired_before_sending());
  return (*connection)->send(&statement, {}, params, deadline).result(deadline);
}

Expected<Result> Database::query(std::string_view sql, std::span<const Param> params,
                                 Deadline deadline) {
  auto connection = pick(false, deadline);
  if (!connection) return std::unexpected(connection.error());
  if (deadline.expired()) return std::unexpected(expired_before_sending());
  return (*connection)->send(nullptr, sql, params, deadline).result(deadline);
}

Expected<Transaction> Database::begin(Deadline deadline) {
  auto connection = pick(true, deadline);
  if (!connection) return std::unexpected(connection.error());
  auto& pool = shared_->pools[Worker::current()->index()];
  // BEGIN goes out pipelined, nobody waits for it. Not sent, the statements after it would
  // each be a transaction of their own: the transaction is refused instead.
  Query begin = (*connection)->send(nullptr, "BEGIN", {});
  if (begin.outcome_ && !begin.outcome_->has_value()) {
    pool->release(connection->get());
    return std::unexpected(begin.outcome_->error());
  }
  return Transaction(pool, std::move(*connection));
}

Database::Stats Database::stats() const {
  Pool* pool = pool_here();
  return pool != nullptr ? pool->stats() : Stats{};
}

void Database::close() {
  if (shared_->closed.exchange(true)) return;
  const auto& pools = shared_->pools;
  // Each pool is its worker's: it is closed there (a stopped worker never runs it, but its
  // connections ended with its fibers).
  Worker* here = Worker::current();
  for (std::size_t i = 0; i < pools.size(); ++i) {
    Worker& worker = runtime_->worker(i);
    if (&worker == here) {
      pools[i]->close_all();
    } else {
      worker.post([pool = pools[i]] { pool->close_all(); });
    }
  }
}

}  // namespace spindle::pg
