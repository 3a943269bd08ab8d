// What a session must be for the client's readings to be right, whatever the server's defaults:
// the settings the decoders rely on are pinned (item 7), and prepared statements that the
// session lost (DEALLOCATE, DISCARD ALL, a pooler) are prepared again (item 8). (Issue 69.)
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "pg_testing.h"
#include "spindle/fiber/runtime.h"

using namespace std::chrono_literals;
using namespace spindle;
using spindle::testing::pg_fresh_role;
using spindle::testing::pg_options;

namespace {

constexpr pg::Timestamp kNoonUtc =
    pg::Timestamp(std::chrono::sys_days(std::chrono::year(2026) / 6 / 1)) + std::chrono::hours(12);

// Reads back what the decoders rely on, on a session of `db`.
void expect_readings_right(pg::Database& db) {
  auto r = db.query(
      "SELECT '2026-06-01 12:00:00+00'::timestamptz, '2026-06-01 12:00'::timestamptz, "
      "'2026-06-01 12:00:00+00'::timestamptz::timestamp, $1::timestamptz, "
      "0.1::float8 + 0.2::float8, '\\x00ff10'::bytea, current_setting('TimeZone'), "
      "current_setting('DateStyle')",
      {pg::Param(kNoonUtc)}, Deadline::after(5s));
  ASSERT_TRUE(r.has_value()) << r.error().message;
  for (int column = 0; column < 4; ++column) {
    auto t = r->get<pg::Timestamp>(0, column);
    ASSERT_TRUE(t.has_value()) << column << ": " << t.error().message;
    EXPECT_EQ(*t, kNoonUtc) << column << ": " << r->text(0, column);
  }
  EXPECT_EQ(*r->get<double>(0, 4), 0.1 + 0.2);  // all the digits, not "0.3"
  auto bytes = r->get<std::vector<std::byte>>(0, 5);
  ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
  EXPECT_EQ(*bytes, (std::vector<std::byte>{std::byte{0}, std::byte{0xff}, std::byte{0x10}}));
  EXPECT_EQ(*r->get<std::string>(0, 6), "UTC");
  EXPECT_EQ(r->get<std::string>(0, 7)->substr(0, 3), "ISO");
}

}  // namespace

TEST(PgSession, ReadingsAreRightWhateverTheServersTimeZoneDateStyleAndOutputs) {
  REQUIRE_POSTGRES(postgres);
  auto role = pg_fresh_role(*postgres, "spindle_session_elsewhere", "SUPERUSER",
                            {"SET timezone = 'America/New_York'", "SET datestyle = 'SQL, DMY'",
                             "SET extra_float_digits = 0", "SET bytea_output = 'escape'"});
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(
      runtime, pg::Options{.conninfo = postgres->conninfo() + " user=" + role, .connections = 1});
  runtime.block_on([&] { expect_readings_right(db); });
}

TEST(PgSession, AConninfosOwnOptionsDoNotUnpinTheSettings) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime,
                  pg::Options{.conninfo = postgres->conninfo() + " options='-c DateStyle=SQL,DMY "
                                                                 "-c TimeZone=America/New_York "
                                                                 "-c application_name=pinned'",
                              .connections = 1});
  runtime.block_on([&] {
    expect_readings_right(db);
    // The conninfo's options still apply where they do not touch the pinned settings.
    auto name = db.query("SELECT current_setting('application_name')", {}, Deadline::after(5s));
    ASSERT_TRUE(name.has_value());
    EXPECT_EQ(*name->get<std::string>(0, 0), "pinned");
  });
}

TEST(PgSession, PreparedStatementsArePreparedAgainAfterTheSessionDropsThem) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto twice = db.prepare("SELECT $1::int * 2");
  auto dropper = db.prepare("DEALLOCATE ALL");
  runtime.block_on([&] {
    auto call = [&](int i) { return db.query(twice, {pg::param(i)}, Deadline::after(5s)); };
    ASSERT_TRUE(call(1).has_value());
    // Through the client, alone or pipelined with the calls after it: those are prepared again.
    for (const char* drop :
         {"DEALLOCATE ALL", "DISCARD ALL", "deallocate prepare all", "/* x */ discard all"}) {
      ASSERT_TRUE(db.query(drop, {}, Deadline::after(5s)).has_value()) << drop;
      auto r = call(2);
      ASSERT_TRUE(r.has_value()) << drop << ": " << r.error().message;
      EXPECT_EQ(*r->get<int>(0, 0), 4);
      auto dropped = db.start(drop);
      std::vector<pg::Query> behind;
      std::vector<pg::Param> p{pg::param(3)};
      for (int i = 0; i < 5; ++i) behind.push_back(db.start(twice, p));
      ASSERT_TRUE(dropped.result(Deadline::after(5s)).has_value());
      for (auto& q : behind) {
        auto rq = q.result(Deadline::after(5s));
        ASSERT_TRUE(rq.has_value()) << drop << " pipelined: " << rq.error().message;
        EXPECT_EQ(*rq->get<int>(0, 0), 6);
      }
    }
    // A prepared statement that drops them, the same.
    ASSERT_TRUE(db.query(dropper, {}, Deadline::after(5s)).has_value());
    ASSERT_TRUE(call(4).has_value());
    // Dropped where the client cannot see it: the next call fails, saying so, and the one
    // after is served.
    ASSERT_TRUE(db.query("DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$", {}, Deadline::after(5s))
                    .has_value());
    auto lost = call(5);
    ASSERT_FALSE(lost.has_value());
    EXPECT_EQ(lost.error().sqlstate, "26000");
    EXPECT_NE(lost.error().message.find("prepared again"), std::string::npos);
    for (int i = 0; i < 3; ++i) {
      auto r = call(6 + i);
      ASSERT_TRUE(r.has_value()) << r.error().message;
      EXPECT_EQ(*r->get<int>(0, 0), 2 * (6 + i));
    }
    EXPECT_EQ(db.stats().opened, 1u);
  });
}
