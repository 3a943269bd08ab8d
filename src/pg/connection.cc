#include "connection.h"

#include <fmt/format.h>
#include <openssl/ssl.h>
#include <poll.h>

#include <charconv>
#include <cstring>

#include "pool.h"
#include "spindle/base/log.h"
#include "spindle/fiber/io_wait.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/waiter.h"
#include "spindle/fiber/worker.h"
#include "spindle/sync/blocking_pool.h"

namespace spindle::pg {
namespace {

// libpq's messages end with a newline.
std::string trimmed(const char* message) {
  std::string text = message ? message : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string statement_name(std::uint32_t id) { return fmt::format("spindle_{}", id); }

constexpr std::size_t kMaxValue = std::size_t{1} << 30;

}  // namespace

Expected<std::shared_ptr<Connection>> Connection::open(const Options& options,
                                                       std::shared_ptr<Catalog> catalog,
                                                       std::weak_ptr<Pool> pool) {
  Worker* worker = Worker::current();
  if (worker == nullptr)
    return std::unexpected(client_error(Errc::kNotOnWorker, "not on a worker"));
  // libpq connects blocking (name lookup, TLS): a helper thread waits for it, the fiber parks.
  std::string timeout = std::to_string(std::max<std::int64_t>(
      2, std::chrono::ceil<std::chrono::seconds>(options.connect_timeout).count()));
  bool has_timeout = options.conninfo.find("connect_timeout") != std::string::npos;
  PGconn* conn = catalog->helpers().run([&] {
    const char* keys[] = {"dbname", has_timeout ? nullptr : "connect_timeout", nullptr};
    const char* values[] = {options.conninfo.c_str(), timeout.c_str(), nullptr};
    return PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  });
  if (conn == nullptr) return std::unexpected(client_error(Errc::kConnectFailed, "out of memory"));
  if (PQstatus(conn) != CONNECTION_OK || PQsetnonblocking(conn, 1) != 0 ||
      PQenterPipelineMode(conn) != 1) {
    Error why = client_error(Errc::kConnectFailed, trimmed(PQerrorMessage(conn)));
    PQfinish(conn);
    return std::unexpected(std::move(why));
  }
  auto slot = worker->reactor().add(PQsocket(conn));
  if (!slot) {
    PQfinish(conn);
    return std::unexpected(client_error(Errc::kConnectFailed, slot.error().message()));
  }
  std::shared_ptr<Connection> self(
      new Connection(conn, std::move(catalog), std::move(pool), options));
  self->worker_ = worker;
  self->slot_ = *slot;
  spawn([self] { self->drive(); }).detach();
  return self;
}

Connection::Connection(PGconn* conn, std::shared_ptr<Catalog> catalog, std::weak_ptr<Pool> pool,
                       const Options& options)
    : conn_(conn),
      cancel_(PQgetCancel(conn)),
      catalog_(std::move(catalog)),
      pool_(std::move(pool)),
      idle_timeout_(options.idle_timeout),
      born_(std::chrono::steady_clock::now()) {}

Connection::~Connection() {
  if (conn_ != nullptr) PQfinish(conn_);
  if (cancel_ != nullptr) PQfreeCancel(cancel_);
}

Query Connection::send(const Statement* statement, std::string_view sql,
                       std::span<const Param> params) {
  Query query;
  if (!usable()) {
    query.outcome_ = std::unexpected(
        client_error(broken_ ? Errc::kConnectionLost : Errc::kClosed, "the connection is closing"));
    return query;
  }
  // What libpq cannot carry is refused before anything is queued on the connection.
  if (params.size() > 65535) {
    query.outcome_ = std::unexpected(client_error(Errc::kBadValue, "more than 65535 parameters"));
    return query;
  }
  for (const Param& p : params) {
    const auto* text = std::get_if<std::string_view>(&p);
    const auto* raw = std::get_if<Bytes>(&p);
    // PostgreSQL takes no value over 1 GiB (and libpq's lengths are ints).
    if ((text != nullptr && text->size() >= kMaxValue) ||
        (raw != nullptr && raw->data.size() >= kMaxValue)) {
      query.outcome_ = std::unexpected(client_error(Errc::kBadValue, "a parameter over 1 GiB"));
      return query;
    }
    if (text != nullptr && text->find('\0') != std::string_view::npos) {
      query.outcome_ = std::unexpected(client_error(
          Errc::kBadValue, "a text parameter holds a NUL byte (send bytes as pg::Bytes)"));
      return query;
    }
  }
  std::string name;
  if (statement != nullptr) {
    name = statement_name(statement->id);
    if (prepared_.size() <= statement->id) prepared_.resize(statement->id + 1);
    if (!prepared_[statement->id]) {
      std::string text = catalog_->sql(statement->id);
      if (PQsendPrepare(conn_, name.c_str(), text.c_str(), 0, nullptr) != 1) {
        query.outcome_ =
            std::unexpected(client_error(Errc::kConnectionLost, trimmed(PQerrorMessage(conn_))));
        shut(Errc::kConnectionLost);
        return query;
      }
      prepared_[statement->id] = true;
      fifo_.push_back(Entry{Entry::kParse, nullptr, statement->id});
    }
  }
  // Parameters go as text (NUL-terminated, one after another in one buffer), bytes in binary.
  // Scratch of the connection's, reused: no allocation per statement once they have grown.
  std::size_t n = params.size();
  auto& values = param_values_;
  auto& lengths = param_lengths_;
  auto& formats = param_formats_;
  auto& offsets = param_offsets_;
  values.assign(n, nullptr);
  lengths.assign(n, 0);
  formats.assign(n, 0);
  offsets.assign(n, std::string::npos);
  param_text_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    const Param& p = params[i];
    std::size_t at = param_text_.size();
    if (std::holds_alternative<std::nullptr_t>(p) || std::holds_alternative<Bytes>(p)) continue;
    offsets[i] = at;
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
      values[i] = b->data.data();
      lengths[i] = static_cast<int>(b->data.size());
      formats[i] = 1;
    } else if (offsets[i] != std::string::npos) {
      values[i] = param_text_.data() + offsets[i];
    }
  }
  int count = static_cast<int>(n);
  int sent = statement != nullptr
                 ? PQsendQueryPrepared(conn_, name.c_str(), count, values.data(), lengths.data(),
                                       formats.data(), 0)
                 : PQsendQueryParams(conn_, std::string(sql).c_str(), count, nullptr, values.data(),
                                     lengths.data(), formats.data(), 0);
  if (sent != 1 || PQpipelineSync(conn_) != 1) {
    query.outcome_ =
        std::unexpected(client_error(Errc::kConnectionLost, trimmed(PQerrorMessage(conn_))));
    shut(Errc::kConnectionLost);
    return query;
  }
  fifo_.push_back(Entry{Entry::kExecute, &query, 0});
  ++in_flight_;
  query.connection_ = shared_from_this();
  query.sequence_ = first_sequence_ + fifo_.size() - 1;
  flush();
  return query;  // elided, or moved: a Query's move points the entry at its new place
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

void Connection::drive() {
  auto self = shared_from_this();  // alive until the driver ends
  int fd = PQsocket(conn_);
  for (;;) {
    if (PQconsumeInput(conn_) != 1) {
      fail_all(Errc::kConnectionLost, trimmed(PQerrorMessage(conn_)));
      break;
    }
    if (!take_results() || broken_) break;
    if (shutting_) {  // shut() before the driver parked
      fail_all(shut_reason_, "the connection was closed");
      break;
    }
    if (retiring_ && fifo_.empty()) break;
    // libpq reads once per call: if bytes are left in the socket no readiness edge will come
    // for them, so look before parking.
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) continue;
    // Over TLS, records already read from the socket wait in OpenSSL's buffer: no readiness
    // will come for them either.
    if (auto* ssl = static_cast<SSL*>(PQsslStruct(conn_, "OpenSSL")); ssl && SSL_pending(ssl) > 0) {
      continue;
    }
    bool idle = fifo_.empty() && !reserved && idle_timeout_.count() > 0;
    std::error_code ec = wait_ready(*slot_, IoDirection::kRead,
                                    idle ? Deadline::after(idle_timeout_) : Deadline::never());
    if (ec == std::errc::timed_out) {
      if (fifo_.empty() && !reserved) break;  // idle too long: closed
      continue;
    }
    if (ec) {  // the runtime stops, or shut()
      fail_all(shut_reason_, "the connection was closed");
      break;
    }
  }
  finish();
}

bool Connection::take_results() {
  while (PQisBusy(conn_) == 0) {
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
      if (e.kind == Entry::kExecute) {
        Expected<Result> outcome = e.outcome ? std::move(*e.outcome) : Expected<Result>(Result());
        Query* owner = e.owner;
        fifo_.pop_front();
        ++first_sequence_;
        --in_flight_;
        deliver(owner, std::move(outcome));
        if (in_flight_ == 0) {
          if (auto pool = pool_.lock()) pool->idle(this);
        }
      }
      continue;
    }
    if (e.kind == Entry::kParse) {
      if (status == PGRES_FATAL_ERROR) {
        last_parse_error_ = server_error(r);
        if (e.statement < prepared_.size()) prepared_[e.statement] = false;
      }
      PQclear(r);
      continue;
    }
    if (e.outcome) {  // one result per statement is kept
      PQclear(r);
      continue;
    }
    switch (status) {
      case PGRES_TUPLES_OK:
      case PGRES_COMMAND_OK:
      case PGRES_EMPTY_QUERY:
        e.outcome.emplace(Result(r));
        break;
      case PGRES_PIPELINE_ABORTED:
        PQclear(r);
        e.outcome.emplace(std::unexpected(
            last_parse_error_.code ? last_parse_error_
                                   : client_error(Errc::kServerError, "pipeline aborted")));
        break;
      case PGRES_FATAL_ERROR:
        e.outcome.emplace(std::unexpected(server_error(r)));
        PQclear(r);
        break;
      default:
        e.outcome.emplace(std::unexpected(client_error(
            Errc::kServerError, fmt::format("unexpected result: {}", PQresStatus(status)))));
        PQclear(r);
        break;
    }
  }
  return PQstatus(conn_) == CONNECTION_OK;
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
  return Error{make_error_code(Errc::kServerError), state ? state : "",
               primary ? primary : trimmed(PQresultErrorMessage(result))};
}

void Connection::fail_all(Errc why, const std::string& message) {
  broken_ = true;
  std::deque<Entry> entries = std::move(fifo_);
  fifo_.clear();
  first_sequence_ += entries.size();
  in_flight_ = 0;
  for (Entry& e : entries) {
    if (e.kind == Entry::kExecute) deliver(e.owner, std::unexpected(client_error(why, message)));
  }
}

void Connection::retire() {
  retiring_ = true;
  // An idle driver is parked for reading: wake it to close now.
  if (fifo_.empty() && slot_ != nullptr) cancel_waits(*slot_);
}

void Connection::shut(Errc why) {
  shut_reason_ = why;
  shutting_ = true;
  retiring_ = true;
  if (slot_ != nullptr) cancel_waits(*slot_);  // the driver wakes, fails the calls and ends
}

void Connection::finish() {
  broken_ = true;
  if (auto pool = pool_.lock()) pool->remove(this);
  if (slot_ != nullptr) {
    cancel_waits(*slot_);
    worker_->reactor().release(slot_);
    slot_ = nullptr;
  }
  // The descriptor goes with libpq's connection; the cancel object stays (a cancel may be on
  // its way on a helper thread, which holds this object).
  PQfinish(conn_);
  conn_ = nullptr;
}

void Connection::rebind(std::uint64_t sequence, Query* owner) {
  if (sequence >= first_sequence_ && sequence - first_sequence_ < fifo_.size()) {
    fifo_[sequence - first_sequence_].owner = owner;
  }
}

void Connection::abandon(std::uint64_t sequence, bool cancel) {
  if (sequence < first_sequence_ || sequence - first_sequence_ >= fifo_.size()) return;
  std::size_t index = sequence - first_sequence_;
  fifo_[index].owner = nullptr;
  // Only the statement the server is on now is worth a cancel (a cancel stops whatever runs
  // when it arrives): the first execution in the queue, its results not all in.
  bool running = !fifo_[index].sync_pending;
  for (std::size_t i = 0; i < index && running; ++i) running = fifo_[i].kind == Entry::kParse;
  if (!cancel || !running || cancel_ == nullptr || broken_) return;
  auto self = shared_from_this();
  spawn([self] {
    (void)self->catalog_->helpers().run([&] {
      char message[256];
      if (PQcancel(self->cancel_, message, sizeof message) != 1) {
        log_warn("pg: cancel request failed: {}", message);
      }
      return 0;
    });
  }).detach();
}

}  // namespace spindle::pg
