#pragma once
// A child process for integration tests: started with its stdout on a pipe, stopped by PID.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace spindle::testing {

/// A started child process. The destructor kills it (SIGKILL) if it is still running.
class Subprocess {
 public:
  /// Starts `argv[0]` with `argv`; its stdout is readable through read_line().
  explicit Subprocess(std::vector<std::string> argv) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    out_ = ::fdopen(fds[0], "r");
  }
  ~Subprocess() {
    if (pid_ > 0 && !exit_code_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_) ::fclose(out_);
  }

  /// True if the child started.
  bool started() const { return pid_ > 0; }
  /// The next line of the child's stdout (without the newline), or nullopt at EOF.
  std::optional<std::string> read_line() {
    char line[4096];
    if (!out_ || !::fgets(line, sizeof line, out_)) return std::nullopt;
    std::string s(line);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  /// Sends `signo` (0: none, just wait) and waits up to `timeout` for the exit; returns the
  /// exit code, or -1 if it was killed by a signal or did not exit in time (it is then killed).
  int stop(int signo, std::chrono::seconds timeout) {
    if (signo != 0) ::kill(pid_, signo);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        exit_code_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return *exit_code_;
  }

 private:
  /// The child's PID, or -1.
  pid_t pid_ = -1;
  /// The read end of its stdout.
  FILE* out_ = nullptr;
  /// Its exit code once reaped.
  std::optional<int> exit_code_;
};

}  // namespace spindle::testing
