// Unmodified Debian client libraries, called in their blocking form from fibers of ONE worker
// with the hooks linked: libpq (PQexec), libpqxx, hiredis (redisCommand) and libcurl's easy
// interface. Each runs 100 waits of 100 ms at once; together they must take well under a
// second, while the same worker goes on answering HTTP requests.
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <pqxx/pqxx>
#include <thread>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/server/server.h"
#include "testing/http_testing.h"
#include "testing/services.h"

using namespace std::chrono_literals;
using namespace spindle;

namespace {

using Clock = std::chrono::steady_clock;

// While `busy` runs on the worker of `runtime`, a plain thread asks that worker's HTTP server
// for /ping every 20 ms: the slowest answer it got.
template <typename Busy>
std::chrono::milliseconds slowest_ping_while(Runtime& runtime, Busy&& busy) {
  http::Router router;
  router.get("/ping", [](http::Request&) { return http::Response::text("pong"); });
  auto server = spindle::testing::start_http_server(runtime, std::move(router));
  std::atomic<bool> done{false};
  std::chrono::milliseconds slowest{0};
  std::thread pinger([&] {
    while (!done) {
      auto started = Clock::now();
      std::string got = runtime.block_on([&] {
        return spindle::testing::exchange_raw(
            server->address(), "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
      });
      EXPECT_NE(got.find("pong"), std::string::npos);
      slowest = std::max(
          slowest, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started));
      std::this_thread::sleep_for(20ms);
    }
  });
  busy();
  done = true;
  pinger.join();
  EXPECT_TRUE(server->drain(Deadline::after(2s)));
  return slowest;
}

// Runs `each(i)` for i in [0, n) in fibers of `runtime`'s one worker at once; the time taken.
template <typename Each>
std::chrono::milliseconds all_at_once(Runtime& runtime, int n, Each each) {
  auto started = Clock::now();
  runtime.block_on([&] {
    std::vector<JoinHandle<void>> fibers;
    for (int i = 0; i < n; ++i) fibers.push_back(spawn([&, i] { each(i); }));
    for (auto& f : fibers) f.join();
  });
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
}

}  // namespace

TEST(HookedLibraries, BlockingLibpqQueriesWaitTogetherOnOneWorker) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  constexpr int kFibers = 100;
  std::vector<PGconn*> connections(kFibers, nullptr);
  // Connecting (blocking PQconnectdb: hooked socket, connect and poll) is done first, at once.
  (void)all_at_once(runtime, kFibers, [&](int i) {
    connections[i] = PQconnectdb(postgres->conninfo().c_str());
    EXPECT_EQ(PQstatus(connections[i]), CONNECTION_OK) << PQerrorMessage(connections[i]);
  });
  std::chrono::milliseconds took{0};
  auto slowest = slowest_ping_while(runtime, [&] {
    took = all_at_once(runtime, kFibers, [&](int i) {
      PGresult* r = PQexec(connections[i], "SELECT pg_sleep(0.1), 42");
      EXPECT_EQ(PQresultStatus(r), PGRES_TUPLES_OK) << PQresultErrorMessage(r);
      EXPECT_STREQ(PQgetvalue(r, 0, 1), "42");
      PQclear(r);
    });
  });
  for (PGconn* c : connections) PQfinish(c);
  EXPECT_LT(took, 800ms) << "100 x pg_sleep(0.1) on one worker";
  EXPECT_LT(slowest, 250ms) << "the worker stopped answering HTTP meanwhile";
}

TEST(HookedLibraries, LibpqxxTransactionsWaitTogether) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto took = all_at_once(runtime, 20, [&](int i) {
    pqxx::connection c(postgres->conninfo());
    pqxx::work w(c);
    auto row = w.exec1("SELECT pg_sleep(0.1), " + std::to_string(i));
    EXPECT_EQ(row[1].as<int>(), i);
    w.commit();
  });
  EXPECT_LT(took, 900ms) << "20 x (connect + pg_sleep(0.1)) on one worker";
}

TEST(HookedLibraries, BlockingHiredisCommandsWaitTogether) {
  spindle::testing::TestRedis redis;
  if (!redis.running())
    GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)";
  Runtime runtime(RuntimeOptions{.workers = 1});
  constexpr int kFibers = 100;
  std::vector<redisContext*> contexts(kFibers, nullptr);
  (void)all_at_once(runtime, kFibers, [&](int i) {
    contexts[i] = redisConnect("127.0.0.1", redis.port());
    ASSERT_TRUE(contexts[i] != nullptr && contexts[i]->err == 0);
  });
  std::chrono::milliseconds took{0};
  auto slowest = slowest_ping_while(runtime, [&] {
    took = all_at_once(runtime, kFibers, [&](int i) {
      // Nothing is ever pushed: each BLPOP waits out its 0.1 s timeout.
      auto* reply =
          static_cast<redisReply*>(redisCommand(contexts[i], "BLPOP spindle:empty:%d 0.1", i));
      ASSERT_NE(reply, nullptr);
      EXPECT_EQ(reply->type, REDIS_REPLY_NIL);
      freeReplyObject(reply);
    });
  });
  for (redisContext* c : contexts) redisFree(c);
  EXPECT_LT(took, 800ms) << "100 x BLPOP 0.1 on one worker";
  EXPECT_LT(slowest, 250ms);
}

TEST(HookedLibraries, CurlEasyTransfersWaitTogether) {
  // The slow server runs in a runtime of its own.
  Runtime elsewhere(RuntimeOptions{.workers = 1});
  http::Router router;
  router.get("/slow", [](http::Request&) {
    (void)this_fiber::sleep_for(100ms);
    return http::Response::text("late");
  });
  auto server = spindle::testing::start_http_server(elsewhere, std::move(router));
  std::string url = "http://" + server->address().to_string() + "/slow";
  curl_global_init(CURL_GLOBAL_DEFAULT);
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::chrono::milliseconds took{0};
  auto slowest = slowest_ping_while(runtime, [&] {
    took = all_at_once(runtime, 100, [&](int) {
      CURL* curl = curl_easy_init();
      std::string body;
      curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
      curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
      curl_easy_setopt(
          curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t count, void* out) {
            static_cast<std::string*>(out)->append(data, size * count);
            return size * count;
          });
      EXPECT_EQ(curl_easy_perform(curl), CURLE_OK);
      EXPECT_EQ(body, "late");
      curl_easy_cleanup(curl);
    });
  });
  curl_global_cleanup();
  EXPECT_TRUE(server->drain(Deadline::after(2s)));
  EXPECT_LT(took, 900ms) << "100 x a 100 ms answer on one worker";
  EXPECT_LT(slowest, 250ms);
}
