#pragma once
// What the PostgreSQL client's tests share: options for the test server, statements run on a
// connection of the test's own (plain libpq, outside the client under test), and a probe that
// says whether a worker kept answering while the client waited.

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/pg/database.h"
#include "testing/services.h"

namespace spindle::testing {

inline pg::Options pg_options(const TestPostgres& server, std::size_t connections = 2) {
  return pg::Options{.conninfo = server.conninfo(), .connections = connections};
}

/// Runs `sql` (one or more statements) on a connection of its own; the first value of the
/// last result ("" if none), and an assertion failure if it failed.
inline std::string pg_run(const std::string& conninfo, const std::string& sql) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  EXPECT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
  PGresult* r = PQexec(c, sql.c_str());
  ExecStatusType status = PQresultStatus(r);
  EXPECT_TRUE(status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK)
      << sql << ": " << PQerrorMessage(c);
  std::string value =
      status == PGRES_TUPLES_OK && PQntuples(r) > 0 && PQnfields(r) > 0 ? PQgetvalue(r, 0, 0) : "";
  PQclear(r);
  PQfinish(c);
  return value;
}

/// A table of the test's own (the server is shared by the tests of a run): id int primary key,
/// note text.
inline std::string pg_fresh_table(const TestPostgres& server, const std::string& name) {
  pg_run(server.conninfo(), "DROP TABLE IF EXISTS " + name + "; CREATE TABLE " + name +
                                " (id int PRIMARY KEY, note text)");
  return name;
}

/// A role of the test's own (not named pg_...: reserved) that may log in (trust authentication),
/// with `attributes` ("CONNECTION LIMIT 1") and session defaults (`ALTER ROLE ... SET` statements'
/// "SET ..." parts).
inline std::string pg_fresh_role(const TestPostgres& server, const std::string& name,
                                 const std::string& attributes = "",
                                 const std::vector<std::string>& settings = {}) {
  // (A run before left it, with grants that must go first.)
  std::string sql = "DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '" + name +
                    "') THEN EXECUTE 'DROP OWNED BY " + name + "'; END IF; END $$; " +
                    "DROP ROLE IF EXISTS " + name + "; CREATE ROLE " + name + " LOGIN " +
                    attributes + "; GRANT ALL ON SCHEMA public TO " + name + ";";
  for (const auto& s : settings) sql += " ALTER ROLE " + name + " " + s + ";";
  pg_run(server.conninfo(), sql);
  return name;
}

/// Nanoseconds the calling thread spent runnable but waiting for a CPU (the kernel's
/// schedstat), or 0 where the kernel does not say.
inline std::int64_t cpu_wait_ns() {
  std::int64_t on_cpu = 0, waiting = 0;
  if (FILE* f = std::fopen("/proc/thread-self/schedstat", "r")) {
    if (std::fscanf(f, "%ld %ld", &on_cpu, &waiting) != 2) waiting = 0;
    std::fclose(f);
  }
  return waiting;
}

/// A fiber on the calling worker that wakes every 10 ms and keeps the longest it woke late: a
/// worker held by anything (a blocking call, a loop that never parks) shows as lateness. The
/// time the kernel kept the worker's thread waiting for a CPU (a loaded machine, not the
/// worker) is not counted.
/// Longer than this between two wake-ups of a probe fiber is "the worker was held": 100 ms, or
/// more in a sanitizer build, whose copies of a large result (libpq's own, in one piece, where no
/// fiber can yield) take several times as long: 145 ms for 256 MiB under ASan, 926 under TSan
/// (whose run is about threads meeting, not about time).
#if defined(__SANITIZE_THREAD__)
inline constexpr long kWorkerHeldMs = 3000;
#elif defined(__SANITIZE_ADDRESS__)
inline constexpr long kWorkerHeldMs = 400;
#else
inline constexpr long kWorkerHeldMs = 100;
#endif

class WorkerProbe {
 public:
  WorkerProbe() : state_(std::make_shared<State>()) {
    spawn([state = state_] {
      using Clock = std::chrono::steady_clock;
      while (!state->stop) {
        auto before = Clock::now();
        std::int64_t waited = cpu_wait_ns();
        (void)this_fiber::sleep_for(std::chrono::milliseconds(10));
        auto late = Clock::now() - before - std::chrono::milliseconds(10) -
                    std::chrono::nanoseconds(cpu_wait_ns() - waited);
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(late).count();
        if (ms > state->worst_ms) state->worst_ms = ms;
        ++state->wakes;
      }
    }).detach();
  }
  ~WorkerProbe() { state_->stop = true; }
  /// The longest it woke late so far, in milliseconds.
  long worst_ms() const { return state_->worst_ms; }
  long wakes() const { return state_->wakes; }

 private:
  struct State {
    std::atomic<bool> stop{false};
    long worst_ms = 0;
    long wakes = 0;
  };
  std::shared_ptr<State> state_;
};

/// How long a call took past its deadline at most, in the tests (a loaded machine's scheduling
/// included; the calls under test take far longer when they do not keep their deadlines).
inline constexpr std::chrono::milliseconds kDeadlineSlack{200};

}  // namespace spindle::testing
