#pragma once
// Watching the configuration file for changes (inotify on its folder, and on the folder of the
// file it is a symlink to), so that an edit, a replace-by-rename or a Kubernetes ConfigMap
// update (a symlink swapped in the folder) reloads — once the new file is complete.

#include <string>

#include "spindle/base/error.h"
#include "spindle/io/unique_fd.h"

namespace spindle::app {

/// Notices changes of one file. The caller polls fd(); when it is readable, consume() reads
/// the events and says whether the file may now hold a complete new version. A file is being
/// written while it was modified in place (or created) and not closed since: no version of it
/// is complete until its writer closes it, however long the writer pauses. A rename into the
/// folder, a symlink made in the file's place, or a change of its attributes count (whether
/// the contents changed is for the caller to decide, by comparing them: a ConfigMap renames a
/// symlink to a hidden folder over another).
class ConfigWatch {
 public:
  /// What the events read say.
  enum class Change {
    kNone,      ///< nothing that concerns the file
    kWriting,   ///< a writer has the file open, modified: wait for it to close it
    kComplete,  ///< the file may hold a complete new version
  };

  /// Watches `file`'s folder (and its target's, if it is a symlink).
  [[nodiscard]] static Result<ConfigWatch> open(const std::string& file);

  /// A non-blocking inotify descriptor, readable when something changed.
  int fd() const { return fd_.get(); }
  /// Reads every pending event: kWriting while a writer has the file, else kComplete if
  /// anything since the last call may have completed a new version, else kNone.
  Change consume();
  /// Watches the folder of the file the path leads to now (after a rename or a symlink swap,
  /// another one); the previous target's folder is no longer watched.
  void follow();

 private:
  ConfigWatch(UniqueFd fd, std::string file, int folder, std::string name)
      : fd_(std::move(fd)), file_(std::move(file)), folder_(folder), name_(std::move(name)) {}
  /// True if event (`wd`, `name`) is about the file: its path's name, or its target's.
  bool concerns(int wd, const std::string& name) const;

  UniqueFd fd_;              ///< the inotify instance
  std::string file_;         ///< the path as configured
  int folder_;               ///< the watch on the path's folder
  std::string name_;         ///< the path's last component
  int target_folder_ = -1;   ///< the watch on the target's folder (if a symlink leads away)
  std::string target_name_;  ///< the target's last component
  bool writing_ = false;     ///< modified in place or created, and not closed since
};

}  // namespace spindle::app
