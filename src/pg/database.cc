// Database, Query and Transaction: the calls, routed to the calling worker's pool.
#include "spindle/pg/database.h"

#include <mutex>

#include "connection.h"
#include "pool.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/waiter.h"
#include "spindle/fiber/worker.h"
#include "spindle/sync/blocking_pool.h"

namespace spindle::pg {
struct Database::Shared : Catalog {
  explicit Shared(Options o) : options(std::move(o)) {}

  std::string sql(std::uint32_t id) const override {
    std::lock_guard guard(lock);
    return statements.at(id - 1);
  }
  BlockingPool& helpers() override { return helper_threads; }

  Options options;
  mutable std::mutex lock;
  std::vector<std::string> statements;       ///< statement id n is statements[n - 1]
  BlockingPool helper_threads{2};            ///< connects and cancel requests (libpq blocks there)
  std::vector<std::shared_ptr<Pool>> pools;  ///< one per worker, made with the Database
  std::atomic<bool> closed{false};
};

// --- Query -------------------------------------------------------------------------------

Query::Query(Query&& other) noexcept
    : connection_(std::move(other.connection_)),
      sequence_(other.sequence_),
      outcome_(std::move(other.outcome_)) {
  other.outcome_.reset();
  if (connection_) connection_->rebind(sequence_, this);
}

Query& Query::operator=(Query&& other) noexcept {
  if (this != &other) {
    detach();
    connection_ = std::move(other.connection_);
    sequence_ = other.sequence_;
    outcome_ = std::move(other.outcome_);
    other.outcome_.reset();
    if (connection_) connection_->rebind(sequence_, this);
  }
  return *this;
}

Query::~Query() { detach(); }

void Query::detach() {
  if (connection_) connection_->abandon(sequence_, /*cancel=*/false);
  connection_.reset();
}

Query Query::failed(Error why) {
  Query query;
  query.outcome_ = std::unexpected(std::move(why));
  return query;
}

Expected<Result> Query::result(Deadline deadline) {
  if (!outcome_ && connection_) {
    Waiter waiter;
    waiter_ = &waiter;
    std::error_code ec = park(waiter, deadline);
    waiter_ = nullptr;
    if (!outcome_) {
      // Gave up first: the result is thrown away when it comes, the server asked to stop.
      if (connection_) connection_->abandon(sequence_, /*cancel=*/true);
      connection_.reset();
      return std::unexpected(ec == std::errc::timed_out
                                 ? client_error(Errc::kTimedOut, "the statement's deadline passed")
                                 : client_error(Errc::kCanceled, "the calling fiber was canceled"));
    }
  }
  if (!outcome_) return std::unexpected(client_error(Errc::kClosed, "no statement was sent"));
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
  if (connection_) Query rollback = connection_->send(nullptr, "ROLLBACK", {});
  release();
}

void Transaction::release() {
  if (connection_ && pool_) pool_->release(connection_.get());
  connection_.reset();
  pool_.reset();
}

Query Transaction::start(const Statement& statement, std::span<const Param> params) {
  if (!connection_) return Query::failed(client_error(Errc::kClosed, "the transaction has ended"));
  return connection_->send(&statement, {}, params);
}

Query Transaction::start(std::string_view sql, std::span<const Param> params) {
  if (!connection_) return Query::failed(client_error(Errc::kClosed, "the transaction has ended"));
  return connection_->send(nullptr, sql, params);
}

Expected<Result> Transaction::query(const Statement& statement, std::span<const Param> params,
                                    Deadline deadline) {
  return start(statement, params).result(deadline);
}

Expected<Result> Transaction::query(std::string_view sql, std::span<const Param> params,
                                    Deadline deadline) {
  return start(sql, params).result(deadline);
}

Expected<void> Transaction::commit(Deadline deadline) {
  auto done = start("COMMIT").result(deadline);
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
  auto done = start("ROLLBACK").result(deadline);
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
            ? client_error(Errc::kClosed, "the database is closed")
            : client_error(Errc::kNotOnWorker, "called outside a fiber of the database's runtime"));
  }
  return pool->pick(exclusive, deadline);
}

Query Database::start(const Statement& statement, std::span<const Param> params) {
  auto connection = pick(false, Deadline::never());
  if (!connection) return Query::failed(connection.error());
  return (*connection)->send(&statement, {}, params);
}

Query Database::start(std::string_view sql, std::span<const Param> params) {
  auto connection = pick(false, Deadline::never());
  if (!connection) return Query::failed(connection.error());
  return (*connection)->send(nullptr, sql, params);
}

Expected<Result> Database::query(const Statement& statement, std::span<const Param> params,
                                 Deadline deadline) {
  auto connection = pick(false, deadline);
  if (!connection) return std::unexpected(connection.error());
  return (*connection)->send(&statement, {}, params).result(deadline);
}

Expected<Result> Database::query(std::string_view sql, std::span<const Param> params,
                                 Deadline deadline) {
  auto connection = pick(false, deadline);
  if (!connection) return std::unexpected(connection.error());
  return (*connection)->send(nullptr, sql, params).result(deadline);
}

Expected<Transaction> Database::begin(Deadline deadline) {
  auto connection = pick(true, deadline);
  if (!connection) return std::unexpected(connection.error());
  // BEGIN goes out pipelined: if it fails, so do the statements after it.
  Query begin = (*connection)->send(nullptr, "BEGIN", {});
  return Transaction(shared_->pools[Worker::current()->index()], std::move(*connection));
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
