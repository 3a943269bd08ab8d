// COPY through the client (FROM STDIN / TO STDOUT) is not carried by spindle::pg: each such
// statement ends in a clear error (Errc::kUnsupported, not sent), in every spelling, and the
// calls beside it on the same connection and the same worker go on. A COPY with a server-side
// file is a statement like any other. (Issue 69, item 1: a COPY froze the worker for good.)
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "pg_testing.h"
#include "spindle/fiber/runtime.h"

using namespace std::chrono_literals;
using namespace spindle;
using spindle::testing::pg_fresh_table;
using spindle::testing::pg_options;
using spindle::testing::WorkerProbe;

namespace {

// Every spelling of `words` with each gap filled by each separator PostgreSQL's scanner skips,
// and with the words in upper, lower and mixed case.
std::vector<std::string> spellings(const std::vector<std::string>& words) {
  const std::vector<std::string> gaps = {
      " ", "\n", "\t", "  /* c */ ", "/* a /* nested */ b */", " -- line\n", "\r\n"};
  std::vector<std::string> out;
  for (std::size_t g = 0; g < gaps.size(); ++g) {
    for (int casing = 0; casing < 3; ++casing) {
      std::string sql = gaps[(g + 3) % gaps.size()];  // blanks before the first word too
      for (std::size_t i = 0; i < words.size(); ++i) {
        std::string w = words[i];
        for (std::size_t k = 0; k < w.size(); ++k) {
          bool upper = casing == 0 || (casing == 2 && k % 2 == 0);
          w[k] = static_cast<char>(upper ? std::toupper(w[k]) : std::tolower(w[k]));
        }
        sql += (i == 0 ? "" : gaps[(g + i) % gaps.size()]) + w;
      }
      out.push_back(sql);
    }
  }
  return out;
}

}  // namespace

TEST(PgCopy, CopyThroughTheClientIsRefusedInEverySpellingAndNothingIsSent) {
  REQUIRE_POSTGRES(postgres);
  pg_fresh_table(*postgres, "pg_copy_spellings");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    std::vector<std::vector<std::string>> statements = {
        {"copy", "pg_copy_spellings", "from", "stdin"},
        {"copy", "pg_copy_spellings", "from", "stdin", "with", "(format", "csv)"},
        {"copy", "(select", "generate_series(1,", "100000))", "to", "stdout"},
        {"copy", "pg_copy_spellings", "(id,", "note)", "to", "stdout", "(format", "binary)"},
    };
    int refused = 0;
    for (const auto& words : statements) {
      for (const std::string& sql : spellings(words)) {
        auto r = db.query(sql, {}, Deadline::after(5s));
        ASSERT_FALSE(r.has_value()) << sql;
        EXPECT_EQ(r.error().code, pg::Errc::kUnsupported) << sql << ": " << r.error().message;
        EXPECT_TRUE(r.error().not_sent) << sql;
        ++refused;
      }
    }
    EXPECT_EQ(refused, 4 * 7 * 3);
    // A prepared one the same, each time it is called.
    auto prepared = db.prepare("COPY pg_copy_spellings TO STDOUT");
    for (int i = 0; i < 2; ++i) {
      auto r = db.query(prepared, {}, Deadline::after(5s));
      ASSERT_FALSE(r.has_value());
      EXPECT_EQ(r.error().code, pg::Errc::kUnsupported);
    }
    EXPECT_EQ(db.stats().opened, 1u);
  });
}

TEST(PgCopy, StdinOrStdoutInLiteralsNamesOrCommentsIsNoCopyThroughTheClient) {
  REQUIRE_POSTGRES(postgres);
  pg_fresh_table(*postgres, "pg_copy_lookalikes");
  spindle::testing::pg_run(postgres->conninfo(),
                           "DROP TABLE IF EXISTS \"stdin\"; CREATE TABLE \"stdin\" (stdout int)");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  runtime.block_on([&] {
    // Sent, and answered by the server: a file of that name (which does not exist), a table
    // named stdin, the words inside literals and comments.
    for (const char* sql : {
             "COPY pg_copy_lookalikes FROM 'stdin'",
             "COPY pg_copy_lookalikes FROM $$stdin$$",
             "COPY pg_copy_lookalikes FROM $q$ stdin $q$",
             "COPY pg_copy_lookalikes FROM E'\\'stdin' /* stdin */",
             "COPY pg_copy_lookalikes FROM '/nonexistent/stdout' -- stdin",
         }) {
      auto r = db.query(sql, {}, Deadline::after(5s));
      ASSERT_FALSE(r.has_value()) << sql;
      EXPECT_EQ(r.error().code, pg::Errc::kServerError) << sql << ": " << r.error().message;
      EXPECT_EQ(r.error().sqlstate, "58P01") << sql << ": " << r.error().message;  // no file
    }
    for (const char* sql : {"COPY \"stdin\" TO '/dev/null'", "SELECT 'COPY t FROM STDIN'",
                            "/* COPY t TO STDOUT */ SELECT 1"}) {
      auto r = db.query(sql, {}, Deadline::after(5s));
      ASSERT_TRUE(r.has_value()) << sql << ": " << r.error().message;
    }
  });
}

TEST(PgCopy, TheCallsPipelinedBesideACopyAreAnsweredAndTheWorkerKeepsAnswering) {
  REQUIRE_POSTGRES(postgres);
  pg_fresh_table(*postgres, "pg_copy_beside");
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Database db(runtime, pg_options(*postgres, 1));
  auto insert = db.prepare("INSERT INTO pg_copy_beside VALUES ($1, 'x')");
  runtime.block_on([&] {
    WorkerProbe probe;
    for (int round = 0; round < 5; ++round) {
      auto before = db.start("SELECT 'before'");
      auto in = db.start("COPY pg_copy_beside FROM STDIN");
      auto row = db.start(insert, std::vector<pg::Param>{pg::param(round)});
      auto out = db.start("COPY (SELECT generate_series(1, 100000)) TO STDOUT");
      auto after = db.start("SELECT 'after'");
      auto rb = before.result(Deadline::after(5s));
      ASSERT_TRUE(rb.has_value()) << rb.error().message;
      EXPECT_EQ(in.result(Deadline::after(5s)).error().code, pg::Errc::kUnsupported);
      auto rr = row.result(Deadline::after(5s));
      ASSERT_TRUE(rr.has_value()) << rr.error().message;
      EXPECT_EQ(out.result(Deadline::after(5s)).error().code, pg::Errc::kUnsupported);
      auto ra = after.result(Deadline::after(5s));
      ASSERT_TRUE(ra.has_value()) << ra.error().message;
      EXPECT_EQ(*ra->get<std::string>(0, 0), "after");
    }
    auto count = db.query("SELECT count(*) FROM pg_copy_beside", {}, Deadline::after(5s));
    ASSERT_TRUE(count.has_value());
    EXPECT_EQ(*count->get<int>(0, 0), 5);
    EXPECT_EQ(db.stats().opened, 1u);  // the connection was never lost
    (void)this_fiber::sleep_for(50ms);
    EXPECT_GT(probe.wakes(), 0);
    EXPECT_LT(probe.worst_ms(), 100);
  });
}
