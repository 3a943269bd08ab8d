#include "spindle/handlers/static_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <charconv>
#include <ctime>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include "spindle/fiber/worker.h"
#include "spindle/handlers/compression.h"

namespace spindle::http {
namespace {

struct MimeType {
  std::string_view extension;
  std::string_view type;
};

constexpr MimeType kMimeTypes[] = {
    {"html", "text/html; charset=utf-8"},
    {"htm", "text/html; charset=utf-8"},
    {"css", "text/css; charset=utf-8"},
    {"js", "text/javascript; charset=utf-8"},
    {"mjs", "text/javascript; charset=utf-8"},
    {"json", "application/json"},
    {"txt", "text/plain; charset=utf-8"},
    {"md", "text/markdown; charset=utf-8"},
    {"csv", "text/csv; charset=utf-8"},
    {"xml", "application/xml"},
    {"svg", "image/svg+xml"},
    {"png", "image/png"},
    {"jpg", "image/jpeg"},
    {"jpeg", "image/jpeg"},
    {"gif", "image/gif"},
    {"webp", "image/webp"},
    {"avif", "image/avif"},
    {"ico", "image/x-icon"},
    {"woff", "font/woff"},
    {"woff2", "font/woff2"},
    {"ttf", "font/ttf"},
    {"otf", "font/otf"},
    {"pdf", "application/pdf"},
    {"wasm", "application/wasm"},
    {"zip", "application/zip"},
    {"gz", "application/gzip"},
    {"tar", "application/x-tar"},
    {"mp4", "video/mp4"},
    {"webm", "video/webm"},
    {"mp3", "audio/mpeg"},
    {"ogg", "audio/ogg"},
    {"wav", "audio/wav"},
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Opens `relative` under `dir` with the kernel refusing any escape (.., absolute symlinks,
// symlinks leading out of the tree, magic links).
int open_beneath(int dir, const std::string& relative, int flags) {
  open_how how{};
  how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC | O_NOCTTY);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, dir, relative.c_str(), &how, sizeof how));
}

std::string http_date(std::time_t t) {
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char text[40];
  std::strftime(text, sizeof text, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return text;
}

std::optional<std::time_t> parse_http_date(std::string_view text) {
  std::tm tm{};
  std::string copy(text);
  const char* end = ::strptime(copy.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (!end || *end != '\0') return std::nullopt;
  return ::timegm(&tm);
}

std::string etag_of(const struct stat& st, std::string_view variant) {
  auto mtime_ns = static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000u +
                  static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
  return fmt::format("\"{:x}-{:x}{}\"", st.st_size, mtime_ns, variant);
}

// If-None-Match: "*" or a list of entity tags, compared weakly (W/ ignored).
bool none_match_hits(std::string_view header, std::string_view etag) {
  bool hit = false;
  for_each_list_item(header, [&](std::string_view tag) {
    if (tag.starts_with("W/")) tag.remove_prefix(2);
    hit = tag == "*" || tag == etag;
    return !hit;
  });
  return hit;
}

enum class RangeKind { kNone, kSatisfiable, kUnsatisfiable };

// One "bytes=first-last", "bytes=first-" or "bytes=-suffix" range. Several ranges, or a unit
// other than bytes, are ignored (a full 200 is always a valid answer).
RangeKind parse_range(std::string_view header, std::uint64_t size, std::uint64_t& first,
                      std::uint64_t& last) {
  if (!header.starts_with("bytes=")) return RangeKind::kNone;
  std::string_view spec = trim_ows(header.substr(6));
  if (spec.find(',') != std::string_view::npos) return RangeKind::kNone;
  std::size_t dash = spec.find('-');
  if (dash == std::string_view::npos) return RangeKind::kNone;
  auto number = [](std::string_view s, std::uint64_t& out) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return !s.empty() && ec == std::errc() && end == s.data() + s.size();
  };
  std::string_view a = spec.substr(0, dash), b = spec.substr(dash + 1);
  if (a.empty()) {
    std::uint64_t suffix;
    if (!number(b, suffix)) return RangeKind::kNone;
    if (suffix == 0 || size == 0) return RangeKind::kUnsatisfiable;
    first = suffix >= size ? 0 : size - suffix;
    last = size - 1;
    return RangeKind::kSatisfiable;
  }
  if (!number(a, first)) return RangeKind::kNone;
  if (b.empty()) {
    last = size - 1;
  } else if (!number(b, last) || last < first) {
    return RangeKind::kNone;
  }
  if (first >= size) return RangeKind::kUnsatisfiable;
  if (last >= size) last = size - 1;
  return RangeKind::kSatisfiable;
}

Response status_for_errno(int err) {
  switch (err) {
    case EACCES:
    case EPERM:
      return Response::error(403);
    case ENAMETOOLONG:
      return Response::error(414);
    default:
      return Response::error(404);  // ENOENT, ENOTDIR, EXDEV (an escape), ELOOP, ...
  }
}

}  // namespace

std::optional<std::string> decode_path(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  for (std::size_t i = 0; i < path.size(); ++i) {
    char c = path[i];
    if (c == '%') {
      if (i + 2 >= path.size()) return std::nullopt;
      int hi = hex_digit(path[i + 1]), lo = hex_digit(path[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      c = static_cast<char>(hi * 16 + lo);
      if (c == '/' || c == '\0' || c == '\\') return std::nullopt;
      i += 2;
    } else if (c == '\0') {
      return std::nullopt;
    }
    out += c;
  }
  return out;
}

struct StaticFiles::Entry {
  /// errno of the lookup, 0 if the file is there.
  int error = 0;
  std::shared_ptr<const UniqueFd> fd;
  struct stat st {};
  std::string etag;
  std::string last_modified;
  /// The file's bytes, for small regular files.
  std::optional<std::string> content;
  /// When it was looked up.
  Clock::time_point checked;
};

struct StaticFiles::Cache {
  std::unordered_map<std::string, std::shared_ptr<const Entry>> entries;
  /// Files compressed on the fly, by path, coding and ETag; their total size.
  std::unordered_map<std::string, std::shared_ptr<const std::string>> compressed;
  std::size_t compressed_bytes = 0;
  /// The root folder as its path named it when opened, and when that was.
  UniqueFd root;
  Clock::time_point root_opened;
};

namespace {
constexpr std::size_t kMaxWorkers = 1024;
}  // namespace

StaticFiles::StaticFiles(std::string root, StaticOptions options)
    : root_(std::move(root)),
      options_(std::move(options)),
      caches_(std::shared_ptr<std::vector<std::atomic<Cache*>>>(
          new std::vector<std::atomic<Cache*>>(kMaxWorkers), [](auto* caches) {
            for (auto& c : *caches) delete c.load();
            delete caches;
          })) {}

StaticFiles::Cache* StaticFiles::worker_cache() const {
  Worker* worker = Worker::current();
  if (!worker || options_.cache_validity.count() <= 0 || worker->index() >= kMaxWorkers) {
    return nullptr;
  }
  auto& slot = (*caches_)[worker->index()];
  Cache* cache = slot.load(std::memory_order_acquire);
  if (!cache) {
    cache = new Cache();
    slot.store(cache, std::memory_order_release);  // only this worker writes its slot
  }
  return cache;
}

std::shared_ptr<const std::string> StaticFiles::compressed(const std::string& relative,
                                                           const Entry& entry,
                                                           std::string_view coding) const {
  Cache* cache = worker_cache();
  std::string key = relative;
  key += '\0';
  key += coding;
  key += entry.etag;
  if (cache) {
    auto it = cache->compressed.find(key);
    if (it != cache->compressed.end()) return it->second;
  }
  std::string plain;
  if (entry.content) {
    plain = *entry.content;
  } else {
    plain.resize(static_cast<std::size_t>(entry.st.st_size));
    if (::pread(entry.fd->get(), plain.data(), plain.size(), 0) !=
        static_cast<ssize_t>(plain.size())) {
      return nullptr;
    }
  }
  auto packed = coding == "br" ? brotli_compress(plain) : gzip_compress(plain);
  // Cache a file that does not shrink too (as an empty result), so it is not tried again.
  auto result = std::make_shared<const std::string>(
      packed && packed->size() < plain.size() ? std::move(*packed) : std::string());
  if (cache) {
    if (cache->compressed_bytes + result->size() > options_.compress_cache_bytes) {
      cache->compressed.clear();
      cache->compressed_bytes = 0;
    }
    cache->compressed_bytes += result->size() + key.size();
    cache->compressed[key] = result;
  }
  return result->empty() ? nullptr : result;
}

std::shared_ptr<const StaticFiles::Entry> StaticFiles::lookup(const std::string& relative,
                                                              std::string_view suffix,
                                                              int& error) const {
  auto now = Clock::now();
  Cache* cache = worker_cache();
  std::string key = suffix.empty() ? relative : relative + std::string(suffix);
  if (cache) {
    auto it = cache->entries.find(key);
    if (it != cache->entries.end() && now - it->second->checked < options_.cache_validity) {
      error = it->second->error;
      return it->second->error ? nullptr : it->second;
    }
  }
  auto entry = std::make_shared<Entry>();
  entry->checked = now;
  UniqueFd opened_root;
  int root = root_now(cache, now, opened_root, entry->error);
  // Non-blocking: opening a FIFO without a writer (or a device) would wait; reads of a regular
  // file ignore the flag.
  UniqueFd fd(root < 0 ? -1 : open_beneath(root, key, O_RDONLY | O_NONBLOCK));
  if (root < 0) {
  } else if (!fd || ::fstat(fd.get(), &entry->st) != 0) {
    entry->error = errno ? errno : EIO;
  } else if (!S_ISREG(entry->st.st_mode) && !S_ISDIR(entry->st.st_mode)) {
    entry->error = ENOENT;  // a FIFO, socket or device is not a file to serve
  } else {
    std::string_view variant = suffix == ".br" ? "-br" : suffix == ".gz" ? "-gzip" : "";
    entry->etag = etag_of(entry->st, variant);
    entry->last_modified = http_date(entry->st.st_mtim.tv_sec);
    auto size = static_cast<std::size_t>(entry->st.st_size);
    if (S_ISREG(entry->st.st_mode) && cache && size <= options_.cache_content_max) {
      std::string bytes(size, '\0');
      if (::pread(fd.get(), bytes.data(), size, 0) == static_cast<ssize_t>(size)) {
        entry->content = std::move(bytes);
      }
    }
    entry->fd = std::make_shared<const UniqueFd>(std::move(fd));
  }
  if (cache) {
    if (cache->entries.size() >= options_.cache_entries) cache->entries.clear();
    cache->entries[key] = entry;
  }
  error = entry->error;
  return entry->error ? nullptr : entry;
}

int StaticFiles::root_now(Cache* cache, Clock::time_point now, UniqueFd& opened, int& error) const {
  if (cache && cache->root && now - cache->root_opened < options_.cache_validity) {
    return cache->root.get();
  }
  opened = UniqueFd(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!opened) {
    error = errno ? errno : EIO;
    return -1;
  }
  if (!cache) return opened.get();
  cache->root = std::move(opened);
  cache->root_opened = now;
  return cache->root.get();
}

Result<StaticFiles> StaticFiles::open(const std::string& root, StaticOptions options) {
  UniqueFd fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return fail_errno();
  // Absolute, so that it names the same folder whatever the working directory becomes.
  std::error_code ignored;
  auto absolute = std::filesystem::absolute(root, ignored);
  return StaticFiles(absolute.empty() ? root : absolute.string(), std::move(options));
}

std::string_view StaticFiles::mime_type(std::string_view name) {
  std::size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || name.find('/', dot) != std::string_view::npos) {
    return "application/octet-stream";
  }
  std::string_view extension = name.substr(dot + 1);
  for (const auto& m : kMimeTypes) {
    if (iequals(m.extension, extension)) return m.type;
  }
  return "application/octet-stream";
}

namespace {

// True if the decoded path has a ".." segment, even one that would stay inside the root.
bool has_dot_dot(std::string_view segments) {
  while (!segments.empty()) {
    std::size_t slash = segments.find('/', 1);
    std::string_view segment =
        segments.substr(1, slash == std::string_view::npos ? slash : slash - 1);
    if (segment == "..") return true;
    if (slash == std::string_view::npos) break;
    segments.remove_prefix(slash);
  }
  return false;
}

}  // namespace

std::expected<StaticFiles::Found, Response> StaticFiles::find(const Request& request,
                                                              std::string_view path) const {
  auto decoded = decode_path(path);
  if (!decoded || decoded->empty() || decoded->front() != '/' || has_dot_dot(*decoded)) {
    return std::unexpected(Response::error(400));
  }
  Found found;
  found.relative = decoded->size() == 1 ? "." : decoded->substr(1);
  int error = 0;
  found.entry = lookup(found.relative, "", error);
  if (!found.entry) return std::unexpected(status_for_errno(error));
  found.name = *decoded;
  if (S_ISDIR(found.entry->st.st_mode)) {
    if (!path.ends_with('/')) {
      Response moved(301);
      std::string location = std::string(path) + "/";
      if (!request.query().empty()) location += "?" + std::string(request.query());
      moved.headers.add(std::string_view("Location"), location);
      return std::unexpected(std::move(moved));
    }
    found.relative = (found.relative == "." ? "" : found.relative + "/") + options_.index;
    found.entry = lookup(found.relative, "", error);
    // No listings.
    if (!found.entry) return std::unexpected(status_for_errno(error == ENOENT ? EACCES : error));
    found.name = found.relative;
  }
  if (!S_ISREG(found.entry->st.st_mode)) return std::unexpected(Response::error(404));
  return found;
}

std::shared_ptr<const std::string> StaticFiles::encode(const Request& request, Found& found,
                                                       std::string_view type,
                                                       Response& response) const {
  std::string_view accept = request.header(token::kAcceptEncoding);
  std::shared_ptr<const std::string> packed;
  bool varies = false;
  for (auto [coding, suffix] : {std::pair{"br", ".br"}, std::pair{"gzip", ".gz"}}) {
    if (!options_.precompressed) break;
    varies = true;
    if (!accepts_encoding(accept, coding)) continue;
    int sibling_error = 0;
    auto sibling = lookup(found.relative, suffix, sibling_error);
    if (sibling && S_ISREG(sibling->st.st_mode)) {
      found.entry = std::move(sibling);
      found.etag = found.entry->etag;
      response.headers.add_view("Content-Encoding", token::kContentEncoding, coding);
      break;
    }
  }
  auto size = static_cast<std::size_t>(found.entry->st.st_size);
  if (options_.compress && !response.headers.contains(token::kContentEncoding) &&
      compressible_type(type) && size >= options_.compress_min && size <= options_.compress_max) {
    varies = true;
    std::string_view coding = accepts_encoding(accept, "br")     ? "br"
                              : accepts_encoding(accept, "gzip") ? "gzip"
                                                                 : "";
    if (!coding.empty() && (packed = compressed(found.relative, *found.entry, coding))) {
      response.headers.add_view("Content-Encoding", token::kContentEncoding, coding);
      // Its own tag: a compressed body is another representation than the file.
      const std::string& tag = found.entry->etag;
      found.etag = tag.substr(0, tag.size() - 1) + "-z" + std::string(coding) + '"';
    }
  }
  if (varies) response.headers.add_view("Vary", token::kVary, "Accept-Encoding");
  return packed;
}

bool StaticFiles::not_modified(const Request& request, const Found& found) {
  // RFC 9110 13.2.2: If-None-Match wins over If-Modified-Since.
  if (auto inm = request.headers().get(token::kIfNoneMatch)) {
    return none_match_hits(*inm, found.etag);
  }
  if (auto ims = request.headers().get(token::kIfModifiedSince)) {
    auto since = parse_http_date(*ims);
    return since && found.entry->st.st_mtim.tv_sec <= *since;
  }
  return false;
}

Response StaticFiles::serve(const Request& request, std::string_view path) const {
  auto found = find(request, path);
  if (!found) return std::move(found.error());
  found->etag = found->entry->etag;
  Response response(200);
  std::string_view range_header = request.header(token::kRange);
  std::string_view type = mime_type(found->name);
  // Another encoding only for the whole file: a range addresses the file as it is.
  std::shared_ptr<const std::string> packed;  // the file compressed on the fly, if it is
  if (range_header.empty()) packed = encode(request, *found, type, response);
  const Entry& entry = *found->entry;
  response.headers.add_view("Content-Type", token::kContentType, type);
  response.headers.add_with_static_name("ETag", http::token::kEtag, found->etag);
  response.headers.add_with_static_name("Last-Modified", http::token::kLastModified,
                                        entry.last_modified);
  response.headers.add_view("Accept-Ranges", token::kAcceptRanges, "bytes");
  if (not_modified(request, *found)) {
    response.status = 304;
    return response;
  }

  auto size = static_cast<std::uint64_t>(entry.st.st_size);
  std::uint64_t first = 0, last = size == 0 ? 0 : size - 1;
  RangeKind range = RangeKind::kNone;
  if (!range_header.empty()) {
    auto if_range = request.headers().get(token::kIfRange);
    if (!if_range || *if_range == entry.etag || *if_range == entry.last_modified) {
      range = parse_range(range_header, size, first, last);
    }
  }
  if (range == RangeKind::kUnsatisfiable) {
    Response unsatisfiable = Response::error(416);
    unsatisfiable.headers.add(std::string_view("Content-Range"), fmt::format("bytes */{}", size));
    return unsatisfiable;
  }
  std::uint64_t length = size;
  if (range == RangeKind::kSatisfiable) {
    response.status = 206;
    length = last - first + 1;
    response.headers.add(std::string_view("Content-Range"),
                         fmt::format("bytes {}-{}/{}", first, last, size));
  } else {
    first = 0;
  }
  if (packed) {
    response.body = *packed;
  } else if (entry.content) {
    response.body = entry.content->substr(first, length);  // cached: no file syscall at all
  } else {
    response.file = FileBody{entry.fd, first, length};
  }
  return response;
}

}  // namespace spindle::http
