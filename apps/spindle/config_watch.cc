#include "config_watch.h"

#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <memory>

namespace spindle::app {
namespace {

constexpr std::uint32_t kChanges =
    IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB;

// (folder, last component) of `path`.
std::pair<std::string, std::string> split(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

}  // namespace

Result<ConfigWatch> ConfigWatch::open(const std::string& file) {
  UniqueFd fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!fd) return fail_errno();
  auto [folder, name] = split(file);
  int wd = ::inotify_add_watch(fd.get(), folder.c_str(), kChanges);
  if (wd < 0) return fail_errno();
  ConfigWatch watch(std::move(fd), file, wd, name);
  watch.follow();
  return watch;
}

void ConfigWatch::follow() {
  std::unique_ptr<char, decltype(&std::free)> real(::realpath(file_.c_str(), nullptr), &std::free);
  int wd = -1;
  std::string name;
  if (real) {
    auto [folder, last] = split(real.get());
    wd = ::inotify_add_watch(fd_.get(), folder.c_str(), kChanges);
    name = last;
  }
  if (target_folder_ >= 0 && target_folder_ != folder_ && target_folder_ != wd) {
    ::inotify_rm_watch(fd_.get(), target_folder_);
  }
  target_folder_ = wd;
  target_name_ = wd >= 0 ? name : std::string();
}

bool ConfigWatch::concerns(int wd, const std::string& name) const {
  return (wd == folder_ && name == name_) || (wd == target_folder_ && name == target_name_);
}

ConfigWatch::Change ConfigWatch::consume() {
  alignas(inotify_event) char events[4096];
  bool complete = false;
  ssize_t n;
  while ((n = ::read(fd_.get(), events, sizeof events)) > 0) {
    for (ssize_t at = 0; at < n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(events + at);
      at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      std::string name = e->len > 0 ? std::string(e->name) : std::string();
      bool ours = concerns(e->wd, name);
      if (e->mask & IN_Q_OVERFLOW) complete = true;  // events lost: the contents decide
      if (ours && (e->mask & IN_MODIFY)) writing_ = true;
      if (ours && (e->mask & IN_CLOSE_WRITE)) {
        writing_ = false;
        complete = true;
      }
      if (ours && (e->mask & IN_ATTRIB)) complete = true;
      // A rename into the folder: the file itself, or the symlink a ConfigMap swaps.
      if (e->mask & IN_MOVED_TO) {
        if (ours) writing_ = false;
        complete = complete || ours || e->wd == folder_;
      }
      if (ours && (e->mask & IN_CREATE)) {
        // A symlink is whole when made; a file created is being written until it is closed.
        struct stat st {};
        bool link = e->wd == folder_ && name == name_ && ::lstat(file_.c_str(), &st) == 0 &&
                    S_ISLNK(st.st_mode);
        writing_ = !link;
        complete = complete || link;
      }
    }
  }
  if (writing_) return Change::kWriting;
  return complete ? Change::kComplete : Change::kNone;
}

}  // namespace spindle::app
