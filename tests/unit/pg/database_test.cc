// spindle's PostgreSQL client against a real PostgreSQL (started by the tests, as the postgres
// user when run as root): typed values both ways, pipelining on one connection, prepared
// statements, server errors, deadlines with a cancel, a killed backend, transactions, idle
// connections and closing.
#include "spindle/pg/database.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "pg_testing.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "testing/services.h"

using namespace std::chrono_literals;
using namespace spindle;

namespace {

using Clock = std::chrono::steady_clock;
using spindle::testing::pg_fresh_table;
using spindle::testing::pg_options;

}  // namespace

TEST(PgDatabase, TypedParametersAndResultsRoundTrip) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres));
  runtime.block_on([&] {
    const char raw[] = {'\0', '\x01', '\xff', 'a'};
    auto when = pg::Timestamp(std::chrono::sys_days(std::chrono::year(2026) / 11 / 25)) + 3h +
                4min + 5s + 678901us;
    auto r = db.query(
        "SELECT $1::int8, $2::text, $3::bool, $4::float8, $5::bytea, $6::timestamptz, "
        "NULL::int4, $7::int4",
        {pg::param(-9'000'000'000'000LL), pg::param("héllo, 'world'\\"), pg::param(true),
         pg::param(0.25), pg::Param(pg::Bytes{std::string_view(raw, sizeof raw)}), pg::Param(when),
         pg::Param(nullptr)});
    ASSERT_TRUE(r.has_value()) << r.error().message;
    ASSERT_EQ(r->rows(), 1);
    ASSERT_EQ(r->columns(), 8);
    EXPECT_EQ(*r->get<std::int64_t>(0, 0), -9'000'000'000'000LL);
    EXPECT_EQ(*r->get<std::string>(0, 1), "héllo, 'world'\\");
    EXPECT_EQ(*r->get<bool>(0, 2), true);
    EXPECT_EQ(*r->get<double>(0, 3), 0.25);
    auto bytes = r->get<std::vector<std::byte>>(0, 4);
    ASSERT_TRUE(bytes.has_value());
    ASSERT_EQ(bytes->size(), sizeof raw);
    EXPECT_TRUE(std::equal(bytes->begin(), bytes->end(), reinterpret_cast<const std::byte*>(raw)));
    EXPECT_EQ(*r->get<pg::Timestamp>(0, 5), when);
    EXPECT_TRUE(r->is_null(0, 6));
    EXPECT_EQ(*r->get<std::optional<int>>(0, 6), std::nullopt);
    EXPECT_EQ(r->get<int>(0, 6).error().code, pg::Errc::kBadValue);
    EXPECT_TRUE(r->is_null(0, 7));                                           // a NULL parameter
    EXPECT_EQ(r->get<std::int8_t>(0, 0).error().code, pg::Errc::kBadValue);  // out of range
    EXPECT_EQ(r->get<bool>(0, 1).error().code, pg::Errc::kBadValue);
  });
}

TEST(PgDatabase, ConcurrentCallsOfOneWorkerArePipelinedOnOneConnection) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto twice = db.prepare("SELECT $1::int4 * 2, pg_backend_pid()");
  runtime.block_on([&] {
    constexpr int kFibers = 300;
    std::vector<int> got(kFibers, -1);
    std::vector<int> backend(kFibers, 0);
    std::size_t deepest = 0;
    std::vector<JoinHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) {
      fibers.push_back(spawn([&, i] {
        auto query = db.start(twice, std::vector<pg::Param>{pg::param(i)});
        deepest = std::max(deepest, db.stats().in_flight);
        auto r = query.result(Deadline::after(10s));
        ASSERT_TRUE(r.has_value()) << r.error().message;
        got[i] = *r->get<int>(0, 0);
        backend[i] = *r->get<int>(0, 1);
      }));
    }
    for (auto& f : fibers) f.join();
    for (int i = 0; i < kFibers; ++i) EXPECT_EQ(got[i], 2 * i) << i;
    // One connection, one backend, many statements on the wire at once.
    EXPECT_EQ(std::count(backend.begin(), backend.end(), backend[0]), kFibers);
    EXPECT_EQ(db.stats().opened, 1u);
    EXPECT_GT(deepest, 10u);
  });
}

TEST(PgDatabase, SeveralStatementsOfOneFiberGoOutTogether) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto by_id = db.prepare("SELECT $1::int4 + 1000");
  runtime.block_on([&] {
    std::vector<pg::Query> queries;
    std::vector<pg::Param> p(1);
    for (int i = 0; i < 20; ++i) {
      p[0] = pg::param(i);
      queries.push_back(db.start(by_id, p));  // moved into the vector: still answered
    }
    EXPECT_EQ(db.stats().in_flight, 20u);
    for (int i = 19; i >= 0; --i) {  // asked in any order
      auto r = queries[i].result(Deadline::after(5s));
      ASSERT_TRUE(r.has_value()) << r.error().message;
      EXPECT_EQ(*r->get<int>(0, 0), 1000 + i);
    }
  });
}

TEST(PgDatabase, AStatementIsPreparedOncePerConnection) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto one = db.prepare("SELECT 1");
  auto count =
      db.prepare("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'spindle_%'");
  runtime.block_on([&] {
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(db.query(one, {}).has_value());
    auto r = db.query(count, {});
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(*r->get<int>(0, 0), 2);  // `one` and `count` itself, each once
  });
}

TEST(PgDatabase, ServerErrorsCarryTheirSqlstateAndLeaveTheConnectionUsable) {
  REQUIRE_POSTGRES(postgres);
  auto table = pg_fresh_table(*postgres, "pg_errors");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto insert = db.prepare("INSERT INTO pg_errors VALUES ($1, 'x')");
  auto broken = db.prepare("SELEC nothing");
  runtime.block_on([&] {
    // Pipelined together: the one that fails does not take the others with it.
    auto a = db.start("SELECT 1/0");
    auto b = db.start(insert, std::vector<pg::Param>{pg::param(1)});
    auto c = db.start(insert, std::vector<pg::Param>{pg::param(1)});
    auto d = db.start(broken, {});
    auto e = db.start("SELECT 'after'");
    auto ra = a.result(), rb = b.result(), rc = c.result(), rd = d.result(), re = e.result();
    ASSERT_FALSE(ra.has_value());
    EXPECT_EQ(ra.error().code, pg::Errc::kServerError);
    EXPECT_EQ(ra.error().sqlstate, "22012");
    EXPECT_NE(ra.error().message.find("division by zero"), std::string::npos);
    ASSERT_TRUE(rb.has_value()) << rb.error().message;
    EXPECT_EQ(rb->affected(), 1);
    ASSERT_FALSE(rc.has_value());
    EXPECT_EQ(rc.error().sqlstate, "23505");
    ASSERT_FALSE(rd.has_value());
    EXPECT_EQ(rd.error().sqlstate, "42601");
    ASSERT_TRUE(re.has_value()) << re.error().message;
    EXPECT_EQ(*re->get<std::string>(0, 0), "after");
    // The statement that failed to prepare is tried again (and fails again, the same way).
    auto again = db.query(broken, {});
    ASSERT_FALSE(again.has_value());
    EXPECT_EQ(again.error().sqlstate, "42601");
    EXPECT_EQ(db.stats().opened, 1u);
  });
}

TEST(PgDatabase, ADeadlineEndsTheCallAndCancelsTheStatementOnTheServer) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto started = Clock::now();
    auto slow = db.query("SELECT pg_sleep(30)", {}, Deadline::after(200ms));
    ASSERT_FALSE(slow.has_value());
    EXPECT_EQ(slow.error().code, pg::Errc::kTimedOut);
    EXPECT_LT(Clock::now() - started, 5s);
    // The same connection answers the next call once the server has stopped the sleep: well
    // before the 30 s it was asked for.
    auto next = db.query("SELECT 'next'", {}, Deadline::after(20s));
    ASSERT_TRUE(next.has_value()) << next.error().message;
    EXPECT_EQ(*next->get<std::string>(0, 0), "next");
    EXPECT_LT(Clock::now() - started, 15s);
    EXPECT_EQ(db.stats().opened, 1u);
  });
}

TEST(PgDatabase, AKilledBackendFailsItsCallsAndTheNextCallOpensAnother) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  pg::Database killer(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto pid = db.query("SELECT pg_backend_pid()");
    ASSERT_TRUE(pid.has_value()) << pid.error().message;
    auto victim = db.start("SELECT pg_sleep(30)");
    auto behind = db.start("SELECT 2");
    auto killed = killer.query("SELECT pg_terminate_backend($1)",
                               std::vector<pg::Param>{pg::param(*pid->get<int>(0, 0))});
    ASSERT_TRUE(killed.has_value()) << killed.error().message;
    auto rv = victim.result(Deadline::after(10s));
    auto rb = behind.result(Deadline::after(10s));
    ASSERT_FALSE(rv.has_value());
    ASSERT_FALSE(rb.has_value());
    EXPECT_EQ(rb.error().code, pg::Errc::kConnectionLost) << rb.error().message;
    auto after = db.query("SELECT 3", {}, Deadline::after(10s));
    ASSERT_TRUE(after.has_value()) << after.error().message;
    EXPECT_EQ(*after->get<int>(0, 0), 3);
    EXPECT_EQ(db.stats().opened, 2u);
    EXPECT_EQ(db.stats().open, 1u);
  });
}

TEST(PgDatabase, TransactionsCommitRollBackAndRollBackWhenDropped) {
  REQUIRE_POSTGRES(postgres);
  auto table = pg_fresh_table(*postgres, "pg_transactions");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto insert = db.prepare("INSERT INTO pg_transactions VALUES ($1, 'x')");
  auto count = [&] { return *db.query("SELECT count(*) FROM pg_transactions")->get<int>(0, 0); };
  runtime.block_on([&] {
    {
      auto t = db.begin();
      ASSERT_TRUE(t.has_value()) << t.error().message;
      ASSERT_TRUE(t->query(insert, {pg::param(1)}).has_value());
      ASSERT_TRUE(t->rollback().has_value());
    }
    EXPECT_EQ(count(), 0);
    {
      auto t = db.begin();
      ASSERT_TRUE(t->query(insert, {pg::param(1)}).has_value());
      ASSERT_TRUE(t->query(insert, {pg::param(2)}).has_value());
      ASSERT_TRUE(t->commit().has_value());
    }
    EXPECT_EQ(count(), 2);
    {
      auto t = db.begin();
      ASSERT_TRUE(t->query(insert, {pg::param(3)}).has_value());
    }  // dropped: rolled back
    EXPECT_EQ(count(), 2);
    {
      auto t = db.begin();
      ASSERT_TRUE(t->query(insert, {pg::param(4)}).has_value());
      EXPECT_EQ(t->query(insert, {pg::param(1)}).error().sqlstate, "23505");
      auto committed = t->commit();
      ASSERT_FALSE(committed.has_value());
      EXPECT_EQ(committed.error().sqlstate, "25P02");
    }
    EXPECT_EQ(count(), 2);
  });
}

TEST(PgDatabase, ATransactionHasItsConnectionToItself) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto t = db.begin();
    ASSERT_TRUE(t.has_value());
    // The only connection is taken: a call outside the transaction waits for it.
    auto waited = db.query("SELECT 1", {}, Deadline::after(200ms));
    ASSERT_FALSE(waited.has_value());
    EXPECT_EQ(waited.error().code, pg::Errc::kTimedOut);
    auto other = spawn([&] { return db.query("SELECT 7", {}, Deadline::after(5s)); });
    ASSERT_TRUE(t->commit().has_value());
    auto r = other.join();
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(*r->get<int>(0, 0), 7);
  });
}

TEST(PgDatabase, IdleConnectionsAreClosed) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto options = pg_options(*postgres, 1);
  options.idle_timeout = 150ms;
  pg::Database db(runtime, options);
  runtime.block_on([&] {
    ASSERT_TRUE(db.query("SELECT 1").has_value());
    EXPECT_EQ(db.stats().open, 1u);
    (void)this_fiber::sleep_for(600ms);
    EXPECT_EQ(db.stats().open, 0u);
    ASSERT_TRUE(db.query("SELECT 1").has_value());
    EXPECT_EQ(db.stats().opened, 2u);
  });
}

TEST(PgDatabase, ClosingFailsTheCallsInFlight) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    auto slow = db.start("SELECT pg_sleep(30)");
    auto started = Clock::now();
    db.close();
    auto r = slow.result(Deadline::after(10s));
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, pg::Errc::kClosed);
    EXPECT_LT(Clock::now() - started, 5s);
    EXPECT_EQ(db.query("SELECT 1").error().code, pg::Errc::kClosed);
  });
}

TEST(PgDatabase, CallsOutsideTheRuntimeAndBadConnectionStringsAreClearErrors) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.start();
  pg::Database db(runtime, pg_options(*postgres, 1));
  EXPECT_EQ(db.query("SELECT 1").error().code, pg::Errc::kNotOnWorker);
  pg::Database nowhere(runtime, pg::Options{.conninfo = "host=127.0.0.1 port=1 dbname=x"});
  pg::Database nonsense(runtime, pg::Options{.conninfo = "this is = not a conninfo"});
  runtime.block_on([&] {
    auto r = nowhere.query("SELECT 1");
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, pg::Errc::kConnectFailed);
    EXPECT_NE(r.error().message.find("127.0.0.1"), std::string::npos) << r.error().message;
    auto n = nonsense.query("SELECT 1");
    ASSERT_FALSE(n.has_value());
    EXPECT_EQ(n.error().code, pg::Errc::kConnectFailed);
  });
}

TEST(PgDatabase, OverTlsLargeResultsOfPipelinedCallsAllArrive) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg::Options{.conninfo = postgres->tls_conninfo(), .connections = 1});
  auto wide = db.prepare("SELECT $1::int4, repeat('x', 40000) || $1::text");
  runtime.block_on([&] {
    auto tls = db.query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()");
    ASSERT_TRUE(tls.has_value()) << tls.error().message;
    EXPECT_EQ(*tls->get<bool>(0, 0), true);
    // Many results of several TLS records each, pipelined, all read. (A record libpq reads
    // only in part stays in OpenSSL's buffer where epoll cannot see it; the driver looks there
    // before parking. PostgreSQL 15 writes records of at most 8 KiB and libpq always reads into
    // 8 KiB or more, so this server never leaves one behind; servers writing 16 KiB records
    // do.)
    std::vector<pg::Query> queries;
    std::vector<pg::Param> p(1);
    for (int i = 0; i < 200; ++i) {
      p[0] = pg::param(i);
      queries.push_back(db.start(wide, p));
    }
    for (int i = 0; i < 200; ++i) {
      auto r = queries[i].result(Deadline::after(20s));
      ASSERT_TRUE(r.has_value()) << i << ": " << r.error().message;
      EXPECT_EQ(*r->get<int>(0, 0), i);
      EXPECT_EQ(r->text(0, 1).size(), 40000 + std::to_string(i).size());
    }
  });
}

TEST(PgDatabase, ParametersLibpqCannotCarryAreRefusedAndTheConnectionServesOn) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    using namespace std::string_view_literals;
    auto nul = db.query("SELECT $1::text", {pg::param("a\0b"sv)});
    ASSERT_FALSE(nul.has_value());
    EXPECT_EQ(nul.error().code, pg::Errc::kBadValue);
    std::vector<pg::Param> many(70000, pg::param(1));
    auto too_many = db.query("SELECT 1", many);
    ASSERT_FALSE(too_many.has_value());
    EXPECT_EQ(too_many.error().code, pg::Errc::kBadValue);
    // Over 1 GiB (PostgreSQL's limit): refused before a byte is read (a mapping never touched).
    constexpr std::size_t kGiB = std::size_t{1} << 30;
    void* huge =
        ::mmap(nullptr, kGiB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(huge, MAP_FAILED);
    std::string_view big(static_cast<const char*>(huge), kGiB);
    for (auto p : {pg::param(big), pg::Param(pg::Bytes{big})}) {
      auto refused = db.query("SELECT $1", {p});
      ASSERT_FALSE(refused.has_value());
      EXPECT_EQ(refused.error().code, pg::Errc::kBadValue);
      EXPECT_EQ(refused.error().message, "a parameter over 1 GiB");
    }
    ::munmap(huge, kGiB);
    // The same bytes go as bytea; and the connection was never touched.
    auto bytes = db.query("SELECT length($1::bytea)", {pg::Param(pg::Bytes{"a\0b"sv})});
    ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
    EXPECT_EQ(*bytes->get<int>(0, 0), 3);
    EXPECT_EQ(db.stats().opened, 1u);
  });
}

TEST(PgDatabase, ALargeStatementIsWrittenWhileItsCallerWaitsOnlyForItsResult) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    // 8 MiB of parameters: more than the socket takes at once, written by the flusher while
    // the server reads; several such calls in flight at the same time.
    std::string big(8 << 20, 'x');
    std::vector<pg::Query> queries;
    std::vector<pg::Param> p{pg::param(std::string_view(big))};
    for (int i = 0; i < 3; ++i) queries.push_back(db.start("SELECT length($1::text)", p));
    for (auto& q : queries) {
      auto r = q.result(Deadline::after(30s));
      ASSERT_TRUE(r.has_value()) << r.error().message;
      EXPECT_EQ(*r->get<int>(0, 0), 8 << 20);
    }
  });
}
