#pragma once
// One PostgreSQL connection in pipeline mode (private to src/pg). Statements are written by the
// fibers that send them; one driver fiber per connection reads the results and hands each to
// the Query waiting for it, in order. Everything happens on the connection's worker's thread.

#include <libpq-fe.h>

#include <chrono>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/io/deadline.h"
#include "spindle/io/reactor.h"
#include "spindle/pg/database.h"

namespace spindle {
class Worker;
class BlockingPool;
}  // namespace spindle

namespace spindle::pg {

class Pool;

/// An Error of spindle's own (no SQLSTATE): `code` and what happened.
inline Error client_error(Errc code, std::string message) {
  return Error{make_error_code(code), {}, std::move(message)};
}

/// What a connection needs of its Database: the statements' SQL and the helper threads.
struct Catalog {
  /// The SQL of statement `id` (registered with Database::prepare).
  virtual std::string sql(std::uint32_t id) const = 0;
  virtual BlockingPool& helpers() = 0;
  virtual ~Catalog() = default;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  /// Connects (on a helper thread: libpq resolves names and negotiates TLS blocking), then
  /// takes the connection into pipeline mode on the calling worker and starts its driver.
  static Expected<std::shared_ptr<Connection>> open(const Options& options,
                                                    std::shared_ptr<Catalog> catalog,
                                                    std::weak_ptr<Pool> pool);
  ~Connection();

  /// Sends a prepared statement (its Parse first, the first time on this connection) or an
  /// unnamed one, each with its own Sync. The Query holds an error if it could not be sent.
  Query send(const Statement* statement, std::string_view sql, std::span<const Param> params);

  /// Statements sent whose results have not all come.
  std::size_t in_flight() const { return in_flight_; }
  bool usable() const { return !broken_ && !retiring_; }
  /// Taken by a transaction (no other call shares it meanwhile).
  bool reserved = false;
  std::chrono::steady_clock::time_point born() const { return born_; }
  /// Closes it once its calls are answered (max_lifetime, or the pool closing).
  void retire();
  /// Fails every call on it with `why` and closes it now.
  void shut(Errc why);

  // Query's side.
  void rebind(std::uint64_t sequence, Query* owner);
  /// The owner gave up (deadline, cancellation, destroyed): its result is thrown away when it
  /// comes; if the server is running it now, `cancel` asks the server to stop it.
  void abandon(std::uint64_t sequence, bool cancel);

 private:
  struct Entry {
    enum Kind { kParse, kExecute } kind;
    Query* owner = nullptr;
    std::uint32_t statement = 0;  ///< for kParse: which (unprepared again if it fails)
    bool sync_pending = false;    ///< the results are in, the Sync's not yet
    std::optional<Expected<Result>> outcome;
  };

  Connection(PGconn* conn, std::shared_ptr<Catalog> catalog, std::weak_ptr<Pool> pool,
             const Options& options);
  void drive();
  /// Takes every result libpq has complete; false if the connection broke.
  bool take_results();
  void deliver(Query* owner, Expected<Result> outcome);
  void flush();
  void fail_all(Errc why, const std::string& message);
  void finish();
  Error server_error(const PGresult* result) const;

  PGconn* conn_;
  PGcancel* cancel_ = nullptr;
  std::shared_ptr<Catalog> catalog_;
  std::weak_ptr<Pool> pool_;
  Worker* worker_ = nullptr;
  IoSlot* slot_ = nullptr;
  std::chrono::milliseconds idle_timeout_;
  std::chrono::steady_clock::time_point born_;
  std::deque<Entry> fifo_;
  std::uint64_t first_sequence_ = 0;  ///< the sequence of fifo_.front()
  std::size_t in_flight_ = 0;
  std::vector<bool> prepared_;  ///< by statement id
  Error last_parse_error_;
  bool flushing_ = false;
  bool broken_ = false;
  bool retiring_ = false;
  bool shutting_ = false;
  Errc shut_reason_ = Errc::kClosed;
  std::string param_text_;                 ///< scratch for the text of parameters
  std::vector<const char*> param_values_;  ///< scratch for libpq's parameter arrays
  std::vector<int> param_lengths_, param_formats_;
  std::vector<std::size_t> param_offsets_;
};

}  // namespace spindle::pg
