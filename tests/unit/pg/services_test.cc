// The test services' own promises, where a broken one would make the tests that use them flaky.

#include "testing/services.h"

#include <gtest/gtest.h>

namespace spindle::testing {
namespace {

TEST(TestServices, FreePortsAreBelowTheKernelsOwnRangeAndBindable) {
  const int low = ephemeral_port_low();
  if (low < 12000) GTEST_SKIP() << "no room below the ephemeral range (" << low << ") here";
  for (int i = 0; i < 50; ++i) {
    int port = free_port();
    // A port inside the range can go to the next outgoing connection before a service binds it.
    EXPECT_GT(port, 1024);
    EXPECT_LT(port, low);
    EXPECT_EQ(bind_loopback(port), port);
  }
}

}  // namespace
}  // namespace spindle::testing
