// The TechEmpower Framework Benchmarks' test types on spindle, by two roads to PostgreSQL:
//
//   tfb --listen 127.0.0.1:8080 --db "host=/run/postgresql dbname=hello_world"
//       [--threads N] [--connections N] [--road native|hooked] [--startup-timeout SECONDS]
//       [--query-timeout SECONDS]
//
// --road native (the default) uses spindle's client (pg/: pipelined, no hooks); --road hooked
// makes the same calls through plain blocking libpq, made cooperative by hook/. The schema is
// examples/tfb/schema.sql. At start it reads the World table (for /cached-queries): a database
// that does not answer within --startup-timeout (30 s) ends it with status 1, and SIGTERM or
// SIGINT meanwhile ends it at once (status 0). Prints {"event":"listening","address":...} once
// it listens. On the native road a query unanswered after --query-timeout (10 s) is a 500.
#include <fmt/format.h>
#include <libpq-fe.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "spindle/fiber/worker.h"
#include "spindle/net/signal_set.h"
#include "spindle/pg/database.h"
#include "spindle/server/server.h"
#include "spindle/sync/semaphore.h"

using namespace spindle;

namespace {

constexpr int kWorldRows = 10'000;

struct World {
  int id;
  int number;
};

struct Fortune {
  int id;
  std::string message;
};

int random_id() {
  thread_local std::minstd_rand generator{std::random_device{}()};
  return std::uniform_int_distribution<int>(1, kWorldRows)(generator);
}

// The count a test asks for: 1..500, anything that is not a number 1.
int count_of(std::string_view query, std::string_view name) {
  std::size_t at = 0;
  while (at < query.size()) {
    std::size_t end = query.find('&', at);
    if (end == std::string_view::npos) end = query.size();
    std::string_view pair = query.substr(at, end - at);
    if (pair.size() > name.size() && pair.starts_with(name) && pair[name.size()] == '=') {
      std::string_view value = pair.substr(name.size() + 1);
      int n = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec == std::errc::result_out_of_range) return value.starts_with('-') ? 1 : 500;
      if (ec != std::errc() || ptr != value.data() + value.size()) return 1;
      return std::clamp(n, 1, 500);
    }
    at = end + 1;
  }
  return 1;
}

void append_world(std::string& out, const World& w) {
  fmt::format_to(std::back_inserter(out), R"({{"id":{},"randomNumber":{}}})", w.id, w.number);
}

std::string worlds_json(const std::vector<World>& worlds) {
  std::string out = "[";
  for (std::size_t i = 0; i < worlds.size(); ++i) {
    if (i > 0) out += ',';
    append_world(out, worlds[i]);
  }
  out += ']';
  return out;
}

void append_escaped(std::string& out, std::string_view text) {
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
}

std::string fortunes_html(std::vector<Fortune> fortunes) {
  fortunes.push_back({0, "Additional fortune added at request time."});
  std::sort(fortunes.begin(), fortunes.end(),
            [](const Fortune& a, const Fortune& b) { return a.message < b.message; });
  std::string out =
      "<!DOCTYPE html><html><head><title>Fortunes</title></head><body><table>"
      "<tr><th>id</th><th>message</th></tr>";
  for (const Fortune& f : fortunes) {
    fmt::format_to(std::back_inserter(out), "<tr><td>{}</td><td>", f.id);
    append_escaped(out, f.message);
    out += "</td></tr>";
  }
  out += "</table></body></html>";
  return out;
}

// New random numbers for the rows read: `answer` as read, each row with its new number (the
// same for a row read twice: one UPDATE sets one value), and `rows` the distinct rows sorted by
// id (concurrent updates then lock rows in one order: no deadlocks), for the UPDATE.
struct Renumbered {
  std::vector<World> answer;
  std::vector<World> rows;
};

Renumbered renumbered(std::vector<World> worlds) {
  std::vector<World> rows = worlds;
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.id < b.id; });
  rows.erase(std::unique(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.id == b.id; }),
             rows.end());
  for (World& w : rows) w.number = random_id();
  for (World& w : worlds) {
    w.number = std::lower_bound(rows.begin(), rows.end(), w.id, [](const World& s, int id) {
                 return s.id < id;
               })->number;
  }
  return {std::move(worlds), std::move(rows)};
}

// UPDATE world SET randomnumber = CASE id WHEN $1 THEN $2 ... END WHERE id IN ($1, $3, ...)
std::string update_sql(int rows) {
  std::string sql = "UPDATE world SET randomnumber = CASE id";
  for (int i = 0; i < rows; ++i) {
    fmt::format_to(std::back_inserter(sql), " WHEN ${}::int4 THEN ${}::int4", 2 * i + 1, 2 * i + 2);
  }
  sql += " ELSE randomnumber END WHERE id IN (";
  for (int i = 0; i < rows; ++i)
    fmt::format_to(std::back_inserter(sql), "{}${}::int4", i ? "," : "", 2 * i + 1);
  sql += ')';
  return sql;
}

/// What the handlers need of a database; an error is thrown as http::HttpError(500).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::vector<World> worlds(int count) = 0;
  virtual std::vector<Fortune> fortunes() = 0;
  /// Writes the rows' numbers (distinct ids, sorted).
  virtual void update(const std::vector<World>& rows) = 0;
};

[[noreturn]] void fail(std::string_view what, std::string_view message) {
  throw http::HttpError(500, fmt::format("{}: {}", what, message));
}

// --- native: spindle's client ------------------------------------------------------------

class NativeBackend : public Backend {
 public:
  NativeBackend(Runtime& runtime, pg::Options options, std::chrono::seconds query_timeout)
      : db_(runtime, std::move(options)),
        query_timeout_(query_timeout),
        world_(db_.prepare("SELECT id, randomnumber FROM world WHERE id = $1")),
        fortune_(db_.prepare("SELECT id, message FROM fortune")) {
    for (int n = 1; n <= 500; ++n) update_.push_back(db_.prepare(update_sql(n)));
  }

  std::vector<World> worlds(int count) override {
    // Every query its own Bind/Execute/Sync, all sent before the first result is read.
    std::vector<pg::Query> queries;
    queries.reserve(count);
    pg::Param id[1];
    for (int i = 0; i < count; ++i) {
      id[0] = pg::param(random_id());
      queries.push_back(db_.start(world_, id));
    }
    std::vector<World> out;
    out.reserve(count);
    for (auto& q : queries) {
      auto r = q.result(Deadline::after(query_timeout_));
      if (!r || r->rows() != 1) fail("world", r ? "no such row" : r.error().message);
      out.push_back({*r->get<int>(0, 0), *r->get<int>(0, 1)});
    }
    return out;
  }

  std::vector<Fortune> fortunes() override {
    auto r = db_.query(fortune_, {}, Deadline::after(query_timeout_));
    if (!r) fail("fortune", r.error().message);
    std::vector<Fortune> out;
    out.reserve(r->rows() + 1);
    for (int i = 0; i < r->rows(); ++i) {
      out.push_back({*r->get<int>(i, 0), std::string(r->text(i, 1))});
    }
    return out;
  }

  void update(const std::vector<World>& rows) override {
    std::vector<pg::Param> params;
    params.reserve(2 * rows.size());
    for (const World& w : rows) {
      params.push_back(pg::param(w.id));
      params.push_back(pg::param(w.number));
    }
    auto r = db_.query(update_[rows.size() - 1], params, Deadline::after(query_timeout_));
    if (!r) fail("update", r.error().message);
  }

 private:
  pg::Database db_;
  /// How long a query may wait for its result (--query-timeout).
  std::chrono::seconds query_timeout_;
  pg::Statement world_, fortune_;
  std::vector<pg::Statement> update_;
};

// --- hooked: plain blocking libpq, cooperative through hook/ ------------------------------

class HookedBackend : public Backend {
 public:
  HookedBackend(Runtime& runtime, std::string conninfo, std::size_t connections)
      : conninfo_(std::move(conninfo)) {
    for (std::size_t i = 0; i < runtime.size(); ++i) {
      pools_.push_back(std::make_unique<WorkerPool>(connections));
    }
  }
  ~HookedBackend() override {
    for (auto& pool : pools_) {
      for (Conn* c : pool->free) {
        PQfinish(c->pg);
        delete c;
      }
    }
  }

  std::vector<World> worlds(int count) override {
    Lease lease(*this);
    std::vector<World> out;
    out.reserve(count);
    for (int i = 0; i < count; ++i) {
      std::string id = std::to_string(random_id());
      const char* values[] = {id.c_str()};
      PGresult* r = PQexecPrepared(lease.conn->pg, "world", 1, values, nullptr, nullptr, 0);
      if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        std::string why = PQresultErrorMessage(r);
        PQclear(r);
        lease.broken = true;
        fail("world", why);
      }
      out.push_back({std::atoi(PQgetvalue(r, 0, 0)), std::atoi(PQgetvalue(r, 0, 1))});
      PQclear(r);
    }
    return out;
  }

  std::vector<Fortune> fortunes() override {
    Lease lease(*this);
    PGresult* r = PQexecPrepared(lease.conn->pg, "fortune", 0, nullptr, nullptr, nullptr, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      std::string why = PQresultErrorMessage(r);
      PQclear(r);
      lease.broken = true;
      fail("fortune", why);
    }
    std::vector<Fortune> out;
    for (int i = 0; i < PQntuples(r); ++i) {
      out.push_back({std::atoi(PQgetvalue(r, i, 0)), PQgetvalue(r, i, 1)});
    }
    PQclear(r);
    return out;
  }

  void update(const std::vector<World>& rows) override {
    Lease lease(*this);
    std::size_t n = rows.size();
    std::string name = fmt::format("update{}", n);
    if (lease.conn->updates.size() <= n) lease.conn->updates.resize(n + 1);
    if (!lease.conn->updates[n]) {
      PGresult* p = PQprepare(lease.conn->pg, name.c_str(), update_sql(int(n)).c_str(), 0, nullptr);
      bool ok = PQresultStatus(p) == PGRES_COMMAND_OK;
      std::string why = PQresultErrorMessage(p);
      PQclear(p);
      if (!ok) fail("prepare update", why);
      lease.conn->updates[n] = true;
    }
    std::vector<std::string> text;
    text.reserve(2 * n);
    for (const World& w : rows) {
      text.push_back(std::to_string(w.id));
      text.push_back(std::to_string(w.number));
    }
    std::vector<const char*> values;
    for (const auto& t : text) values.push_back(t.c_str());
    PGresult* r = PQexecPrepared(lease.conn->pg, name.c_str(), int(values.size()), values.data(),
                                 nullptr, nullptr, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
      std::string why = PQresultErrorMessage(r);
      PQclear(r);
      lease.broken = true;
      fail("update", why);
    }
    PQclear(r);
  }

 private:
  struct Conn {
    PGconn* pg;
    std::vector<bool> updates;  ///< update statements prepared here, by row count
  };
  // The connections of one worker: a blocking connection serves one call at a time.
  struct WorkerPool {
    explicit WorkerPool(std::size_t n) : permits(n) {}
    Semaphore permits;
    std::vector<Conn*> free;
  };
  struct Lease {
    explicit Lease(HookedBackend& backend) : pool(*backend.pools_[Worker::current()->index()]) {
      (void)pool.permits.acquire();
      if (!pool.free.empty()) {
        conn = pool.free.back();
        pool.free.pop_back();
        return;
      }
      conn = backend.connect();
      if (conn == nullptr) {
        pool.permits.release();
        fail("connect", "could not connect");
      }
    }
    ~Lease() {
      if (broken && PQstatus(conn->pg) != CONNECTION_OK) {
        PQfinish(conn->pg);
        delete conn;
      } else {
        pool.free.push_back(conn);
      }
      pool.permits.release();
    }
    WorkerPool& pool;
    Conn* conn = nullptr;
    bool broken = false;
  };

  Conn* connect() {
    PGconn* pg = PQconnectdb(conninfo_.c_str());  // hooked: parks this fiber only
    if (PQstatus(pg) != CONNECTION_OK) {
      fmt::print(stderr, "tfb: connect: {}", PQerrorMessage(pg));
      PQfinish(pg);
      return nullptr;
    }
    for (auto [name, sql] : {std::pair{"world", "SELECT id, randomnumber FROM world WHERE id = $1"},
                             std::pair{"fortune", "SELECT id, message FROM fortune"}}) {
      PGresult* r = PQprepare(pg, name, sql, 0, nullptr);
      bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
      PQclear(r);
      if (!ok) {
        fmt::print(stderr, "tfb: prepare: {}", PQerrorMessage(pg));
        PQfinish(pg);
        return nullptr;
      }
    }
    return new Conn{pg, {}};
  }

  std::string conninfo_;
  std::vector<std::unique_ptr<WorkerPool>> pools_;
};

// --- start: World read once, within a deadline, stopped by a signal -------------------

// How the start went.
enum class Started { kReady, kFailed, kStopped };

// Waits on this (plain) thread until `fd` is ready for `events`, `deadline` passes (kFailed,
// said on stderr) or a signal comes on `signals` (kStopped).
Started wait_for(int fd, short events, Deadline deadline, int signals) {
  for (;;) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline.when() - Clock::now());
    if (left.count() <= 0) {
      fmt::print(stderr, "tfb: the database did not answer in time (--startup-timeout)\n");
      return Started::kFailed;
    }
    pollfd fds[2] = {{fd, events, 0}, {signals, POLLIN, 0}};
    int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) {
      fmt::print(stderr, "tfb: poll: {}\n", std::strerror(errno));
      return Started::kFailed;
    }
    if (n > 0 && (fds[1].revents & POLLIN) != 0) {
      signalfd_siginfo info{};
      (void)::read(signals, &info, sizeof info);
      fmt::print(stderr, "tfb: stopped by signal {} while starting\n", info.ssi_signo);
      return Started::kStopped;
    }
    if (n > 0) return Started::kReady;
  }
}

// Reads World with libpq's non-blocking API on this thread (not a fiber: nothing to park), each
// wait bounded by `deadline` and ended by a signal on `signals`.
Started read_world(const std::string& conninfo, Deadline deadline, int signals,
                   std::vector<World>& out) {
  std::unique_ptr<PGconn, void (*)(PGconn*)> pg(PQconnectStart(conninfo.c_str()), PQfinish);
  auto failed = [&](std::string_view what) {
    fmt::print(stderr, "tfb: {}: {}", what, pg ? PQerrorMessage(pg.get()) : "out of memory\n");
    return Started::kFailed;
  };
  if (!pg || PQstatus(pg.get()) == CONNECTION_BAD) return failed("cannot connect");
  for (auto polling = PGRES_POLLING_WRITING; polling != PGRES_POLLING_OK;) {
    if (polling == PGRES_POLLING_FAILED) return failed("cannot connect");
    short events = polling == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    if (auto s = wait_for(PQsocket(pg.get()), events, deadline, signals); s != Started::kReady) {
      return s;
    }
    polling = PQconnectPoll(pg.get());
  }
  if (PQsetnonblocking(pg.get(), 1) != 0 ||
      !PQsendQuery(pg.get(), "SELECT id, randomnumber FROM world ORDER BY id")) {
    return failed("cannot read world");
  }
  for (int flushed; (flushed = PQflush(pg.get())) != 0;) {
    if (flushed < 0) return failed("cannot read world");
    if (auto s = wait_for(PQsocket(pg.get()), POLLOUT, deadline, signals); s != Started::kReady) {
      return s;
    }
  }
  for (;;) {
    while (PQisBusy(pg.get())) {
      if (auto s = wait_for(PQsocket(pg.get()), POLLIN, deadline, signals); s != Started::kReady) {
        return s;
      }
      if (!PQconsumeInput(pg.get())) return failed("cannot read world");
    }
    PGresult* r = PQgetResult(pg.get());
    if (r == nullptr) return Started::kReady;
    bool rows = PQresultStatus(r) == PGRES_TUPLES_OK;
    for (int i = 0; rows && i < PQntuples(r); ++i) {
      out.push_back({std::atoi(PQgetvalue(r, i, 0)), std::atoi(PQgetvalue(r, i, 1))});
    }
    if (!rows) fmt::print(stderr, "tfb: cannot read world: {}", PQresultErrorMessage(r));
    PQclear(r);
  }
}

struct Args {
  std::string listen = "127.0.0.1:8080";
  std::string db;
  std::size_t threads = 0;
  std::size_t connections = 2;
  std::string road = "native";
  std::size_t startup_timeout = 30;  ///< seconds
  std::size_t query_timeout = 10;    ///< seconds (native road)
};

// World, read within --startup-timeout; SIGINT or SIGTERM meanwhile stops the start.
Started read_world(const Args& args, const SignalSet& signals, std::vector<World>& out) {
  auto signal_fd = signals.open_fd();
  if (!signal_fd) {
    fmt::print(stderr, "tfb: signalfd: {}\n", signal_fd.error().message());
    return Started::kFailed;
  }
  return read_world(args.db, Deadline::after(std::chrono::seconds(args.startup_timeout)),
                    signal_fd->get(), out);
}

[[noreturn]] void usage(std::string_view why) {
  fmt::print(stderr,
             "tfb: {}\nusage: tfb --listen ADDR:PORT --db CONNINFO [--threads N] "
             "[--connections N per worker] [--road native|hooked] [--startup-timeout SECONDS] "
             "[--query-timeout SECONDS]\n",
             why);
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (i + 1 >= argc) usage(fmt::format("{} needs a value", flag));
    std::string_view value = argv[++i];
    auto number = [&] {
      std::size_t n = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || ptr != value.data() + value.size() || n == 0 || n > 1024) {
        usage(fmt::format("{}: not a count: {}", flag, value));
      }
      return n;
    };
    if (flag == "--listen") {
      args.listen = value;
    } else if (flag == "--db") {
      args.db = value;
    } else if (flag == "--threads") {
      args.threads = number();
    } else if (flag == "--connections") {
      args.connections = number();
    } else if (flag == "--startup-timeout") {
      args.startup_timeout = number();
    } else if (flag == "--query-timeout") {
      args.query_timeout = number();
    } else if (flag == "--road") {
      args.road = value;
      if (value != "native" && value != "hooked") usage("--road is native or hooked");
    } else {
      usage(fmt::format("unknown option {}", flag));
    }
  }
  if (args.db.empty()) usage("--db CONNINFO is required");
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse_args(argc, argv);
  auto address = Address::parse(args.listen);
  if (!address) usage(fmt::format("--listen: {}", address.error().message()));

  SignalSet signals{SIGINT, SIGTERM};  // before the runtime: its threads inherit the mask

  // /cached-queries reads a copy of World taken at start.
  std::vector<World> cache;
  switch (read_world(args, signals, cache)) {
    case Started::kReady:
      break;
    case Started::kFailed:
      return 1;
    case Started::kStopped:
      return 0;
  }
  if (cache.size() != kWorldRows) {
    fmt::print(stderr, "tfb: world has {} rows, not {} (load examples/tfb/schema.sql)\n",
               cache.size(), kWorldRows);
    return 1;
  }

  Runtime runtime(RuntimeOptions{.workers = args.threads});
  std::unique_ptr<Backend> backend;
  if (args.road == "native") {
    backend = std::make_unique<NativeBackend>(
        runtime, pg::Options{.conninfo = args.db, .connections = args.connections},
        std::chrono::seconds(args.query_timeout));
  } else {
    backend = std::make_unique<HookedBackend>(runtime, args.db, args.connections);
  }

  http::Router router;
  router.get("/plaintext", [](http::Request&) { return http::Response::text("Hello, World!"); });
  router.get("/json",
             [](http::Request&) { return http::Response::json(R"({"message":"Hello, World!"})"); });
  router.get("/db", [&](http::Request&) {
    std::string out;
    append_world(out, backend->worlds(1)[0]);
    return http::Response::json(std::move(out));
  });
  router.get("/queries", [&](http::Request& request) {
    return http::Response::json(worlds_json(backend->worlds(count_of(request.query(), "queries"))));
  });
  router.get("/fortunes", [&](http::Request&) {
    return http::Response::html(fortunes_html(backend->fortunes()));
  });
  router.get("/updates", [&](http::Request& request) {
    auto updated = renumbered(backend->worlds(count_of(request.query(), "queries")));
    backend->update(updated.rows);
    return http::Response::json(worlds_json(updated.answer));
  });
  router.get("/cached-queries", [&](http::Request& request) {
    int n = count_of(request.query(), "count");
    std::vector<World> out;
    out.reserve(n);
    for (int i = 0; i < n; ++i) out.push_back(cache[random_id() - 1]);
    return http::Response::json(worlds_json(out));
  });

  auto server = http::HttpServer::start(runtime, *address, std::move(router));
  if (!server) {
    fmt::print(stderr, "tfb: cannot listen on {}: {}\n", args.listen, server.error().message());
    return 1;
  }
  fmt::print(R"({{"event":"listening","address":"{}","road":"{}"}})"
             "\n",
             (*server)->address().to_string(), args.road);
  std::fflush(stdout);
  (void)runtime.block_on([&] { return signals.wait(); });
  (*server)->drain(Deadline::after(std::chrono::seconds(10)));
  backend.reset();
  return 0;
}
