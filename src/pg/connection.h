#pragma once
// One PostgreSQL connection in pipeline mode (private to src/pg). Statements are written by the
// fibers that send them; one driver fiber per connection reads the results and hands each to
// the Query waiting for it, in order. Everything happens on the connection's worker's thread,
// but for cancel requests, each made on a thread of its own (libpq's PQcancel blocks).

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/io/deadline.h"
#include "spindle/io/reactor.h"
#include "spindle/pg/database.h"

namespace spindle {
class Worker;
class Resolver;
class Event;
}  // namespace spindle

namespace spindle::pg {

class Pool;
struct ConnectParams;

/// An Error of spindle's own (no SQLSTATE): `code` and what happened.
inline Error client_error(Errc code, std::string message) {
  return Error{make_error_code(code), {}, std::move(message)};
}

/// The same for a statement that never left the client (Error::not_sent).
inline Error unsent_error(Errc code, std::string message) {
  Error e = client_error(code, std::move(message));
  e.not_sent = true;
  return e;
}

/// What a connection needs of its Database: the statements' SQL, how to connect, the resolver
/// for host names and the count of cancel requests on their way.
struct Catalog {
  /// The SQL of statement `id` (registered with Database::prepare); none for an id it never
  /// gave.
  virtual std::optional<std::string> sql(std::uint32_t id) const = 0;
  virtual const ConnectParams& connect_params() const = 0;
  /// Made when first needed (a conninfo naming hosts): helper threads of its own.
  virtual Resolver& resolver() = 0;
  /// Cancel requests on their way, each on a thread of its own; shared with those threads.
  virtual std::shared_ptr<std::atomic<int>> cancels() = 0;
  virtual ~Catalog() = default;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  /// Connects on the calling worker (connect.h: names resolved on helper threads, libpq's
  /// non-blocking connect on the reactor) until `deadline`, then takes the connection into
  /// pipeline mode and starts its driver. Errors are Errc::kConnectFailed.
  static Expected<std::shared_ptr<Connection>> open(const Options& options,
                                                    std::shared_ptr<Catalog> catalog,
                                                    std::weak_ptr<Pool> pool, Deadline deadline);
  ~Connection();

  /// Sends a prepared statement (its Parse first, the first time on this connection) or an
  /// unnamed one, each with its own Sync. The Query holds an error if it could not be sent
  /// (then Error::not_sent). Waits while a cancel request is on its way (a transaction's
  /// connection: what is sent then could be hit by it), until `deadline` (then kTimedOut).
  Query send(const Statement* statement, std::string_view sql, std::span<const Param> params,
             Deadline deadline = Deadline::never());

  /// Statements sent whose results have not all come.
  std::size_t in_flight() const { return in_flight_; }
  /// How long the server has answered nothing here while it holds a statement, at `now`: since
  /// the last answers read, or the send of the oldest statement if later (zero when none).
  std::chrono::nanoseconds stalled_for(Clock::time_point now) const {
    return fifo_.empty() ? std::chrono::nanoseconds(0)
                         : now - std::max(fifo_.front().sent_at, last_answer_);
  }
  /// Bytes from the server wait to be read (a zero-timeout poll: for the rare check).
  bool answers_waiting() const;
  /// The server's recent time per statement answered here while it was behind (zero until one
  /// was answered).
  std::chrono::nanoseconds per_statement() const { return per_statement_; }
  /// New calls may be sent on it: not broken or closing, and its server has not ended the
  /// session (a FATAL came, or the reactor saw it hang up, before its driver read the end).
  bool usable() const { return !broken_ && !retiring_ && !(slot_ != nullptr && slot_->hung_up); }
  /// Usable, no call on it gave up unanswered and no cancel request is on its way: new calls
  /// may join it.
  bool healthy() const { return usable() && given_up_ == 0 && !canceling_; }
  /// Taken by a transaction (no other call shares it meanwhile).
  bool reserved = false;
  /// Kept free of new calls so that it drains for the transaction first in line (Pool).
  bool promised = false;
  /// Handed to a waiting call that has not sent yet (Pool counts it as a statement).
  std::size_t pending_picks = 0;
  std::chrono::steady_clock::time_point born() const { return born_; }
  /// Closes it once its calls are answered (max_lifetime, or the pool closing).
  void retire();
  /// Fails every call on it with `why` and closes it now.
  void shut(Errc why, std::string message = "the connection was closed");

  // Query's side.
  void rebind(std::uint64_t sequence, Query* owner);
  /// The owner is gone: its result is thrown away when it comes. `gave_up` (its deadline
  /// passed, or its fiber was canceled): if the server runs that statement now and nothing is
  /// pipelined behind it, a cancel request goes to the server; the connection takes no new
  /// calls until its calls that gave up are answered, and is closed if the server goes
  /// Options::cancel_grace without a sign of life while nobody waits for what it runs.
  void abandon(std::uint64_t sequence, bool gave_up);

 private:
  struct Entry {
    enum Kind { kParse, kExecute } kind;
    Query* owner = nullptr;
    std::uint32_t statement = 0;   ///< the prepared statement's id (0: unnamed)
    std::uint32_t generation = 0;  ///< of the statement names it used
    std::uint32_t version = 0;     ///< of its statement's name (renamed after a 0A000)
    bool sync_pending = false;     ///< the results are in, the Sync's not yet
    bool gave_up = false;          ///< its caller gave up unanswered (abandon)
    Clock::time_point sent_at;     ///< when it was written to libpq
    /// Sent relying on a Parse that failed: its "no such statement" (26000) is that error.
    std::optional<Error> parse_error;
    std::optional<Expected<Result>> outcome;
  };

  Connection(PGconn* conn, IoSlot* slot, std::shared_ptr<Catalog> catalog, std::weak_ptr<Pool> pool,
             const Options& options);
  /// The first check of a statement: an error if it cannot be sent (nothing written then).
  std::optional<Error> refusal(std::span<const Param> params) const;
  /// The name of prepared statement `id` on this connection, with its Parse written first if
  /// it is not prepared here yet; an error if it cannot be sent.
  Expected<std::string> prepared_name(std::uint32_t id);
  /// The parameters in libpq's arrays (param_values_ ...), text in param_text_.
  void encode(std::span<const Param> params);
  /// The statement names in use are gone from the session (DISCARD ALL, DEALLOCATE, a
  /// pooler's other session): later statements are prepared again under new names.
  void forget_prepared();
  /// The name statement `id` has on this connection now.
  std::string name_of(std::uint32_t id) const;
  /// Statement `id` failed 0A000 (its table changed shape: its plan cannot be used again):
  /// it is prepared under a new name for the next call, the old name dropped (drop_stale).
  void reprepare(std::uint32_t id);
  /// Sends the DEALLOCATE of the names reprepare() left (on a shared connection only: in a
  /// transaction it could fail with the transaction).
  void drop_stale();
  /// Sends spindle's session settings (and the client_encoding of the connect) first if a
  /// statement may have changed them or the server reports another value now.
  void restore_settings();
  /// Until no cancel request is on its way: timed_out at `deadline`, or why it cannot send.
  std::error_code wait_for_cancel(Deadline deadline);
  void send_cancel();
  void await_cancel(const std::shared_ptr<Event>& done);
  void flush();

  void drive();
  /// When the driver stops waiting: the idle timeout, or the end of the cancel's grace.
  Deadline wait_deadline() const;
  bool troubled() const { return given_up_ > 0 || canceling_; }
  /// Troubled, and nobody waits for any statement on it (their callers gave up, or left): then
  /// the server's silence for the grace closes the connection. A call whose caller still waits
  /// is never failed for another's silence: its own deadline bounds it.
  bool stalled() const;
  /// Wakes the driver to wait again with what wait_deadline() says now.
  void wake_driver();
  /// Takes every result libpq has complete; false if the connection broke.
  bool take_results();
  /// Rows of a COPY TO STDOUT, thrown away: false while more are to come.
  bool drain_copy_out();
  /// One result of the execution at the front; false if the connection cannot go on.
  bool on_result(Entry& e, ExecStatusType status, PGresult* r);
  /// The front execution's Sync came: its outcome goes to its caller.
  void complete_front();
  /// Takes the answers of the last read (take_results) into per_statement().
  void pace();
  void deliver(Query* owner, Expected<Result> outcome);
  void fail_all(Errc why, const std::string& message);
  void finish();
  Error server_error(const PGresult* result) const;
  /// libpq's notice receiver: a FATAL or PANIC that came while no statement was running (the
  /// server ends the session: pg_terminate_backend, a shutdown) retires the connection.
  static void on_notice(void* self, const PGresult* notice);
  /// The server said it ends the session: no new call is sent on it; the driver reads its end.
  void session_ended();

  PGconn* conn_;
  IoSlot* slot_;
  std::shared_ptr<PGcancel> cancel_;  ///< shared with cancel threads still on their way
  std::shared_ptr<Catalog> catalog_;
  std::weak_ptr<Pool> pool_;
  Worker* worker_ = nullptr;
  std::chrono::milliseconds idle_timeout_;
  std::chrono::milliseconds grace_;
  std::chrono::steady_clock::time_point born_;
  std::deque<Entry> fifo_;
  std::uint64_t first_sequence_ = 0;  ///< the sequence of fifo_.front()
  std::size_t in_flight_ = 0;
  /// Smoothed, per read: the time from the previous read (or the send of the first statement
  /// answered, if later) over the statements answered; while the server is behind only.
  std::chrono::nanoseconds per_statement_{0};
  Clock::time_point last_answer_;          ///< when the last answers were read
  Clock::time_point first_answered_sent_;  ///< the send of the first answered since then
  std::size_t answered_ = 0;               ///< statements answered since then
  std::size_t given_up_ = 0;               ///< entries in fifo_ whose callers gave up unanswered
  /// The last sign of life while troubled: a byte from the server, a statement completed, a
  /// call given up (the grace of stalled() counts from it).
  std::chrono::steady_clock::time_point quiet_since_;
  std::vector<std::uint8_t> prepared_;   ///< by statement id: a PreparedState
  std::uint32_t generation_ = 0;         ///< of the statement names (forget_prepared)
  std::vector<std::uint32_t> versions_;  ///< by statement id: renames by reprepare()
  std::vector<std::string> stale_;       ///< names reprepare() left, to DEALLOCATE
  bool housekeeping_ = false;            ///< drop_stale() is sending (not a caller's statement)
  Error last_parse_error_;
  std::vector<Waiter*> cancel_waiters_;  ///< sends waiting for the cancel request's answer
  bool canceling_ = false;               ///< a cancel request is on its way
  bool copy_out_ = false;                ///< rows of a COPY TO STDOUT are coming
  bool flushing_ = false;
  bool broken_ = false;
  bool retiring_ = false;
  bool session_ended_ = false;  ///< the server sent a FATAL or PANIC
  bool shutting_ = false;
  /// A SET / RESET / DISCARD went out: spindle's session settings are set again before the
  /// next statement of a shared connection.
  bool settings_changed_ = false;
  std::string client_encoding_;  ///< the session's at connect, kept for every caller
  bool restoring_ = false;       ///< restore_settings() is sending
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  std::uint64_t restore_sequence_ = kNone;  ///< the last restore sent (restore_settings)
  bool evicted_ = false;                    ///< closed for not answering after a call gave up
  Errc shut_reason_ = Errc::kClosed;
  std::string shut_message_;
  std::string param_text_;                 ///< scratch for the text of parameters
  std::vector<const char*> param_values_;  ///< scratch for libpq's parameter arrays
  std::vector<int> param_lengths_, param_formats_;
  std::vector<std::size_t> param_offsets_;
};

}  // namespace spindle::pg
