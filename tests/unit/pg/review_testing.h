#pragma once
// What the adversarial review's tests share (review_test.cc, review_faults_test.cc): a
// watchdog that turns a hang into a failure within seconds, the resident memory of the process,
// and a probe for "is this call inside a transaction block somebody else opened".

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "spindle/pg/database.h"
#include "testing/services.h"

namespace spindle::testing {

/// Ends the process with a failure if the test is still running after `limit`: a call that
/// never returns (a frozen connection, a worker that never parks) fails the test in seconds,
/// not at ctest's 300 s timeout.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit)
      : thread_([this, limit] {
          std::unique_lock lock(mutex_);
          if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
          std::fprintf(stdout, "\nWATCHDOG: the test still ran after %lld s: a call hung\n",
                       static_cast<long long>(limit.count()));
          std::fflush(stdout);
          std::_Exit(3);
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/// The process's resident memory, in bytes.
inline std::size_t resident_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<std::size_t>(resident) * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

/// The rows of `table` now, read on a connection of the test's own.
inline int rows_of_table(const TestPostgres& server, const std::string& table) {
  PGconn* c = PQconnectdb(server.conninfo().c_str());
  PGresult* r = PQexec(c, ("SELECT count(*) FROM " + table).c_str());
  int n = PQresultStatus(r) == PGRES_TUPLES_OK ? std::atoi(PQgetvalue(r, 0, 0)) : -1;
  PQclear(r);
  PQfinish(c);
  return n;
}

/// Milliseconds since `since`.
inline std::chrono::milliseconds ms_since(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               since);
}

/// The text of the one value of a successful result; else what it was ("<error: ...>").
inline std::string value_of(const pg::Expected<pg::Result>& r) {
  if (!r) return "<error: " + r.error().message + ">";
  if (r->rows() != 1 || r->columns() < 1) {
    return "<" + std::to_string(r->rows()) + " rows, command " + std::string(r->command()) + ">";
  }
  return std::string(r->text(0, 0));
}

/// True when a statement sent now through `db` runs inside a transaction block opened before it
/// (SAVEPOINT is refused, 25P01, outside one). Inside one, it leaves a savepoint there.
inline bool inside_a_transaction(pg::Database& db) {
  auto r = db.query("SAVEPOINT spindle_review_probe", {}, Deadline::after(std::chrono::seconds(5)));
  if (!r) {
    EXPECT_EQ(r.error().sqlstate, "25P01") << r.error().message;
  }
  return r.has_value();
}

}  // namespace spindle::testing
