// The test services' own promises, where a broken one would make the tests that use them flaky.

#include "spindle/services.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace spindle::testing {
namespace {

int ephemeral_low() {
  int low = 0, high = 0;
  FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 0;
  std::fclose(f);
  return low;
}

bool bindable(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

TEST(TestServices, FreePortsAreBelowTheKernelsOwnRangeAndBindable) {
  const int low = ephemeral_low();
  if (low < 12000) GTEST_SKIP() << "no room below the ephemeral range (" << low << ") here";
  for (int i = 0; i < 50; ++i) {
    int port = free_port();
    // A port inside the range can go to the next outgoing connection before a service binds it.
    EXPECT_GT(port, 1024);
    EXPECT_LT(port, low);
    EXPECT_TRUE(bindable(port)) << port;
  }
}

}  // namespace
}  // namespace spindle::testing
