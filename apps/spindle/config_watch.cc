#include "config_watch.h"

#include <sys/inotify.h>
#include <unistd.h>

namespace spindle::app {

Result<ConfigWatch> ConfigWatch::open(const std::string& file) {
  UniqueFd fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!fd) return fail_errno();
  auto slash = file.rfind('/');
  std::string folder = slash == std::string::npos ? "." : file.substr(0, slash + 1);
  constexpr std::uint32_t kChanges =
      IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB;
  if (::inotify_add_watch(fd.get(), folder.c_str(), kChanges) < 0) return fail_errno();
  return ConfigWatch(std::move(fd));
}

bool ConfigWatch::consume() {
  alignas(inotify_event) char events[4096];
  bool any = false;
  while (::read(fd_.get(), events, sizeof events) > 0) any = true;
  return any;
}

}  // namespace spindle::app
