#include "spindle/server/message.h"

#include <gtest/gtest.h>

#include <string>

#include "testing/http_testing.h"

using namespace spindle::http;
using spindle::testing::PiecewiseSource;

namespace {

RequestHead head_announcing(std::optional<std::uint64_t> length) {
  RequestHead head;
  head.method = "POST";
  head.target = "/";
  head.content_length = length;
  return head;
}

}  // namespace

TEST(Request, BodyMemoryFollowsTheBytesReceivedNotTheAnnouncedLength) {
  // A client announces a terabyte and sends 100 bytes before the source ends.
  RequestHead head = head_announcing(std::uint64_t{1} << 40);
  PiecewiseSource source(std::string(100, 'b'), 30);
  Request request(head, source);
  const std::string& body = request.body();
  EXPECT_EQ(body, std::string(100, 'b'));
  EXPECT_LE(body.capacity(), 2 * Request::kBodyStep);
}

TEST(Request, BodyReadsAnAnnouncedLengthWholeInBoundedSteps) {
  std::string data;
  for (int i = 0; i < 300'000; ++i) data += static_cast<char>('a' + i % 26);
  RequestHead head = head_announcing(data.size());
  PiecewiseSource source(data, 7000);
  Request request(head, source);
  EXPECT_EQ(request.body(), data);
  // read() after body() has nothing more.
  char c;
  EXPECT_EQ(request.read({&c, 1}), 0u);
}

TEST(Request, BodyWithoutALengthReadsToTheEnd) {
  RequestHead head = head_announcing(std::nullopt);
  PiecewiseSource source(std::string(200'000, 'z'), 10'000);
  Request request(head, source);
  char first[10];
  EXPECT_EQ(request.read(first), 10u);
  EXPECT_EQ(request.body().size(), 200'000u - 10);
}
