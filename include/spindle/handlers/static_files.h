#pragma once
/// StaticFiles: serves a directory tree — sendfile, ETag and Last-Modified, conditional
/// requests (304), single byte ranges (206/416), MIME types by extension, index files,
/// precompressed .br/.gz siblings or compression on the fly (cached) — and never anything outside
/// its root: no "..", no encoded slashes, no symlink that leads out (the kernel checks, via openat2
/// RESOLVE_BENEATH). The root is a path, resolved again as nginx's root is (each worker at most
/// once per cache_validity), so a symlink swapped to a new release is followed; only regular
/// files are served, and a FIFO or a device is never waited on.

#include <atomic>
#include <chrono>
#include <expected>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/handlers/compression.h"
#include "spindle/io/unique_fd.h"
#include "spindle/server/message.h"

namespace spindle::http {

/// How a StaticFiles handler behaves.
struct StaticOptions {
  /// The file served for a directory.
  std::string index = "index.html";
  /// Serve FILE.br / FILE.gz instead of FILE when the client accepts that encoding.
  bool precompressed = true;
  /// How long a looked-up file (open descriptor, metadata, and the bytes of a small file) is
  /// reused before it is looked up again; 0 disables the cache. Like nginx's open_file_cache
  /// valid=, it bounds how long a change on disk can go unseen.
  std::chrono::milliseconds cache_validity{1000};
  /// Most cached entries per worker.
  std::size_t cache_entries = 4096;
  /// Files up to this size are cached with their bytes (served without any file syscall).
  std::size_t cache_content_max = 16 * 1024;
  /// Compress text files (by MIME type) of compress_min..compress_max bytes on the fly with
  /// brotli or gzip when the client accepts it and no precompressed sibling exists. Each
  /// worker keeps the results (keyed by path, coding and ETag) up to compress_cache_bytes.
  bool compress = true;
  std::size_t compress_min = kCompressMin;
  std::size_t compress_max = kCompressMax;
  std::size_t compress_cache_bytes = 16 << 20;
};

/// A handler for GET/HEAD requests of files under one root directory.
class StaticFiles {
 public:
  /// A handler for the folder `root` (which must be a directory now). Fails with the open error.
  [[nodiscard]] static Result<StaticFiles> open(const std::string& root,
                                                StaticOptions options = {});

  /// Answers for `path` (the request path, percent-encoded, starting with '/'): 200/206 with
  /// the file, 304, 301 (directory without trailing slash), 400 (malformed path), 403, 404,
  /// 416.
  Response serve(const Request& request, std::string_view path) const;
  /// serve(request, request.path()).
  Response operator()(Request& request) const { return serve(request, request.path()); }

  /// The MIME type for a file name, by extension ("application/octet-stream" if unknown).
  static std::string_view mime_type(std::string_view name);

 private:
  struct Entry;
  struct Cache;

  StaticFiles(std::string root, StaticOptions options);
  /// The root folder as its path names it now (O_PATH): the calling worker's, opened at most
  /// once per cache_validity, or opened now; -1 with `error` set if it cannot be opened.
  int root_now(Cache* cache, Clock::time_point now, UniqueFd& opened, int& error) const;
  /// The file at `relative` (with `suffix`, e.g. ".br"), from the calling worker's cache or
  /// looked up now; errno-style failure in `error`.
  std::shared_ptr<const Entry> lookup(const std::string& relative, std::string_view suffix,
                                      int& error) const;
  /// The calling worker's cache (created on first use), or nullptr if caching is off.
  Cache* worker_cache() const;
  /// `entry` (the file at `relative`) compressed with `coding`, from the worker's cache or
  /// compressed now; nullptr if it does not shrink or cannot be read.
  std::shared_ptr<const std::string> compressed(const std::string& relative, const Entry& entry,
                                                std::string_view coding) const;

  /// A regular file a request names, found (an index file for a folder).
  struct Found {
    std::shared_ptr<const Entry> entry;  ///< the file (or its precompressed sibling)
    std::string relative;                ///< its path below the root
    std::string name;                    ///< the name its MIME type is told by
    std::string etag;                    ///< the tag of the representation served
  };
  /// The file `path` names (percent-decoded, no ".." segment); else the answer instead: 400,
  /// 404, 403, or a 301 to a folder's path with its slash.
  std::expected<Found, Response> find(const Request& request, std::string_view path) const;
  /// The encoding served for the whole file: a precompressed sibling (`found` becomes it), or
  /// the file compressed on the fly (returned), by the request's Accept-Encoding; adds
  /// Content-Encoding and Vary to `response`, and gives `found` the served representation's tag.
  std::shared_ptr<const std::string> encode(const Request& request, Found& found,
                                            std::string_view type, Response& response) const;
  /// True if the request's conditions (If-None-Match, else If-Modified-Since) make it a 304.
  static bool not_modified(const Request& request, const Found& found);

  /// The root directory's path, as configured.
  std::string root_;
  /// Options.
  StaticOptions options_;
  /// One cache per worker, created by that worker on first use (shared by copies).
  std::shared_ptr<std::vector<std::atomic<Cache*>>> caches_;
};

/// Decodes %XX escapes in a path. Fails (nullopt) on a bad escape, an encoded '/' or NUL.
std::optional<std::string> decode_path(std::string_view path);

}  // namespace spindle::http
