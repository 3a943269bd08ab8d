// LogOutput and the error log's bounds: whatever the output does (a reader that stops, a
// file renamed under it), a writer never waits, memory stays within the bound, a close ends by
// its deadline, and what was dropped is counted.
#include "spindle/base/log_output.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>

#include "spindle/base/log.h"

using namespace std::chrono_literals;
using spindle::LogOutput;

namespace {

// A pipe whose reading end nobody reads (until the test does).
struct StalledPipe {
  int read_end = -1, write_end = -1;
  StalledPipe() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    read_end = fds[0];
    write_end = fds[1];
  }
  ~StalledPipe() {
    ::close(read_end);
    ::close(write_end);
  }
  // Everything in the pipe now (without waiting).
  std::string drain() const {
    std::string out;
    char buffer[65536];
    ::fcntl(read_end, F_SETFL, O_NONBLOCK);
    ssize_t n;
    while ((n = ::read(read_end, buffer, sizeof buffer)) > 0) out.append(buffer, n);
    return out;
  }
};

// Runs `fn` on a thread of its own; true if it returned within `limit` (else the test fails
// rather than hangs: the thread is left to the process).
template <typename Fn>
bool returns_within(std::chrono::milliseconds limit, Fn fn) {
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  std::thread([done, fn = std::move(fn)]() mutable {
    fn();
    done->set_value();
  }).detach();
  return future.wait_for(limit) == std::future_status::ready;
}

std::string temp_path(const char* what) {
  return (std::filesystem::temp_directory_path() /
          (std::string("spindle-") + what + "-" + std::to_string(::getpid())))
      .string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST(LogOutput, AStalledReaderCostsNoMoreThanTheBoundAndTheRestIsCounted) {
  StalledPipe pipe;
  constexpr std::size_t kBound = 256 * 1024;
  auto output = LogOutput::adopt(pipe.write_end, "test pipe", kBound);
  const std::string line = std::string(15 * 1024, 'x') + "\n";  // a 15 KB line
  std::size_t taken = 0;
  bool returned = returns_within(10s, [&] {
    for (int i = 0; i < 2000; ++i) taken += output->write(line) ? 1 : 0;  // 30 MB in all
  });
  ASSERT_TRUE(returned) << "a writer waited on the stalled pipe";
  EXPECT_LE(output->pending_bytes(), kBound);
  EXPECT_EQ(output->dropped_lines(), 2000 - taken);
  // What the pipe holds (64 KiB) and the bound: not 30 MB.
  EXPECT_LT(taken * line.size(), kBound + 256 * 1024);
  // The reader comes back: what was kept arrives as whole lines.
  std::string got;
  for (int i = 0; i < 100 && got.size() < taken * line.size(); ++i) {
    got += pipe.drain();
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(got.size(), taken * line.size());
  EXPECT_EQ(got.find_first_not_of("x\n"), std::string::npos);
}

TEST(LogOutput, DirectWritesNeverWaitOnAStalledOutput) {
  StalledPipe pipe;
  auto output = LogOutput::adopt(pipe.write_end, "test pipe", 64 * 1024);
  bool returned = returns_within(10s, [&] {
    for (int i = 0; i < 20'000; ++i) {
      (void)output->write("an error line that nobody reads\n", 1, LogOutput::kDirect);
    }
  });
  ASSERT_TRUE(returned) << "a direct write waited on the stalled pipe";
  EXPECT_GT(output->dropped_lines(), 0u);
  // With nothing waiting, a direct write is out before write() returns.
  StalledPipe open;
  auto flowing = LogOutput::adopt(open.write_end, "test pipe", 64 * 1024);
  ASSERT_TRUE(flowing->write("now\n", 1, LogOutput::kDirect));
  EXPECT_EQ(open.drain(), "now\n");
}

TEST(LogOutput, TheSharedDescriptorStaysBlockingForTheOthers) {
  StalledPipe pipe;
  auto output = LogOutput::adopt(pipe.write_end, "test pipe", 64 * 1024);
  (void)output->write("x\n");
  // Our own open file description was made non-blocking, not the one the others share.
  EXPECT_EQ(::fcntl(pipe.write_end, F_GETFL) & O_NONBLOCK, 0);
}

TEST(LogOutput, ACloseEndsByItsDeadlineWhateverTheOutputDoes) {
  StalledPipe pipe;
  auto output = LogOutput::adopt(pipe.write_end, "test pipe", 1 << 20);
  for (int i = 0; i < 100; ++i) (void)output->write(std::string(8192, 'y') + "\n");
  auto started = std::chrono::steady_clock::now();
  output->finish_by(started + 300ms);
  ASSERT_TRUE(returns_within(10s, [&] { output->close(); })) << "close waited on the output";
  EXPECT_GT(output->dropped_lines(), 0u);  // what the pipe did not take is counted
  // Closed: later lines are dropped (and counted), not queued for nobody.
  auto before = output->dropped_lines();
  EXPECT_FALSE(output->write("late\n"));
  EXPECT_EQ(output->dropped_lines(), before + 1);
}

TEST(LogOutput, AQueueThatDrainsInTimeIsWrittenWholeAtClose) {
  std::string path = temp_path("log-close");
  std::filesystem::remove(path);
  {
    auto output = LogOutput::open(path, 1 << 20);
    ASSERT_TRUE(output.has_value());
    for (int i = 0; i < 1000; ++i) (void)(*output)->write(fmt::format("line {}\n", i));
  }
  std::string text = read_file(path);
  EXPECT_TRUE(text.starts_with("line 0\n"));
  EXPECT_TRUE(text.ends_with("line 999\n"));
  std::filesystem::remove(path);
}

TEST(LogOutput, AReopenAfterARenameWritesToTheNewFile) {
  std::string path = temp_path("log-reopen");
  std::string rotated = path + ".1";
  std::filesystem::remove(path);
  std::filesystem::remove(rotated);
  auto opened = LogOutput::open(path, 1 << 20);
  ASSERT_TRUE(opened.has_value());
  auto& output = *opened;
  ASSERT_TRUE(output->write("before\n", 1, LogOutput::kDirect));
  std::filesystem::rename(path, rotated);
  ASSERT_TRUE(output->write("renamed\n", 1, LogOutput::kDirect));  // still the old file
  ASSERT_FALSE(output->reopen());
  ASSERT_TRUE(output->write("after\n", 1, LogOutput::kDirect));
  output->close();
  EXPECT_EQ(read_file(rotated), "before\nrenamed\n");
  EXPECT_EQ(read_file(path), "after\n");
  std::filesystem::remove(path);
  std::filesystem::remove(rotated);
}

TEST(LogOutput, AFailingOutputCountsWhatItLost) {
  StalledPipe pipe;
  auto output = LogOutput::adopt(pipe.write_end, "test pipe", 1 << 20);
  ::close(pipe.read_end);  // the reader is gone: EPIPE (SIGPIPE ignored below)
  pipe.read_end = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::signal(SIGPIPE, SIG_IGN);
  for (int i = 0; i < 10; ++i) (void)output->write("lost\n");
  output->finish_by(std::chrono::steady_clock::now() + 2s);
  output->close();
  EXPECT_EQ(output->dropped_lines(), 10u);
}

TEST(ErrorLog, ATextArgumentIsBoundedAndCannotForgeALine) {
  std::string url = "/" + std::string(10'000, 'a');
  std::string shown = fmt::format("{}", spindle::detail::log_arg(url));
  EXPECT_LE(shown.size(), spindle::kMaxLogText + 32);
  EXPECT_TRUE(
      shown.ends_with(fmt::format("...({} more bytes)", url.size() - spindle::kMaxLogText)));
  EXPECT_EQ(fmt::format("{}", spindle::detail::log_arg("a\nb\x1b[31m")), "a\\x0ab\\x1b[31m");
  const char* none = nullptr;
  EXPECT_EQ(fmt::format("{}", spindle::detail::log_arg(none)), "(null)");
  EXPECT_EQ(fmt::format("{}", spindle::detail::log_arg(42)), "42");  // not text: as it is
}

TEST(ErrorLog, APlaceInTheCodeWritesItsBurstASecondAndCountsTheRest) {
  auto before = spindle::log_lines_suppressed();
  for (int i = 0; i < 100; ++i) spindle::log_debug("not written (below the level)");
  EXPECT_EQ(spindle::log_lines_suppressed(), before);  // a level off costs nothing
  for (int i = 0; i < 100; ++i) spindle::log_info("rate-limited line {}", i);
  EXPECT_EQ(spindle::log_lines_suppressed(), before + 100 - spindle::kLogBurst);
  // Another place has its own count.
  spindle::log_info("another place");
  EXPECT_EQ(spindle::log_lines_suppressed(), before + 100 - spindle::kLogBurst);
}
