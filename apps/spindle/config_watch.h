#pragma once
// Watching the configuration file for changes (inotify on its folder), so that an edit, a
// replace-by-rename or a Kubernetes ConfigMap update (a symlink swapped in the folder) reloads.

#include <string>

#include "spindle/base/error.h"
#include "spindle/io/unique_fd.h"

namespace spindle::app {

/// Notices changes in the folder of one file. The caller polls fd(); when it is readable,
/// consume() empties it. Whether the file itself changed is for the caller to decide (by
/// comparing contents): anything in the folder counts, as a ConfigMap swaps a hidden folder.
class ConfigWatch {
 public:
  /// Watches the folder of `file`.
  [[nodiscard]] static Result<ConfigWatch> open(const std::string& file);

  /// A non-blocking inotify descriptor, readable when something changed.
  int fd() const { return fd_.get(); }
  /// Reads every pending event; true if there was any.
  bool consume();

 private:
  explicit ConfigWatch(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace spindle::app
