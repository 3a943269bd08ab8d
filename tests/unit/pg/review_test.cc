// Adversarial review of spindle::pg (statements, sessions, types): attacks on the promises of
// docs/database.md — every result and error reaches the call that asked, "not sent" never
// ran, session settings the decoders rely on hold, transactions never leak to another caller,
// types decode or fail as errors, a worker keeps answering whatever a statement does. Each
// test is bounded by a Watchdog (a hang fails in seconds). Tests that found a defect are
// DISABLED_, the defect said in a `// defect:` line above each (`// fixed (was a
// defect):` once a fix closed it); the others guard what held.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "pg_testing.h"
#include "review_testing.h"
#include "spindle/fiber/runtime.h"

using namespace std::chrono_literals;
using namespace spindle;
using spindle::testing::inside_a_transaction;
using spindle::testing::kDeadlineSlack;
using spindle::testing::kWorkerHeldMs;
using spindle::testing::pg_fresh_table;
using spindle::testing::pg_options;
using spindle::testing::pg_run;
using spindle::testing::Watchdog;
using spindle::testing::WorkerProbe;

namespace review {

using Clock = std::chrono::steady_clock;
using spindle::testing::ms_since;
using spindle::testing::rows_of_table;
using spindle::testing::value_of;

}  // namespace review
using namespace review;

// --- COPY smuggled past the refusal ------------------------------------------------------------

// PostgreSQL's scanner ends a -- comment at \r as well as \n (scan.l: newline [\n\r]); the
// client's classifier only at \n, so "COPY t FROM --\rSTDIN" is not refused "in any spelling,
// before it is sent" (docs/database.md): the server starts a COPY FROM STDIN, reads the
// statements pipelined behind it as its data, and closes the connection: the innocent calls
// beside it fail with kConnectionLost.
// fixed (was a defect): "COPY t FROM --\rSTDIN" is sent (not_sent false; docs: refused in any
// spelling before it is sent); the server starts COPY IN and the two SELECTs pipelined beside it
// get kConnectionLost instead of 'b'/'c' (a failure hurts only its own statement).
TEST(PgReview, ACopyFromStdinSpelledWithACarriageReturnIsRefusedAndItsNeighboursAnswered) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(30s);
  auto table = pg_fresh_table(*postgres, "pg_review_smuggled_in");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    for (const char* sql : {"COPY pg_review_smuggled_in FROM --\rSTDIN",
                            "COPY pg_review_smuggled_in FROM -- comment\r STDIN"}) {
      auto copy = db.start(sql);
      auto b = db.start("SELECT 'b'");
      auto c = db.start("SELECT 'c'");
      auto rcopy = copy.result(Deadline::after(5s));
      auto rb = b.result(Deadline::after(5s));
      auto rc = c.result(Deadline::after(5s));
      ASSERT_FALSE(rcopy.has_value());
      EXPECT_EQ(rcopy.error().code, pg::Errc::kUnsupported) << rcopy.error().message;
      EXPECT_TRUE(rcopy.error().not_sent) << "a COPY FROM STDIN went to the server";
      EXPECT_EQ(value_of(rb), "b") << "an innocent call beside the COPY";
      EXPECT_EQ(value_of(rc), "c") << "an innocent call beside the COPY";
    }
  });
}

// The same with COPY TO STDOUT: the COPY (here one that inserts) runs and is reported
// kUnsupported, its rows drained; it should have been refused before sending.
// fixed (was a defect): "COPY (INSERT ... RETURNING id) TO --\rSTDOUT" is sent and runs (50000 rows
// inserted) while reported kUnsupported; docs: refused in any spelling before it is sent (the
// classifier ends
// -- comments only at \n, the server's scanner at \r too).
TEST(PgReview, ACopyToStdoutSpelledWithACarriageReturnIsRefusedAndItsNeighboursAnswered) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(30s);
  auto table = pg_fresh_table(*postgres, "pg_review_smuggled_out");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto before = db.start("SELECT 'before'");
    auto copy = db.start(
        "COPY (INSERT INTO pg_review_smuggled_out SELECT g, 'x' FROM generate_series(1, 50000) g "
        "RETURNING id) TO --\rSTDOUT");
    auto after = db.start("SELECT 'after'");
    EXPECT_EQ(value_of(before.result(Deadline::after(5s))), "before");
    auto rcopy = copy.result(Deadline::after(5s));
    ASSERT_FALSE(rcopy.has_value());
    EXPECT_EQ(rcopy.error().code, pg::Errc::kUnsupported) << rcopy.error().message;
    EXPECT_EQ(value_of(after.result(Deadline::after(5s))), "after");
    EXPECT_EQ(db.stats().opened, 1u);
    EXPECT_TRUE(rcopy.error().not_sent) << "a COPY TO STDOUT went to the server";
  });
  EXPECT_EQ(rows_of_table(*postgres, table), 0) << "a COPY reported unsupported ran";
}

// With standard_conforming_strings off (set by any caller of the connection), '\'' is an
// escaped quote for the server and a closed literal for the classifier.
TEST(PgReview, ACopyToStdoutHiddenInABackslashLiteralIsDrainedAndItsNeighboursAnswered) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(30s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    ASSERT_TRUE(db.query("SET standard_conforming_strings = off", {}, Deadline::after(5s)));
    auto copy = db.start("COPY (SELECT '\\' || ') TO STDOUT");
    auto after = db.start("SELECT 'after'");
    auto rcopy = copy.result(Deadline::after(5s));
    ASSERT_FALSE(rcopy.has_value());
    EXPECT_EQ(rcopy.error().code, pg::Errc::kUnsupported) << rcopy.error().message;
    EXPECT_EQ(value_of(after.result(Deadline::after(5s))), "after");
  });
}

// --- Session settings the decoders rely on -------------------------------------------------

// session_settings_in_force() looks at DateStyle and TimeZone only (the settings the server
// reports); extra_float_digits set by the conninfo's own options is never put back.
// fixed (was a defect): conninfo options='-c extra_float_digits=0' wins over spindle's startup
// options and is never put back (only DateStyle/TimeZone are checked, extra_float_digits is not
// reported by the server): 0.1+0.2 reads "0.3", not "0.30000000000000004" (docs: the conninfo's own
// options setting them get one statement setting them).
TEST(PgReview, AConninfosExtraFloatDigitsDoesNotTruncateDoubles) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(
      runtime, pg::Options{.conninfo = postgres->conninfo() + " options='-c extra_float_digits=0'",
                           .connections = 1});
  runtime.block_on([&] {
    auto r = db.query("SELECT 0.1::float8 + 0.2::float8", {}, Deadline::after(5s));
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(std::string(r->text(0, 0)), "0.30000000000000004") << "doubles lose digits";
  });
}

// A session whose settings came by statement (the conninfo's own options over spindle's) gets
// the conninfo's DateStyle back after DISCARD ALL / RESET ALL, the application's statements:
// docs/database.md promises such a DateStyle reads as kBadValue, never as another timestamp
// (here SQL,DMY: 01/06 read as January 6 would be a silent wrong value).
TEST(PgReview, AfterDiscardAllOrResetAllTimestampsReadRightOrAsBadValueNeverWrong) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime,
                  pg::Options{.conninfo = postgres->conninfo() + " options='-c DateStyle=SQL,DMY'",
                              .connections = 1});
  const pg::Timestamp june_first =
      pg::Timestamp(std::chrono::sys_days(std::chrono::year(2026) / 6 / 1)) +
      std::chrono::hours(12);
  runtime.block_on([&] {
    for (const char* reset : {"DISCARD ALL", "RESET ALL"}) {
      ASSERT_TRUE(db.query(reset, {}, Deadline::after(5s)).has_value()) << reset;
      auto r = db.query("SELECT '2026-06-01 12:00:00+00'::timestamptz", {}, Deadline::after(5s));
      ASSERT_TRUE(r.has_value()) << r.error().message;
      auto t = r->get<pg::Timestamp>(0, 0);
      if (t) {
        EXPECT_EQ(*t, june_first) << reset << ": " << r->text(0, 0);
      } else {
        EXPECT_EQ(t.error().code, pg::Errc::kBadValue) << reset << ": " << t.error().message;
      }
    }
  });
}

// One caller's SET changes what another caller's doubles read as, silently (not kBadValue).
// defect (session state shared between callers): one fiber's SET extra_float_digits = 0 makes
// another fiber's double on the same pooled connection read 0.3 for 0.30000000000000004, silently
// (DateStyle is guarded by kBadValue, extra_float_digits is not).
TEST(PgReview, OneCallersSetOfExtraFloatDigitsNeverSilentlyChangesAnothersDoubles) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto other = spawn([&] {
      return db.query("SET extra_float_digits = 0", {}, Deadline::after(5s)).has_value();
    });
    ASSERT_TRUE(other.join());
    auto r = db.query("SELECT 0.1::float8 + 0.2::float8", {}, Deadline::after(5s));
    ASSERT_TRUE(r.has_value()) << r.error().message;
    auto d = r->get<double>(0, 0);
    // Either the right value or an error: never 0.3 for 0.30000000000000004.
    if (d) {
      EXPECT_EQ(std::string(r->text(0, 0)), "0.30000000000000004")
          << "another caller's SET cut the digits";
    }
  });
}

// --- Transactions never leak to another caller --------------------------------------------

// A BEGIN through db.query (not db.begin) leaves the shared connection in a transaction block:
// the next caller's INSERT, reported done, is rolled back by the first caller's ROLLBACK.
// fixed (was a defect): db.query("BEGIN") leaves the shared connection in a transaction block;
// another fiber's INSERT runs inside it, is reported done, and is rolled back by the first fiber's
// ROLLBACK (invariant: a connection shared again has no open transaction).
TEST(PgReview, ABeginThroughQueryNeverPutsAnotherCallersStatementInsideItsTransaction) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  auto table = pg_fresh_table(*postgres, "pg_review_begin_leak");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  bool inserted = false;
  runtime.block_on([&] {
    auto begun = db.query("BEGIN", {}, Deadline::after(5s));
    auto victim = spawn([&] {
      EXPECT_FALSE(inside_a_transaction(db)) << "another caller's statement ran in a "
                                                "transaction it did not open";
      return db.query("INSERT INTO pg_review_begin_leak VALUES (1, 'x')", {}, Deadline::after(5s))
          .has_value();
    });
    inserted = victim.join();
    if (begun) (void)db.query("ROLLBACK", {}, Deadline::after(5s));
  });
  ASSERT_TRUE(inserted);
  EXPECT_EQ(rows_of_table(*postgres, table), 1) << "an INSERT reported done was rolled back by "
                                                   "another caller's ROLLBACK";
}

// The same BEGIN, then an error: every other caller of the connection gets the neighbour's
// "current transaction is aborted" (25P02).
// fixed (was a defect): after db.query("BEGIN") and a failing statement, another fiber's "SELECT
// 'mine'" on the shared connection fails with 25P02 (current transaction is aborted) (invariant: a
// connection shared again has no open transaction).
TEST(PgReview, AnAbortedTransactionOpenedThroughQueryNeverFailsAnotherCaller) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    (void)db.query("BEGIN", {}, Deadline::after(5s));
    (void)db.query("SELECT 1/0", {}, Deadline::after(5s));
    auto victim = spawn([&] { return db.query("SELECT 'mine'", {}, Deadline::after(5s)); });
    auto r = victim.join();
    EXPECT_EQ(value_of(r), "mine") << (r ? "" : r.error().sqlstate);
    (void)db.query("ROLLBACK", {}, Deadline::after(5s));
  });
}

// A transaction whose fiber is stopped in the middle: nothing of it commits, and the next
// caller is not inside it.
TEST(PgReview, ATransactionWhoseFiberIsStoppedMidwayLeavesNothingForTheNextCaller) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(30s);
  auto table = pg_fresh_table(*postgres, "pg_review_stopped_tx");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    for (int round = 0; round < 3; ++round) {
      auto worker = spawn([&] {
        auto tx = db.begin(Deadline::after(5s));
        ASSERT_TRUE(tx.has_value()) << tx.error().message;
        ASSERT_TRUE(tx->query("INSERT INTO pg_review_stopped_tx VALUES ($1, 'x')",
                              {pg::param(round)}, Deadline::after(5s)));
        auto slow = tx->query("SELECT pg_sleep(2)", {}, Deadline::after(10s));
        EXPECT_FALSE(slow.has_value());
        // Stopped: what it still tries is not sent, and its end rolls back.
        (void)tx->query("INSERT INTO pg_review_stopped_tx VALUES (100 + $1, 'x')",
                        {pg::param(round)}, Deadline::after(5s));
        (void)tx->commit(Deadline::after(5s));
      });
      (void)this_fiber::sleep_for(100ms);
      worker.request_stop();
      worker.join();
      EXPECT_FALSE(inside_a_transaction(db)) << "round " << round;
    }
  });
  EXPECT_EQ(rows_of_table(*postgres, table), 0);
}

// A failed COMMIT (a deferred constraint): the error reaches the committer with its SQLSTATE
// and the connection goes back out of any transaction.
TEST(PgReview, AFailedCommitIsReportedAndTheConnectionGoesBackClean) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  pg_run(postgres->conninfo(),
         "DROP TABLE IF EXISTS pg_review_deferred; CREATE TABLE pg_review_deferred (id int "
         "UNIQUE DEFERRABLE INITIALLY DEFERRED)");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto tx = db.begin(Deadline::after(5s));
    ASSERT_TRUE(tx.has_value());
    ASSERT_TRUE(
        tx->query("INSERT INTO pg_review_deferred VALUES (1), (1)", {}, Deadline::after(5s)));
    auto done = tx->commit(Deadline::after(5s));
    ASSERT_FALSE(done.has_value());
    EXPECT_EQ(done.error().sqlstate, "23505") << done.error().message;
    EXPECT_FALSE(inside_a_transaction(db));
    EXPECT_EQ(
        value_of(db.query("SELECT count(*) FROM pg_review_deferred", {}, Deadline::after(5s))),
        "0");
  });
}

// DISCARD ALL inside a transaction fails (25001) and fails the transaction; nothing of it
// stays, and the statements after it (renamed by the client) are served.
TEST(PgReview, DiscardAllInsideATransactionFailsItAloneAndPreparedStatementsServeOn) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto twice = db.prepare("SELECT $1::int * 2");
  runtime.block_on([&] {
    ASSERT_TRUE(db.query(twice, {pg::param(1)}, Deadline::after(5s)));
    auto tx = db.begin(Deadline::after(5s));
    ASSERT_TRUE(tx.has_value());
    auto discard = tx->query("DISCARD ALL", {}, Deadline::after(5s));
    ASSERT_FALSE(discard.has_value());
    EXPECT_EQ(discard.error().sqlstate, "25001");
    auto in_tx = tx->query(twice, {pg::param(2)}, Deadline::after(5s));
    EXPECT_FALSE(in_tx.has_value());
    auto end = tx->commit(Deadline::after(5s));
    EXPECT_FALSE(end.has_value());
    EXPECT_EQ(value_of(db.query(twice, {pg::param(21)}, Deadline::after(5s))), "42");
  });
}

// --- "Not sent" never ran ----------------------------------------------------------------------

// A second result() on a Query whose first gave up says "not sent" (kClosed, not_sent) for a
// statement that was sent and runs.
// fixed (was a defect): a second result() on a Query whose first result() timed out reports
// not_sent = true, yet the INSERT ran (1 row) (invariant: not_sent only for statements that never
// left the client).
TEST(PgReview, AQueryAskedAgainAfterItsDeadlineNeverSaysNotSentForAStatementThatRan) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  auto table = pg_fresh_table(*postgres, "pg_review_asked_twice");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  bool said_not_sent = false;
  runtime.block_on([&] {
    auto insert = db.start("INSERT INTO pg_review_asked_twice SELECT 1, 'x' FROM pg_sleep(0.3)");
    auto behind = db.start("SELECT 1");  // so that no cancel goes for the insert
    auto first = insert.result(Deadline::after(50ms));
    ASSERT_FALSE(first.has_value());
    EXPECT_EQ(first.error().code, pg::Errc::kTimedOut);
    EXPECT_FALSE(first.error().not_sent);
    auto again = insert.result(Deadline::after(2s));
    ASSERT_FALSE(again.has_value());
    said_not_sent = again.error().not_sent;
    (void)behind.result(Deadline::after(5s));
  });
  if (said_not_sent) {
    EXPECT_EQ(rows_of_table(*postgres, table), 0) << "reported not sent, and it ran";
  }
}

// Deadlines now and in the past: nothing is sent, nothing runs.
TEST(PgReview, DeadlinesNowAndPastSendNothing) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  auto table = pg_fresh_table(*postgres, "pg_review_past");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto insert = db.prepare("INSERT INTO pg_review_past VALUES ($1, 'x')");
  runtime.block_on([&] {
    ASSERT_TRUE(db.query("SELECT 1", {}, Deadline::after(5s)));  // a connection open
    int id = 0;
    for (Deadline d :
         {Deadline::no_wait(), Deadline::at(Clock::now()), Deadline::at(Clock::now() - 1h)}) {
      auto r = db.query(insert, {pg::param(++id)}, d);
      ASSERT_FALSE(r.has_value());
      EXPECT_EQ(r.error().code, pg::Errc::kTimedOut);
      EXPECT_TRUE(r.error().not_sent) << r.error().message;
      auto tx = db.begin(Deadline::after(5s));
      ASSERT_TRUE(tx.has_value());
      auto rt = tx->query(insert, {pg::param(++id)}, d);
      ASSERT_FALSE(rt.has_value());
      EXPECT_TRUE(rt.error().not_sent) << rt.error().message;
      ASSERT_TRUE(tx->commit(Deadline::after(5s)));
    }
    // result() with a deadline passed, on a statement sent: timed out, outcome unknown; the
    // connection serves on.
    auto q = db.start("SELECT pg_sleep(0.2)");
    auto r = q.result(Deadline::no_wait());
    EXPECT_EQ(r.error().code, pg::Errc::kTimedOut);
    EXPECT_FALSE(r.error().not_sent);
    EXPECT_EQ(value_of(db.query("SELECT 'next'", {}, Deadline::after(5s))), "next");
  });
  EXPECT_EQ(rows_of_table(*postgres, table), 0);
}

// db.start() "returns a pg::Query at once": with the only connection held by a transaction it
// waits for the transaction's end instead, so result()'s deadline cannot bound the call.
// fixed (was a defect): with the only connection reserved by a transaction, db.start() blocks until
// the transaction ends (2001 ms) instead of returning at once; result(200 ms) cannot bound the call
// (docs: start() returns a Query at once; every call returns by its deadline).
TEST(PgReview, StartReturnsAtOnceSoThatTheResultsDeadlineBoundsTheCall) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto tx = db.begin(Deadline::after(5s));
    ASSERT_TRUE(tx.has_value());
    auto caller = spawn([&] {
      auto started = Clock::now();
      auto q = db.start("SELECT 1");
      auto r = q.result(Deadline::after(200ms));
      (void)r;
      return ms_since(started);
    });
    (void)this_fiber::sleep_for(2s);
    ASSERT_TRUE(tx->commit(Deadline::after(5s)));
    auto elapsed = caller.join();
    EXPECT_LT(elapsed, 200ms + kDeadlineSlack)
        << "start() + result(200 ms) took " << elapsed.count() << " ms";
  });
}

// The other side of the same fix: a statement started while no connection was free is sent by
// result() (its parameters copied: the caller's buffers may be gone by then), and one whose
// Query is dropped unasked is still sent once a connection frees, as a Query sent at once is.
TEST(PgReview, AStatementStartedWhileNoConnectionWasFreeIsSentLater) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  pg_run(postgres->conninfo(),
         "DROP TABLE IF EXISTS pg_review_later; CREATE TABLE pg_review_later (v text)");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto tx = db.begin(Deadline::after(5s));
    ASSERT_TRUE(tx.has_value());
    pg::Query echoed, counted;
    {
      std::string text(100, 'p'), bytes(3, '\x01');  // gone before the statements are sent
      std::vector<pg::Param> params{pg::param(std::string_view(text)), pg::Bytes{bytes}};
      echoed = db.start("SELECT $1::text || length($2::bytea)", params);
      (void)db.start("INSERT INTO pg_review_later VALUES ('dropped unasked')");
      std::fill(text.begin(), text.end(), 'x');
    }
    counted = db.start("SELECT count(*) FROM pg_review_later");
    ASSERT_TRUE(tx->commit(Deadline::after(5s)));
    EXPECT_EQ(value_of(echoed.result(Deadline::after(5s))), std::string(100, 'p') + "3");
    // Sent in the order the connection freed for them: the dropped INSERT went before.
    auto n = counted.result(Deadline::after(5s));
    pg::Expected<pg::Result> rows = std::unexpected(pg::Error{});
    for (int i = 0; i < 50; ++i) {
      rows = db.query("SELECT count(*) FROM pg_review_later", {}, Deadline::after(5s));
      if (value_of(rows) == "1") break;
      (void)this_fiber::sleep_for(50ms);
    }
    EXPECT_EQ(value_of(rows), "1") << "the INSERT whose Query was dropped was never sent";
    EXPECT_TRUE(n.has_value());
  });
}

// --- Misused or foreign statements: errors, not exceptions -----------------------------------

// fixed (was a defect): db.query(pg::Statement{}) throws std::out_of_range (statements.at(id - 1)
// with id 0 -> index 4294967295) instead of returning a pg::Error; pg::Statement{12345} likewise.
TEST(PgReview, AStatementNotRegisteredWithThisDatabaseIsAnErrorNotAnException) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    for (pg::Statement foreign : {pg::Statement{}, pg::Statement{12345}}) {
      pg::Expected<pg::Result> r = pg::Result();
      EXPECT_NO_THROW(r = db.query(foreign, {}, Deadline::after(2s))) << foreign.id;
      EXPECT_FALSE(r.has_value()) << foreign.id;
    }
    EXPECT_EQ(value_of(db.query("SELECT 'served'", {}, Deadline::after(5s))), "served");
  });
}

// --- Prepared statements ----------------------------------------------------------------------

// A prepared statement whose table changed shape fails with 0A000 ("cached plan must not
// change result type") on every call of that connection, for good.
// fixed (was a defect): after ALTER TABLE ... ADD COLUMN, a prepared "SELECT * FROM t" fails with
// 0A000 (cached plan must not change result type) on every later call of that connection, for good
// (expected: prepared again, served after at most one failure).
TEST(PgReview, APreparedStatementIsServedAgainAfterItsTableChangedShape) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  pg_run(postgres->conninfo(),
         "DROP TABLE IF EXISTS pg_review_shape; CREATE TABLE "
         "pg_review_shape (id int); INSERT INTO pg_review_shape VALUES (7)");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto all = db.prepare("SELECT * FROM pg_review_shape");
  runtime.block_on([&] {
    ASSERT_EQ(value_of(db.query(all, {}, Deadline::after(5s))), "7");
    pg_run(postgres->conninfo(), "ALTER TABLE pg_review_shape ADD COLUMN note text");
    (void)db.query(all, {}, Deadline::after(5s));  // may fail once, as after DEALLOCATE
    for (int i = 0; i < 3; ++i) {
      auto r = db.query(all, {}, Deadline::after(5s));
      ASSERT_TRUE(r.has_value()) << "call " << i << ": " << r.error().sqlstate << " "
                                 << r.error().message;
      EXPECT_EQ(r->columns(), 2);
    }
    // The name the server refused is dropped, not left in the session.
    auto n = db.query("SELECT count(*) FROM pg_prepared_statements", {}, Deadline::after(5s));
    EXPECT_EQ(value_of(n), "1");
  });
}

// DISCARD TEMP / PLANS / SEQUENCES and DEALLOCATE of one name are taken for "every prepared
// statement is gone": the client renames all of its statements and prepares them again, while
// the old ones stay prepared in the session, so each such statement leaves a full set behind.
// fixed (was a defect): DISCARD TEMP / PLANS / SEQUENCES and DEALLOCATE <one name> make the client
// rename and re-prepare every statement while the old ones stay prepared: 100 entries in
// pg_prepared_statements after 20 rounds of 5 statements (invariant: bounded memory, server side).
TEST(PgReview, PreparedStatementsOnAConnectionStayBoundedWhateverIsDiscarded) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(30s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  std::vector<pg::Statement> statements;
  for (int i = 0; i < 5; ++i) statements.push_back(db.prepare("SELECT " + std::to_string(i)));
  runtime.block_on([&] {
    // (The application's own statement "mine", prepared and dropped by name.)
    const char* discards[] = {"DISCARD TEMP", "DISCARD PLANS", "DISCARD SEQUENCES",
                              "DEALLOCATE mine"};
    for (int round = 0; round < 20; ++round) {
      for (const auto& s : statements) ASSERT_TRUE(db.query(s, {}, Deadline::after(5s)));
      if (round % 4 == 3) {
        ASSERT_TRUE(db.query("PREPARE mine AS SELECT 1", {}, Deadline::after(5s)));
      }
      auto r = db.query(discards[round % 4], {}, Deadline::after(5s));
      ASSERT_TRUE(r.has_value()) << discards[round % 4] << ": " << r.error().message;
    }
    auto n = db.query("SELECT count(*) FROM pg_prepared_statements", {}, Deadline::after(5s));
    ASSERT_TRUE(n.has_value());
    EXPECT_LE(*n->get<int>(0, 0), 5) << "prepared statements left in the session";
  });
}

// A statement that fails to prepare (its table does not exist yet), called twice at once:
// the second call finds no such statement (26000), which the client takes for "the session
// lost every statement": all of them are renamed and prepared again, the old ones left behind.
// fixed (was a defect): a statement whose Parse fails (42P01), started twice at once: the second
// call gets 26000 "prepared statement ... does not exist" instead of 42P01, and every other
// statement is renamed and prepared again, old ones left: 100 prepared after 20 rounds (honest
// errors; bounded memory).
TEST(PgReview, AStatementFailingToPrepareUnderLoadNeverMultipliesTheOthers) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(30s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  std::vector<pg::Statement> statements;
  for (int i = 0; i < 5; ++i) statements.push_back(db.prepare("SELECT " + std::to_string(i)));
  auto missing = db.prepare("SELECT * FROM pg_review_not_created_yet");
  runtime.block_on([&] {
    int misreported = 0;
    std::string example;
    for (int round = 0; round < 20; ++round) {
      for (const auto& s : statements) ASSERT_TRUE(db.query(s, {}, Deadline::after(5s)));
      auto first = db.start(missing, {});
      auto second = db.start(missing, {});
      auto r1 = first.result(Deadline::after(5s));
      auto r2 = second.result(Deadline::after(5s));
      ASSERT_FALSE(r1.has_value());
      ASSERT_FALSE(r2.has_value());
      EXPECT_EQ(r1.error().sqlstate, "42P01");
      if (r2.error().sqlstate != "42P01") {
        ++misreported;
        example = r2.error().sqlstate + " " + r2.error().message;
      }
    }
    EXPECT_EQ(misreported, 0) << "the second call's error, e.g.: " << example;
    auto n = db.query("SELECT count(*) FROM pg_prepared_statements", {}, Deadline::after(5s));
    ASSERT_TRUE(n.has_value());
    EXPECT_LE(*n->get<int>(0, 0), 5) << "prepared statements left in the session";
  });
}

// One caller's SET client_encoding makes the server read another caller's UTF-8 text as
// LATIN1: the text is stored changed, and the call reports success.
// defect (session state shared between callers): after one fiber's SET client_encoding = 'LATIN1'
// on the shared connection, another fiber's UTF-8 parameter 'h\xc3\xa9' is stored as
// 'h\xc3\x83\xc2\xa9' and the INSERT reports success.
TEST(PgReview, AnotherCallersClientEncodingNeverSilentlyChangesStoredText) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  auto table = pg_fresh_table(*postgres, "pg_review_encoding");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto other = spawn([&] {
      return db.query("SET client_encoding = 'LATIN1'", {}, Deadline::after(5s)).has_value();
    });
    ASSERT_TRUE(other.join());
    auto r = db.query("INSERT INTO pg_review_encoding VALUES (1, $1)", {pg::param("h\xc3\xa9")},
                      Deadline::after(5s));
    if (!r) return;  // refused: nothing stored wrong
  });
  std::string stored = pg_run(postgres->conninfo(), "SELECT note FROM pg_review_encoding");
  if (!stored.empty()) {
    EXPECT_EQ(stored, "h\xc3\xa9") << "stored as another text";
  }
}

// The same text prepared twice, called with values of different types, and a parameter of
// the wrong type: each call gets its own answer or its own error.
TEST(PgReview, PreparedStatementsWithTheSameTextAndMismatchedParametersFailAlone) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto a = db.prepare("SELECT $1 || ''");
  auto b = db.prepare("SELECT $1 || ''");
  auto plus = db.prepare("SELECT $1 + 1");
  runtime.block_on([&] {
    auto q1 = db.start(a, std::vector<pg::Param>{pg::param(5)});
    auto q2 = db.start(b, std::vector<pg::Param>{pg::param("text")});
    auto q3 = db.start(plus, std::vector<pg::Param>{pg::param("not a number")});
    const char raw[] = {'\x01', '\x02', '\x03'};
    auto q4 = db.start(plus, std::vector<pg::Param>{pg::Bytes{std::string_view(raw, 3)}});
    auto q5 = db.start(plus, std::vector<pg::Param>{pg::param(41)});
    EXPECT_EQ(value_of(q1.result(Deadline::after(5s))), "5");
    EXPECT_EQ(value_of(q2.result(Deadline::after(5s))), "text");
    auto r3 = q3.result(Deadline::after(5s));
    ASSERT_FALSE(r3.has_value());
    EXPECT_EQ(r3.error().sqlstate, "22P02");
    auto r4 = q4.result(Deadline::after(5s));
    ASSERT_FALSE(r4.has_value());
    EXPECT_EQ(r4.error().code, pg::Errc::kServerError) << r4.error().message;
    EXPECT_EQ(value_of(q5.result(Deadline::after(5s))), "42");
  });
}

// --- Statement texts and parameters ------------------------------------------------------------

TEST(PgReview, MultiStatementStringsNulBytesAndInvalidUtf8FailAloneWithClearErrors) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  auto table = pg_fresh_table(*postgres, "pg_review_texts");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto before = db.start("SELECT 'before'");
    auto multi = db.start("INSERT INTO pg_review_texts VALUES (1, 'x'); SELECT 2");
    auto smuggle = db.start("SELECT 1; COPY pg_review_texts FROM STDIN");
    const std::string nul("a\0b", 3);
    auto with_nul = db.start("SELECT $1::text", std::vector<pg::Param>{pg::param(nul)});
    auto bad_utf8 = db.start("SELECT $1::text", std::vector<pg::Param>{pg::param("\xc3\x28")});
    auto bytes_nul = db.start("SELECT length($1::bytea)",
                              std::vector<pg::Param>{pg::Bytes{std::string_view(nul)}});
    auto after = db.start("SELECT 'after'");
    EXPECT_EQ(value_of(before.result(Deadline::after(5s))), "before");
    auto rm = multi.result(Deadline::after(5s));
    ASSERT_FALSE(rm.has_value());
    EXPECT_EQ(rm.error().sqlstate, "42601") << rm.error().message;
    auto rs = smuggle.result(Deadline::after(5s));
    ASSERT_FALSE(rs.has_value());
    auto rn = with_nul.result(Deadline::after(5s));
    ASSERT_FALSE(rn.has_value());
    EXPECT_EQ(rn.error().code, pg::Errc::kBadValue);
    EXPECT_TRUE(rn.error().not_sent);
    auto ru = bad_utf8.result(Deadline::after(5s));
    ASSERT_FALSE(ru.has_value());
    EXPECT_EQ(ru.error().sqlstate, "22021") << ru.error().message;
    EXPECT_EQ(value_of(bytes_nul.result(Deadline::after(5s))), "3");
    EXPECT_EQ(value_of(after.result(Deadline::after(5s))), "after");
    std::vector<pg::Param> too_many(65536, pg::param(1));
    auto rt = db.query("SELECT 1", too_many, Deadline::after(5s));
    ASSERT_FALSE(rt.has_value());
    EXPECT_TRUE(rt.error().not_sent);
  });
  EXPECT_EQ(rows_of_table(*postgres, table), 0);
}

// --- Types: decoded right, or an error ---------------------------------------------------------

TEST(PgReview, EdgeValuesDecodeRightOrFailAsErrors) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto r = db.query(
        "SELECT 'NaN'::float8, 'Infinity'::float8, '-Infinity'::float8, '-0'::float8, "
        "1.7976931348623157e308::float8, 5e-324::float8, (-9223372036854775808)::int8, "
        "9223372036854775807::int8, 'infinity'::timestamptz, '0001-01-01 00:00:00 BC'::timestamp, "
        "'10000-01-01'::timestamptz, '1900-01-01 00:00:00+00:53:28'::timestamptz, "
        "12345678901234567890123456789::numeric, 'NaN'::numeric, '1.5'::numeric",
        {}, Deadline::after(5s));
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_TRUE(std::isnan(*r->get<double>(0, 0)));
    EXPECT_EQ(*r->get<double>(0, 1), std::numeric_limits<double>::infinity());
    EXPECT_EQ(*r->get<double>(0, 2), -std::numeric_limits<double>::infinity());
    EXPECT_TRUE(std::signbit(*r->get<double>(0, 3)));
    EXPECT_EQ(*r->get<double>(0, 4), std::numeric_limits<double>::max());
    EXPECT_EQ(*r->get<double>(0, 5), std::numeric_limits<double>::denorm_min());
    EXPECT_EQ(*r->get<std::int64_t>(0, 6), std::numeric_limits<std::int64_t>::min());
    EXPECT_EQ(*r->get<std::int64_t>(0, 7), std::numeric_limits<std::int64_t>::max());
    EXPECT_EQ(r->get<std::int32_t>(0, 7).error().code, pg::Errc::kBadValue);
    EXPECT_EQ(r->get<std::uint64_t>(0, 6).error().code, pg::Errc::kBadValue);
    for (int column : {8, 9, 10}) {
      EXPECT_FALSE(r->get<pg::Timestamp>(0, column).has_value()) << r->text(0, column);
    }
    auto lmt = r->get<pg::Timestamp>(0, 11);
    ASSERT_TRUE(lmt.has_value()) << r->text(0, 11);
    EXPECT_EQ(*lmt, pg::Timestamp(std::chrono::sys_days(std::chrono::year(1900) / 1 / 1)) -
                        std::chrono::minutes(53) - std::chrono::seconds(28));
    EXPECT_EQ(r->get<std::int64_t>(0, 12).error().code, pg::Errc::kBadValue);
    EXPECT_TRUE(std::isnan(*r->get<double>(0, 13)));
    EXPECT_EQ(r->get<int>(0, 14).error().code, pg::Errc::kBadValue);
    EXPECT_EQ(*r->get<double>(0, 14), 1.5);
    // Out of the row/column range: an error, never a read past the result.
    EXPECT_FALSE(r->get<int>(5, 0).has_value());
    EXPECT_FALSE(r->get<int>(0, 99).has_value());
    EXPECT_FALSE(r->get<int>(-1, -1).has_value());
  });
}

// A float read of a double out of float's range is a conversion with undefined behaviour
// (static_cast<float>(1e300)); integers out of range are kBadValue, floats must be too.
// fixed (was a defect): Result::get<float> of 1e300 is static_cast<float>(double) out of range
// (undefined behaviour; gives inf here) instead of kBadValue, as integers out of range are.
TEST(PgReview, ADoubleOutOfFloatsRangeReadAsFloatIsAnErrorNotUndefinedBehaviour) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto r = db.query("SELECT 1e300::float8, -1e300::float8", {}, Deadline::after(5s));
    ASSERT_TRUE(r.has_value());
    for (int column : {0, 1}) {
      auto f = r->get<float>(0, column);
      EXPECT_FALSE(f.has_value()) << r->text(0, column) << " read as float " << *f;
    }
  });
}

namespace review {

// Days since 1970-01-01 of a proleptic Gregorian date, in 64 bits (H. Hinnant's algorithm),
// for years std::chrono::year cannot hold.
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const std::int64_t yoe = y - era * 400;
  const std::int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const std::int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

}  // namespace review

// A Timestamp past year 32767 (PostgreSQL takes them up to 294276) is written with its year
// cut to 16 bits: year 70000 goes as 4464, a wrong value stored without an error.
// fixed (was a defect): a pg::Timestamp parameter of year 70000 is sent as year 4464 (the year cut
// to 16 bits) and stored without an error (expected: the right year, or kBadValue before sending).
TEST(PgReview, ATimestampParameterOfAFarYearIsSentRightOrRefused) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(20s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    for (std::int64_t year : {std::int64_t{9999}, std::int64_t{40000}, std::int64_t{70000}}) {
      pg::Timestamp t{std::chrono::days(days_from_civil(year, 1, 1))};
      auto r = db.query("SELECT $1::timestamptz::text", {pg::Param(t)}, Deadline::after(5s));
      if (!r) continue;  // refused, or refused by the server: no wrong value
      std::string stored(r->text(0, 0));
      EXPECT_EQ(stored.substr(0, stored.find('-')), std::to_string(year))
          << "a Timestamp of year " << year << " was stored as " << stored;
    }
  });
}

// --- What a statement does never stops the worker -----------------------------------------

// A result of a million rows: its call is answered, and the worker keeps waking its other
// fibers while the rows stream in.
TEST(PgReview, AMillionRowResultNeverHoldsTheWorker) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(60s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    ASSERT_TRUE(db.query("SELECT 1", {}, Deadline::after(5s)));
    WorkerProbe probe;
    auto r = db.query("SELECT g, repeat('x', 50) FROM generate_series(1, 1000000) g", {},
                      Deadline::after(40s));
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(r->rows(), 1000000);
    EXPECT_EQ(*r->get<int>(999999, 0), 1000000);
    EXPECT_LT(probe.worst_ms(), kWorkerHeldMs) << "the worker was held while the rows came";
  });
}

// One value of 256 MiB: answered, and the worker keeps waking its other fibers meanwhile.
TEST(PgReview, AHugeValueInAResultNeverHoldsTheWorker) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(60s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    ASSERT_TRUE(db.query("SELECT 1", {}, Deadline::after(5s)));
    WorkerProbe probe;
    auto r = db.query("SELECT repeat('v', 256 * 1024 * 1024)", {}, Deadline::after(40s));
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(r->text(0, 0).size(), 256u << 20);
    EXPECT_LT(probe.worst_ms(), kWorkerHeldMs) << "the worker was held while the value came";
  });
}

// A fiber stopped while it waits for its result: kCanceled at once, of unknown outcome; the
// statement is canceled on the server, and the one pipelined beside it on another fiber is
// answered.
TEST(PgReview, AFiberStoppedWhileWaitingForItsResultEndsAtOnceAndHurtsNoNeighbour) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(30s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    for (int round = 0; round < 5; ++round) {
      auto victim = spawn([&] { return db.query("SELECT pg_sleep(5)", {}, Deadline::after(10s)); });
      (void)this_fiber::sleep_for(50ms);
      auto started = Clock::now();
      victim.request_stop();
      auto r = victim.join();
      EXPECT_LT(ms_since(started), kDeadlineSlack);
      ASSERT_FALSE(r.has_value());
      EXPECT_EQ(r.error().code, pg::Errc::kCanceled);
      EXPECT_FALSE(r.error().not_sent);
      started = Clock::now();
      auto next = db.query("SELECT 'next'", {}, Deadline::after(6s));
      EXPECT_EQ(value_of(next), "next") << "round " << round;
      EXPECT_LT(ms_since(started), 2s) << "the sleep was not canceled on the server";
    }
  });
}

// Thousands of fibers on a one-connection pool, errors among them, a transaction in the middle:
// every call gets its own answer or its own error.
TEST(PgReview, FiveThousandFibersOnOneConnectionEachGetTheirOwnAnswer) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(90s);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto echo = db.prepare("SELECT $1::int");
  auto fail = db.prepare("SELECT $1::int / ($1::int - $1::int)");
  runtime.block_on([&] {
    // The connection open before the storm: under ASan the spawning of 5000 fibers outlasted
    // the open's 5 s connect_timeout, which fails every waiting call at once (documented).
    ASSERT_TRUE(db.query("SELECT 1", {}, Deadline::after(10s)));
    constexpr int kFibers = 5000;
    std::vector<JoinHandle<std::string>> fibers;
    for (int i = 0; i < kFibers; ++i) {
      fibers.push_back(spawn([&, i] {
        if (i == kFibers / 2) {
          auto tx = db.begin(Deadline::after(40s));
          if (!tx) return "tx: " + tx.error().message;
          auto r = tx->query(echo, {pg::param(i)}, Deadline::after(40s));
          if (!tx->commit(Deadline::after(40s))) return std::string("commit failed");
          return value_of(r);
        }
        auto r = db.query(i % 7 == 0 ? fail : echo, {pg::param(i)}, Deadline::after(40s));
        if (i % 7 == 0) return r ? "<answered>" : r.error().sqlstate;
        return value_of(r);
      }));
    }
    for (int i = 0; i < kFibers; ++i) {
      std::string got = fibers[i].join();
      std::string want = i % 7 == 0 && i != kFibers / 2 ? "22012" : std::to_string(i);
      EXPECT_EQ(got, want) << i;
    }
    EXPECT_EQ(db.stats().opened, 1u);
  });
}

// Errors of every class pipelined together, and a FATAL (the backend ends itself) in their
// middle: each call gets its own error; those after the FATAL the connection's loss, said to
// be of unknown outcome; the next call is served on a new connection.
TEST(PgReview, ErrorsOfEveryClassPipelinedReachTheirOwnCallsAndAFatalOnlyThoseAfterIt) {
  REQUIRE_POSTGRES(postgres);
  Watchdog watchdog(30s);
  pg_run(postgres->conninfo(),
         "DROP TABLE IF EXISTS pg_review_classes; CREATE TABLE "
         "pg_review_classes (id int PRIMARY KEY); INSERT INTO "
         "pg_review_classes VALUES (1)");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto raise = [](const char* state) {
    return std::string("DO $$ BEGIN RAISE EXCEPTION 'class' USING ERRCODE = '") + state +
           "'; END $$";
  };
  runtime.block_on([&] {
    std::vector<std::pair<std::string, std::string>> cases = {
        {"SELECT 1/0", "22012"},
        {"INSERT INTO pg_review_classes VALUES (1)", "23505"},
        {"SELECT * FROM pg_review_no_such_table", "42P01"},
        {raise("40001"), "40001"},
        {raise("40P01"), "40P01"},
        {raise("53100"), "53100"},
        {raise("XX000"), "XX000"},
        {raise("08006"), "08006"},
        {"SELECT pg_cancel_backend(pg_backend_pid()), pg_sleep(1)", "57014"},
        {"SELECT 'ok'", ""},
    };
    std::vector<pg::Query> queries;
    for (const auto& c : cases) queries.push_back(db.start(c.first));
    auto fatal = db.start("SELECT pg_terminate_backend(pg_backend_pid())");
    auto after = db.start("SELECT 'after the fatal'");
    for (std::size_t i = 0; i < cases.size(); ++i) {
      auto r = queries[i].result(Deadline::after(5s));
      if (cases[i].second.empty()) {
        EXPECT_EQ(value_of(r), "ok");
      } else {
        ASSERT_FALSE(r.has_value()) << cases[i].first;
        EXPECT_EQ(r.error().sqlstate, cases[i].second)
            << cases[i].first << ": " << r.error().message;
      }
    }
    auto rf = fatal.result(Deadline::after(5s));
    ASSERT_FALSE(rf.has_value());
    auto ra = after.result(Deadline::after(5s));
    ASSERT_FALSE(ra.has_value());
    EXPECT_EQ(ra.error().code, pg::Errc::kConnectionLost) << ra.error().message;
    EXPECT_FALSE(ra.error().not_sent);
    EXPECT_EQ(value_of(db.query("SELECT 'next'", {}, Deadline::after(5s))), "next");
    EXPECT_EQ(db.stats().open, 1u);
  });
}
