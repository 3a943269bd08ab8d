#include "connection.h"

#include <fmt/format.h>

#include <charconv>
#include <cstring>
#include <thread>

#include "connect.h"
#include "pool.h"
#include "spindle/base/log.h"
#include "spindle/fiber/io_wait.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/waiter.h"
#include "spindle/fiber/worker.h"
#include "spindle/sync/event.h"
#include "statement_text.h"

namespace spindle::pg {
namespace {

// libpq's messages end with a newline.
std::string trimmed(const char* message) {
  std::string text = message ? message : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// Names of generation and version 0 keep the form they always had.
std::string statement_name(std::uint32_t id, std::uint32_t generation, std::uint32_t version) {
  if (version != 0) return fmt::format("spindle_{}_{}_v{}", id, generation, version);
  return generation == 0 ? fmt::format("spindle_{}", id)
                         : fmt::format("spindle_{}_{}", id, generation);
}

// The version of statement `id`'s name (Connection::versions_; 0 until renamed).
std::uint32_t version_of(const std::vector<std::uint32_t>& versions, std::uint32_t id) {
  return id < versions.size() ? versions[id] : 0;
}

// What a connection knows of a prepared statement (Connection::prepared_).
enum PreparedState : std::uint8_t {
  kNotPrepared = 0,
  kPrepared,
  kPreparedDropsPrepared,     ///< a DISCARD / DEALLOCATE statement, prepared
  kPreparedOpensTransaction,  ///< a BEGIN / START TRANSACTION, prepared (in a transaction)
};

// PostgreSQL takes no message over 1 GiB: neither a value nor a Bind of all the values.
constexpr std::size_t kMaxValue = std::size_t{1} << 30;
// A generous bound on a Bind's bytes besides the values (lengths, formats, names).
constexpr std::size_t kMessageHead = 64;

// The bytes a parameter takes in a Bind, at the most.
std::size_t param_size(const Param& p) {
  if (const auto* text = std::get_if<std::string_view>(&p)) return text->size();
  if (const auto* raw = std::get_if<Bytes>(&p)) return raw->data.size();
  return 64;  // a number or a time, as text
}
// Cancel requests on their way at once, per Database (each holds a thread while it connects):
// past it, a call that gives up sends none, and its connection is closed if it stays silent.
constexpr int kMaxCancels = 16;

// format_timestamp writes years 1 to 32767 (std::chrono::year's range, and no BC): a time
// outside would go as another year.
bool writable_timestamp(Timestamp t) {
  using namespace std::chrono;
  static const sys_days first = year(1) / January / 1, last = year(32767) / December / 31;
  return t >= first && t < last + days(1);
}

// A shared connection left in a transaction block would run other callers' statements in it
// (and fail them all once it is aborted): transactions are opened by Database::begin alone.
Error transaction_outside_begin() {
  return unsent_error(Errc::kUnsupported,
                      "BEGIN / START TRANSACTION outside Database::begin would leave a shared "
                      "connection in a transaction block; use Database::begin()");
}

Error unsupported_copy() {
  return client_error(Errc::kUnsupported,
                      "COPY FROM STDIN / TO STDOUT is not carried by spindle::pg (its data would "
                      "share the pipeline); use INSERT, or COPY with a server-side file");
}

}  // namespace

Expected<std::shared_ptr<Connection>> Connection::open(const Options& options,
                                                       std::shared_ptr<Catalog> catalog,
                                                       std::weak_ptr<Pool> pool,
                                                       Deadline deadline) {
  Worker* worker = Worker::current();
  if (worker == nullptr)
    return std::unexpected(unsent_error(Errc::kNotOnWorker, "not on a worker"));
  auto opened = connect(catalog->connect_params(), catalog->resolver(), deadline);
  if (!opened) return std::unexpected(opened.error());
  PGconn* conn = opened->conn;
  if (PQsetnonblocking(conn, 1) != 0 || PQenterPipelineMode(conn) != 1) {
    Error why = unsent_error(Errc::kConnectFailed, trimmed(PQerrorMessage(conn)));
    worker->reactor().release(opened->slot);
    PQfinish(conn);
    return std::unexpected(std::move(why));
  }
  std::shared_ptr<Connection> self(
      new Connection(conn, opened->slot, std::move(catalog), std::move(pool), options));
  self->worker_ = worker;
  // A session that came up without spindle's settings (a pooler dropped `options`, or the
  // conninfo's own set others): one statement, first on the connection, sets them.
  const char* encoding = PQparameterStatus(conn, "client_encoding");
  self->client_encoding_ = encoding != nullptr ? encoding : "";
  if (!session_settings_in_force(conn) || self->catalog_->connect_params().own_options)
    Query setup = self->send(nullptr, kSessionSettingsSql, {});
  spawn([self] { self->drive(); }).detach();
  return self;
}

Connection::Connection(PGconn* conn, IoSlot* slot, std::shared_ptr<Catalog> catalog,
                       std::weak_ptr<Pool> pool, const Options& options)
    : conn_(conn),
      slot_(slot),
      cancel_(PQgetCancel(conn), [](PGcancel* c) { PQfreeCancel(c); }),
      catalog_(std::move(catalog)),
      pool_(std::move(pool)),
      idle_timeout_(options.idle_timeout),
      grace_(options.cancel_grace),
      born_(std::chrono::steady_clock::now()) {
  PQsetNoticeReceiver(conn_, &Connection::on_notice, this);
}

Connection::~Connection() {
  if (conn_ != nullptr) PQfinish(conn_);
}

// --- Sending -------------------------------------------------------------------------------

std::optional<Error> Connection::refusal(std::span<const Param> params) const {
  if (!usable()) {
    bool lost = broken_ || session_ended_ || slot_->hung_up;
    return unsent_error(lost ? Errc::kConnectionLost : Errc::kClosed,
                        lost ? "the server ended the session" : "the connection is closing");
  }
  // What libpq cannot carry is refused before anything is queued on the connection.
  if (params.size() > 65535) return unsent_error(Errc::kBadValue, "more than 65535 parameters");
  std::size_t message = kMessageHead;
  for (const Param& p : params) {
    message += kMessageHead + param_size(p);
    const auto* text = std::get_if<std::string_view>(&p);
    const auto* raw = std::get_if<Bytes>(&p);
    // PostgreSQL takes no value over 1 GiB (and libpq's lengths are ints).
    if ((text != nullptr && text->size() >= kMaxValue) ||
        (raw != nullptr && raw->data.size() >= kMaxValue)) {
      return unsent_error(Errc::kBadValue, "a parameter over 1 GiB");
    }
    if (message >= kMaxValue) {
      return unsent_error(Errc::kBadValue, "parameters over 1 GiB together (one message)");
    }
    if (const auto* t = std::get_if<Timestamp>(&p); t != nullptr && !writable_timestamp(*t)) {
      return unsent_error(Errc::kBadValue, "a timestamp outside the years 1 to 32767");
    }
    if (text != nullptr && text->find('\0') != std::string_view::npos) {
      return unsent_error(Errc::kBadValue,
                          "a text parameter holds a NUL byte (send bytes as pg::Bytes)");
    }
  }
  return std::nullopt;
}

Expected<std::string> Connection::prepared_name(std::uint32_t id) {
  if (id < prepared_.size() && prepared_[id] != kNotPrepared) {
    if (prepared_[id] == kPreparedOpensTransaction && !reserved) {
      return std::unexpected(transaction_outside_begin());
    }
    return name_of(id);
  }
  std::optional<std::string> text = catalog_->sql(id);
  if (!text) {
    return std::unexpected(
        unsent_error(Errc::kBadValue, "a Statement not prepared by this Database"));
  }
  if (prepared_.size() <= id) prepared_.resize(id + 1, kNotPrepared);
  StatementKind kind = classify_statement(*text);
  if (kind == StatementKind::kCopyThroughClient) {
    Error e = unsupported_copy();
    e.not_sent = true;
    return std::unexpected(std::move(e));
  }
  if (kind == StatementKind::kOpensTransaction && !reserved) {
    return std::unexpected(transaction_outside_begin());
  }
  std::string name = name_of(id);
  if (PQsendPrepare(conn_, name.c_str(), text->c_str(), 0, nullptr) != 1) {
    Error e = unsent_error(Errc::kConnectionLost, trimmed(PQerrorMessage(conn_)));
    shut(Errc::kConnectionLost, e.message);
    return std::unexpected(std::move(e));
  }
  prepared_[id] = kind == StatementKind::kDropsPrepared      ? kPreparedDropsPrepared
                  : kind == StatementKind::kOpensTransaction ? kPreparedOpensTransaction
                                                             : kPrepared;
  fifo_.push_back(Entry{Entry::kParse, nullptr, id, generation_, version_of(versions_, id)});
  fifo_.back().sent_at = Clock::now();
  return name;
}

void Connection::encode(std::span<const Param> params) {
  // Parameters go as text (NUL-terminated, one after another in one buffer), bytes in binary.
  // Scratch of the connection's, reused: no allocation per statement once they have grown.
  std::size_t n = params.size();
  param_values_.assign(n, nullptr);
  param_lengths_.assign(n, 0);
  param_formats_.assign(n, 0);
  param_offsets_.assign(n, std::string::npos);
  param_text_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    const Param& p = params[i];
    std::size_t at = param_text_.size();
    if (std::holds_alternative<std::nullptr_t>(p) || std::holds_alternative<Bytes>(p)) continue;
    param_offsets_[i] = at;
    if (const auto* b = std::get_if<bool>(&p)) {
      param_text_ += *b ? "t" : "f";
    } else if (const auto* v = std::get_if<std::int64_t>(&p)) {
      char digits[24];
      auto end = std::to_chars(digits, digits + sizeof digits, *v).ptr;
      param_text_.append(digits, end);
    } else if (const auto* d = std::get_if<double>(&p)) {
      char digits[32];
      auto end = std::to_chars(digits, digits + sizeof digits, *d).ptr;
      param_text_.append(digits, end);
    } else if (const auto* s = std::get_if<std::string_view>(&p)) {
      param_text_ += *s;
    } else if (const auto* t = std::get_if<Timestamp>(&p)) {
      param_text_ += format_timestamp(*t);
    }
    param_text_ += '\0';
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (const auto* b = std::get_if<Bytes>(&params[i])) {
      param_values_[i] = b->data.data();
      param_lengths_[i] = static_cast<int>(b->data.size());
      param_formats_[i] = 1;
    } else if (param_offsets_[i] != std::string::npos) {
      param_values_[i] = param_text_.data() + param_offsets_[i];
    }
  }
}

Query Connection::send(const Statement* statement, std::string_view sql,
                       std::span<const Param> params, Deadline deadline) {
  if (std::error_code ec = canceling_ ? wait_for_cancel(deadline) : std::error_code{}) {
    if (ec == std::errc::timed_out) {
      return Query::failed(unsent_error(Errc::kTimedOut,
                                        "the deadline passed while the server had not taken a "
                                        "cancel request yet: the statement was not sent"));
    }
    return Query::failed(unsent_error(usable() ? Errc::kCanceled : Errc::kConnectionLost,
                                      "gave up waiting for a cancel request's answer"));
  }
  if (auto refused = refusal(params)) return Query::failed(std::move(*refused));
  // A shared statement, or a transaction's BEGIN: spindle's settings hold for it.
  if (!restoring_ && (!reserved || (statement == nullptr &&
                                    classify_statement(sql) == StatementKind::kOpensTransaction))) {
    restore_settings();
    drop_stale();
  }
  std::string name;
  bool drops_prepared = false;
  if (statement != nullptr) {
    auto prepared = prepared_name(statement->id);
    if (!prepared) return Query::failed(std::move(prepared.error()));
    name = std::move(*prepared);
    drops_prepared = prepared_[statement->id] == kPreparedDropsPrepared;
  } else {
    StatementKind kind = housekeeping_ ? StatementKind::kPlain : classify_statement(sql);
    if (kind == StatementKind::kCopyThroughClient) {
      Error e = unsupported_copy();
      e.not_sent = true;
      return Query::failed(std::move(e));
    }
    if (kind == StatementKind::kOpensTransaction && !reserved) {
      return Query::failed(transaction_outside_begin());
    }
    drops_prepared = kind == StatementKind::kDropsPrepared;
    if (drops_prepared || kind == StatementKind::kChangesSettings) settings_changed_ = true;
  }
  encode(params);
  int count = static_cast<int>(params.size());
  int sent =
      statement != nullptr
          ? PQsendQueryPrepared(conn_, name.c_str(), count, param_values_.data(),
                                param_lengths_.data(), param_formats_.data(), 0)
          : PQsendQueryParams(conn_, std::string(sql).c_str(), count, nullptr, param_values_.data(),
                              param_lengths_.data(), param_formats_.data(), 0);
  if (sent != 1 || PQpipelineSync(conn_) != 1) {
    // libpq refused it whole (its connection is gone): nothing of it was written.
    Error e = unsent_error(Errc::kConnectionLost, trimmed(PQerrorMessage(conn_)));
    shut(Errc::kConnectionLost, e.message);
    return Query::failed(std::move(e));
  }
  Query query;
  std::uint32_t id = statement != nullptr ? statement->id : 0;
  fifo_.push_back(Entry{Entry::kExecute, &query, id, generation_, version_of(versions_, id)});
  fifo_.back().sent_at = Clock::now();
  ++in_flight_;
  query.connection_ = shared_from_this();
  query.sent_ = true;
  query.sequence_ = first_sequence_ + fifo_.size() - 1;
  if (drops_prepared) forget_prepared();  // the statements after it prepare again, renamed
  flush();
  return query;  // elided, or moved: a Query's move points the entry at its new place
}

void Connection::restore_settings() {
  const char* encoding = PQparameterStatus(conn_, "client_encoding");
  bool drifted =
      !session_settings_in_force(conn_) || (encoding != nullptr && client_encoding_ != encoding);
  // The server reports the values a restore sets only once it ran: no second one meanwhile.
  if (restore_sequence_ >= first_sequence_ && restore_sequence_ != kNone) drifted = false;
  if (!settings_changed_ && !drifted) return;
  settings_changed_ = false;
  std::string sql = kSessionSettingsSql;
  if (!client_encoding_.empty()) {
    sql += ", set_config('client_encoding', '" + client_encoding_ + "', false)";
  }
  // Pipelined ahead of the statement, nobody waits for it (as at connect).
  restoring_ = true;
  Query restore = send(nullptr, sql, {});
  restoring_ = false;
  restore_sequence_ = first_sequence_ + fifo_.size() - 1;
}

void Connection::forget_prepared() {
  ++generation_;
  std::fill(prepared_.begin(), prepared_.end(), kNotPrepared);
}

std::string Connection::name_of(std::uint32_t id) const {
  return statement_name(id, generation_, version_of(versions_, id));
}

void Connection::reprepare(std::uint32_t id) {
  if (id < prepared_.size() && prepared_[id] != kNotPrepared) stale_.push_back(name_of(id));
  if (versions_.size() <= id) versions_.resize(id + 1, 0);
  ++versions_[id];
  if (id < prepared_.size()) prepared_[id] = kNotPrepared;
}

void Connection::drop_stale() {
  // Pipelined ahead of the statement, nobody waits for it (as restore_settings).
  for (std::string& name : std::exchange(stale_, {})) {
    housekeeping_ = restoring_ = true;
    Query drop = send(nullptr, "DEALLOCATE " + name, {});
    housekeeping_ = restoring_ = false;
  }
}

void Connection::flush() {
  // One fiber flushes at a time; what others add meanwhile goes out with its loop.
  if (flushing_ || broken_) return;
  if (PQflush(conn_) <= 0) return;  // all written, or broken (the driver fails the calls)
  // The kernel took part of it: the rest is written by a fiber of its own, so that the caller
  // (whose deadline runs in result()) does not wait for the socket.
  flushing_ = true;
  spawn([self = shared_from_this()] {
    while (!self->broken_ && self->slot_ != nullptr) {
      if (wait_ready(*self->slot_, IoDirection::kWrite, Deadline::never())) break;
      if (self->broken_ || PQflush(self->conn_) <= 0) break;
    }
    self->flushing_ = false;
  }).detach();
}

// --- Giving up, and cancel requests ----------------------------------------------------------

void Connection::rebind(std::uint64_t sequence, Query* owner) {
  if (sequence >= first_sequence_ && sequence - first_sequence_ < fifo_.size()) {
    fifo_[sequence - first_sequence_].owner = owner;
  }
}

void Connection::abandon(std::uint64_t sequence, bool gave_up) {
  if (sequence < first_sequence_ || sequence - first_sequence_ >= fifo_.size()) return;
  std::size_t index = sequence - first_sequence_;
  Entry& e = fifo_[index];
  e.owner = nullptr;
  if (!gave_up || e.gave_up || broken_) {
    if (troubled()) wake_driver();  // the last caller waiting may have left: stalled() now
    return;
  }
  quiet_since_ = std::chrono::steady_clock::now();  // the grace counts from here at the least
  e.gave_up = true;
  ++given_up_;
  // A cancel stops whatever the server runs when it arrives: it is sent only for the execution
  // the server is on now (the first in the queue, its results not all in) with nothing behind
  // it, and nothing is sent after it until the server has taken it (send waits). Otherwise the
  // statement runs to its end, and the connection is closed if it stays silent too long.
  bool running = !e.sync_pending;
  for (std::size_t i = 0; i < index && running; ++i) running = fifo_[i].kind == Entry::kParse;
  if (running && index + 1 == fifo_.size() && !canceling_ && cancel_ != nullptr) send_cancel();
  wake_driver();  // to wait no longer than the grace
}

void Connection::send_cancel() {
  auto running = catalog_->cancels();
  if (running->fetch_add(1) >= kMaxCancels) {
    running->fetch_sub(1);
    return;
  }
  auto done = std::make_shared<Event>();
  try {
    std::thread([cancel = cancel_, done, running] {
      char message[256];
      if (PQcancel(cancel.get(), message, sizeof message) != 1) {
        log_warn("pg: cancel request failed: {}", message);
      }
      running->fetch_sub(1);
      done->set();
    }).detach();
  } catch (const std::system_error& e) {
    running->fetch_sub(1);
    log_warn("pg: no thread for a cancel request: {}", e.what());
    return;
  }
  canceling_ = true;
  spawn([self = shared_from_this(), done] { self->await_cancel(done); }).detach();
}

void Connection::await_cancel(const std::shared_ptr<Event>& done) {
  // PQcancel returns once the server has taken the request (it closes the cancel connection
  // after signalling the backend): a statement sent after that cannot be hit by it.
  std::error_code ec = done->wait(Deadline::after(grace_));
  canceling_ = false;
  if (ec == std::errc::timed_out && usable()) {
    evicted_ = true;
    shut(Errc::kConnectionLost, "the server did not take a cancel request within cancel_grace");
  }
  for (Waiter* w : std::exchange(cancel_waiters_, {})) w->notify();
  if (!troubled()) {
    if (auto pool = pool_.lock()) pool->changed();
  }
  wake_driver();
}

std::error_code Connection::wait_for_cancel(Deadline deadline) {
  while (canceling_ && usable()) {
    Waiter waiter;
    cancel_waiters_.push_back(&waiter);
    std::error_code ec = park(waiter, deadline);
    std::erase(cancel_waiters_, &waiter);
    if (ec) return ec;
  }
  return usable() ? std::error_code{} : std::make_error_code(std::errc::not_connected);
}

// --- The driver ----------------------------------------------------------------------------

void Connection::drive() {
  auto self = shared_from_this();  // alive until the driver ends
  for (;;) {
    if (PQconsumeInput(conn_) != 1) {
      fail_all(Errc::kConnectionLost, trimmed(PQerrorMessage(conn_)));
      break;
    }
    bool taken = take_results();
    pace();
    if (!taken) {
      fail_all(Errc::kConnectionLost, trimmed(PQerrorMessage(conn_)));
      break;
    }
    if (shutting_) {  // shut()
      fail_all(shut_reason_, shut_message_);
      break;
    }
    if (retiring_ && fifo_.empty()) break;
    // libpq reads once per call, and OpenSSL keeps records it read: no readiness edge will
    // come for bytes left there, so look before parking.
    if (input_pending(conn_)) continue;
    std::error_code ec = wait_ready(*slot_, IoDirection::kRead, wait_deadline());
    if (!ec) {
      if (troubled()) quiet_since_ = std::chrono::steady_clock::now();  // bytes came
      continue;
    }
    if (ec == std::errc::timed_out) {
      if (stalled() && std::chrono::steady_clock::now() >= quiet_since_ + grace_) {
        evicted_ = true;
        fail_all(Errc::kConnectionLost,
                 "PostgreSQL sent nothing within cancel_grace after a call gave up: the "
                 "connection was closed");
        break;
      }
      if (fifo_.empty() && !reserved && !troubled()) break;  // idle too long: closed
      continue;
    }
    if (this_fiber::stop_requested()) {  // the runtime stops
      fail_all(Errc::kClosed, "the runtime stopped");
      break;
    }
    // Woken to wait again (wake_driver), or by shut(): the loop's top sees which.
  }
  finish();
}

Deadline Connection::wait_deadline() const {
  Deadline until = Deadline::never();
  if (fifo_.empty() && !reserved && idle_timeout_.count() > 0) {
    until = Deadline::after(idle_timeout_);
  }
  if (stalled()) until = earliest(until, Deadline::at(quiet_since_ + grace_));
  return until;
}

bool Connection::stalled() const {
  if (!troubled()) return false;
  // Any caller still waiting (for the statement the server is on, or one behind it) keeps the
  // connection: its own deadline bounds its wait, and a server silent only because it has not
  // got all the statements yet (a slow uplink) is not a dead one.
  bool sent = false;
  for (const Entry& e : fifo_) {
    if (e.kind != Entry::kExecute) continue;
    if (e.owner != nullptr) return false;
    sent = true;
  }
  return sent || canceling_;
}

void Connection::wake_driver() {
  // The reader alone: a flusher may wait on the same slot for writing.
  if (slot_ == nullptr) return;
  if (Waiter* waiter = std::exchange(slot_->reader, nullptr)) {
    if (waiter->claim(WakeReason::kCanceled)) waiter->wake();
  }
}

bool Connection::take_results() {
  // spindle::pg delivers no notifications: what a LISTEN brings is freed as it comes, or
  // libpq would keep every one for good.
  while (PGnotify* notification = PQnotifies(conn_)) PQfreemem(notification);
  for (;;) {
    if (copy_out_ && !drain_copy_out()) break;
    if (PQisBusy(conn_) != 0) break;
    PGresult* r = PQgetResult(conn_);
    if (fifo_.empty()) {
      if (r == nullptr) break;
      PQclear(r);  // nothing asked for it
      continue;
    }
    Entry& e = fifo_.front();
    if (r == nullptr) {
      if (e.kind == Entry::kParse) {
        fifo_.pop_front();
        ++first_sequence_;
        continue;
      }
      if (e.sync_pending) break;  // its Sync has not come yet
      e.sync_pending = true;
      continue;
    }
    ExecStatusType status = PQresultStatus(r);
    if (status == PGRES_PIPELINE_SYNC) {
      PQclear(r);
      if (e.kind == Entry::kExecute) complete_front();
      continue;
    }
    if (e.kind == Entry::kParse) {
      if (status == PGRES_FATAL_ERROR) {
        last_parse_error_ = server_error(r);
        if (e.statement < prepared_.size() && e.generation == generation_) {
          prepared_[e.statement] = kNotPrepared;
        }
        for (Entry& later : fifo_) {
          if (later.kind == Entry::kExecute && later.statement == e.statement &&
              later.generation == e.generation) {
            later.parse_error = last_parse_error_;
          }
        }
      }
      PQclear(r);
      continue;
    }
    if (!on_result(e, status, r)) return false;
  }
  return PQstatus(conn_) == CONNECTION_OK;
}

bool Connection::on_result(Entry& e, ExecStatusType status, PGresult* r) {
  if (e.outcome) {  // one result per statement is kept
    PQclear(r);
    return true;
  }
  switch (status) {
    case PGRES_TUPLES_OK:
    case PGRES_COMMAND_OK:
    case PGRES_EMPTY_QUERY:
      e.outcome.emplace(Result(r));
      return true;
    case PGRES_PIPELINE_ABORTED:
      PQclear(r);
      e.outcome.emplace(std::unexpected(
          last_parse_error_.code ? last_parse_error_
                                 : client_error(Errc::kServerError, "pipeline aborted")));
      return true;
    case PGRES_FATAL_ERROR: {
      Error error = server_error(r);
      PQclear(r);
      if (error.code == make_error_code(Errc::kConnectionLost)) session_ended();
      // Its statement's Parse failed: that is its error, and no name was lost.
      if (error.sqlstate == "26000" && e.parse_error) {
        e.outcome.emplace(std::unexpected(std::move(*e.parse_error)));
        return true;
      }
      // The statement's name is gone from the session (DEALLOCATE, DISCARD ALL, a pooler's
      // other session): it did not run; the next call prepares it again.
      if (error.sqlstate == "26000" && e.statement != 0 && e.generation == generation_) {
        forget_prepared();
        error.message += " (it is prepared again for the next call)";
      }
      // "cached plan must not change result type": its table changed shape, and the server
      // refuses that name on this session for good. The statement did not run; the next call
      // prepares it again under a new name (once per name: the calls already sent on the old
      // one fail the same way).
      if (error.sqlstate == "0A000" && e.statement != 0 && e.generation == generation_ &&
          e.version == version_of(versions_, e.statement)) {
        reprepare(e.statement);
        error.message += " (it is prepared again for the next call)";
      }
      e.outcome.emplace(std::unexpected(std::move(error)));
      return true;
    }
    case PGRES_COPY_OUT:
      // Its rows are read and thrown away (drain_copy_out), then its end, then its Sync.
      PQclear(r);
      e.outcome.emplace(std::unexpected(unsupported_copy()));
      copy_out_ = true;
      return true;
    case PGRES_COPY_IN:
      // The server fails the COPY (and, if anything is pipelined behind it, the connection:
      // it reads those messages as the COPY's data).
      PQclear(r);
      e.outcome.emplace(std::unexpected(unsupported_copy()));
      if (PQputCopyEnd(conn_, "COPY FROM STDIN is not carried by spindle::pg") != 1) return false;
      flush();
      return true;
    case PGRES_COPY_BOTH:  // a replication stream: the connection cannot come back from it
      PQclear(r);
      e.outcome.emplace(std::unexpected(unsupported_copy()));
      return false;
    default:
      e.outcome.emplace(std::unexpected(client_error(
          Errc::kServerError, fmt::format("unexpected result: {}", PQresStatus(status)))));
      PQclear(r);
      return true;
  }
}

bool Connection::drain_copy_out() {
  for (;;) {
    char* row = nullptr;
    int n = PQgetCopyData(conn_, &row, /*async=*/1);
    if (row != nullptr) PQfreemem(row);
    if (n > 0) continue;
    if (n == 0) return false;  // more to come
    copy_out_ = false;         // -1: done; -2: an error, which PQgetResult reports next
    return true;
  }
}

void Connection::complete_front() {
  Entry& e = fifo_.front();
  Expected<Result> outcome = e.outcome ? std::move(*e.outcome) : Expected<Result>(Result());
  Query* owner = e.owner;
  bool gave_up = e.gave_up;
  if (answered_ == 0) first_answered_sent_ = e.sent_at;
  ++answered_;
  fifo_.pop_front();
  ++first_sequence_;
  --in_flight_;
  if (gave_up) --given_up_;
  if (troubled()) quiet_since_ = std::chrono::steady_clock::now();  // the server moved on
  deliver(owner, std::move(outcome));
  if (in_flight_ == 0 || (gave_up && !troubled())) {
    if (auto pool = pool_.lock()) pool->changed();
  }
}

bool Connection::answers_waiting() const { return input_pending(conn_); }

void Connection::pace() {
  if (answered_ == 0) return;
  Clock::time_point now = Clock::now();
  bool behind = !fifo_.empty() && fifo_.front().sent_at < last_answer_;
  per_statement_ = next_pace(per_statement_, now - std::max(first_answered_sent_, last_answer_),
                             answered_, behind);
  last_answer_ = now;
  answered_ = 0;
}

void Connection::deliver(Query* owner, Expected<Result> outcome) {
  if (owner == nullptr) return;  // its caller gave up
  owner->outcome_.emplace(std::move(outcome));
  owner->connection_.reset();
  if (owner->waiter_ != nullptr) owner->waiter_->notify();
}

Error Connection::server_error(const PGresult* result) const {
  const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  const char* primary = PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);
  // FATAL / PANIC end the session (pg_terminate_backend's 57P01, a shutdown): the connection
  // is lost, whatever statement the message reached.
  const char* severity = PQresultErrorField(result, PG_DIAG_SEVERITY_NONLOCALIZED);
  std::string_view level = severity ? severity : "";
  Errc code = level == "FATAL" || level == "PANIC" ? Errc::kConnectionLost : Errc::kServerError;
  return Error{make_error_code(code), state ? state : "",
               primary ? primary : trimmed(PQresultErrorMessage(result))};
}

void Connection::on_notice(void* self, const PGresult* notice) {
  const char* severity = PQresultErrorField(notice, PG_DIAG_SEVERITY_NONLOCALIZED);
  std::string_view level = severity ? severity : "";
  if (level == "FATAL" || level == "PANIC") static_cast<Connection*>(self)->session_ended();
}

void Connection::session_ended() {
  // Its driver is the reader of the FATAL: it closes the connection once the calls in flight
  // have their ends (their results, or the hang-up that fails them).
  session_ended_ = true;
  retiring_ = true;
}

void Connection::fail_all(Errc why, const std::string& message) {
  broken_ = true;
  std::deque<Entry> entries = std::move(fifo_);
  fifo_.clear();
  first_sequence_ += entries.size();
  in_flight_ = 0;
  given_up_ = 0;
  for (Entry& e : entries) {
    if (e.kind != Entry::kExecute) continue;
    // An error that came is the statement's own (it failed: nothing of it stays); a result
    // without its Sync says nothing of the commit: that outcome is unknown.
    bool failed = e.outcome && !e.outcome->has_value();
    deliver(e.owner, failed ? std::move(*e.outcome) : std::unexpected(client_error(why, message)));
  }
}

void Connection::retire() {
  retiring_ = true;
  // An idle driver is parked for reading: wake it to close now.
  if (fifo_.empty()) wake_driver();
}

void Connection::shut(Errc why, std::string message) {
  shut_reason_ = why;
  shut_message_ = std::move(message);
  shutting_ = true;
  retiring_ = true;
  wake_driver();  // the driver wakes, fails the calls and ends
}

void Connection::finish() {
  broken_ = true;
  for (Waiter* w : std::exchange(cancel_waiters_, {})) w->notify();
  if (auto pool = pool_.lock()) pool->remove(this, evicted_);
  if (slot_ != nullptr) {
    cancel_waits(*slot_);  // a flusher
    worker_->reactor().release(slot_);
    slot_ = nullptr;
  }
  // The descriptor goes with libpq's connection; the cancel object stays (a cancel may be on
  // its way on a thread of its own, which holds it).
  PQfinish(conn_);
  conn_ = nullptr;
}

}  // namespace spindle::pg
