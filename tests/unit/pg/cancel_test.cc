// A call that gives up (its deadline passes) cancels its statement on the server only when the
// cancel cannot hit another statement, and says whether its statement was sent: a statement
// reported not sent never runs, and one that was sent is reported as of unknown outcome.
// (Issue 69, items 2 and 9.)
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "pg_testing.h"
#include "spindle/fiber/runtime.h"

using namespace std::chrono_literals;
using namespace spindle;
using spindle::testing::kDeadlineSlack;
using spindle::testing::pg_fresh_table;
using spindle::testing::pg_options;
using spindle::testing::pg_run;

namespace {

using Clock = std::chrono::steady_clock;

int count_rows(const spindle::testing::TestPostgres& server, const std::string& table,
               const std::string& where = "true") {
  return std::stoi(pg_run(server.conninfo(), "SELECT count(*) FROM " + table + " WHERE " + where));
}

}  // namespace

TEST(PgCancel, ALateCancelNeverHitsTheStatementPipelinedBehindItsOwn) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    // The statement that times out ends about when its deadline passes: a cancel sent for it
    // reaches the server after it ended, when the innocent one behind it runs.
    int innocent_failures = 0;
    for (int i = 0; i < 40; ++i) {
      auto late = db.start("SELECT pg_sleep(0.03)");
      auto innocent = db.start("SELECT pg_sleep(0.03), 'innocent'");
      auto r = late.result(Deadline::after(28ms));
      auto ri = innocent.result(Deadline::after(5s));
      if (!ri.has_value()) {
        ++innocent_failures;
        ADD_FAILURE() << "round " << i << ": " << ri.error().message << " (" << ri.error().sqlstate
                      << ")";
      }
      (void)r;
    }
    EXPECT_EQ(innocent_failures, 0);
  });
}

TEST(PgCancel, AStatementSentRightAfterACancelIsNeverHitByIt) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    // Alone on the connection, the statement that times out is canceled; the next call, made
    // at once, goes out only after the server took the cancel request.
    int canceled_on_server = 0;
    for (int i = 0; i < 30; ++i) {
      auto r = db.query("SELECT pg_sleep(0.03)", {}, Deadline::after(28ms));
      if (!r.has_value() && r.error().code == pg::Errc::kTimedOut) ++canceled_on_server;
      auto next = db.query("SELECT pg_sleep(0.01), 'next'", {}, Deadline::after(5s));
      ASSERT_TRUE(next.has_value())
          << "round " << i << ": " << next.error().message << " (" << next.error().sqlstate << ")";
    }
    EXPECT_GT(canceled_on_server, 0);
    EXPECT_EQ(db.stats().opened, 1u);
  });
}

TEST(PgCancel, ATransactionsNextStatementIsNeverHitByTheCancelOfItsLast) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    for (int i = 0; i < 10; ++i) {
      auto t = db.begin(Deadline::after(5s));
      ASSERT_TRUE(t.has_value()) << t.error().message;
      auto slow = t->query("SELECT pg_sleep(0.03)", {}, Deadline::after(28ms));
      auto next = t->query("SELECT 1", {}, Deadline::after(5s));
      // Either the cancel stopped the sleep (the transaction failed: 25P02 for what follows)
      // or it came too late and did nothing; never a cancel of the next statement.
      if (!next.has_value()) {
        EXPECT_EQ(next.error().sqlstate, "25P02") << "round " << i << ": " << next.error().message;
      }
      (void)slow;
      (void)t->rollback(Deadline::after(5s));
    }
  });
}

TEST(PgDeadline, AStatementThatTimedOutAfterBeingSentIsReportedOfUnknownOutcome) {
  REQUIRE_POSTGRES(postgres);
  auto table = pg_fresh_table(*postgres, "pg_deadline_sent");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto insert = db.prepare("INSERT INTO pg_deadline_sent VALUES ($1, 'x')");
  runtime.block_on([&] {
    auto ahead = db.start("SELECT pg_sleep(0.3)");
    auto started = Clock::now();
    auto r = db.query(insert, {pg::param(1)}, Deadline::after(50ms));
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, pg::Errc::kTimedOut);
    EXPECT_LT(Clock::now() - started, 50ms + kDeadlineSlack);
    EXPECT_FALSE(r.error().not_sent);  // it was on the wire, behind the sleep
    EXPECT_NE(r.error().message.find("unknown"), std::string::npos) << r.error().message;
    ASSERT_TRUE(ahead.result(Deadline::after(5s)).has_value());
    ASSERT_TRUE(db.query("SELECT 1", {}, Deadline::after(5s)).has_value());
  });
  EXPECT_EQ(count_rows(*postgres, table), 1);  // it ran: "unknown" was the truth
}

TEST(PgDeadline, AStatementReportedNotSentNeverRuns) {
  REQUIRE_POSTGRES(postgres);
  auto table = pg_fresh_table(*postgres, "pg_deadline_unsent");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto insert = db.prepare("INSERT INTO pg_deadline_unsent VALUES ($1, 'x')");
  runtime.block_on([&] {
    // The only connection is a transaction's: the calls wait for it, and give up unsent.
    auto t = db.begin(Deadline::after(5s));
    ASSERT_TRUE(t.has_value());
    std::vector<JoinHandle<pg::Expected<pg::Result>>> calls;
    for (int i = 0; i < 5; ++i) {
      calls.push_back(
          spawn([&, i] { return db.query(insert, {pg::param(i)}, Deadline::after(80ms)); }));
    }
    for (auto& c : calls) {
      auto r = c.join();
      ASSERT_FALSE(r.has_value());
      EXPECT_EQ(r.error().code, pg::Errc::kTimedOut);
      EXPECT_TRUE(r.error().not_sent) << r.error().message;
    }
    // A deadline already passed: nothing is sent either.
    auto expired =
        db.query("INSERT INTO pg_deadline_unsent VALUES (99, 'x')", {}, Deadline::no_wait());
    EXPECT_TRUE(expired.error().not_sent);
    ASSERT_TRUE(t->commit(Deadline::after(5s)).has_value());
    ASSERT_TRUE(db.query("SELECT pg_sleep(0.1)", {}, Deadline::after(5s)).has_value());
  });
  EXPECT_EQ(count_rows(*postgres, table), 0);
}

TEST(PgDeadline, AFiberStoppedWhileWaitingForAConnectionSendsNothing) {
  REQUIRE_POSTGRES(postgres);
  auto table = pg_fresh_table(*postgres, "pg_deadline_stopped");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto t = db.begin(Deadline::after(5s));  // the only connection
    ASSERT_TRUE(t.has_value());
    auto waiting = spawn([&] {
      return db.query("INSERT INTO pg_deadline_stopped VALUES (1, 'x')", {}, Deadline::after(5s));
    });
    (void)this_fiber::sleep_for(50ms);
    waiting.request_stop();
    auto r = waiting.join();
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, pg::Errc::kCanceled);
    EXPECT_TRUE(r.error().not_sent);
    ASSERT_TRUE(t->commit(Deadline::after(5s)).has_value());
    ASSERT_TRUE(db.query("SELECT 1", {}, Deadline::after(5s)).has_value());
  });
  EXPECT_EQ(count_rows(*postgres, table), 0);
}
