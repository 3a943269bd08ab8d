#include "spindle/handlers/static_files.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "spindle/fiber/this_fiber.h"
#include "spindle/h1/parser.h"
#include "testing/decompress.h"
#include "testing/testing.h"

namespace fs = std::filesystem;
using namespace spindle::http;

namespace {

class StaticFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("spindle-static-" + std::to_string(::getpid()));
    fs::remove_all(base_);
    root_ = base_ / "www";
    fs::create_directories(root_ / "sub");
    write(root_ / "hello.txt", "hello, static world\n");
    write(root_ / "index.html", "<h1>index</h1>");
    write(root_ / "sub" / "page.html", "<p>sub</p>");
    write(root_ / "app.js", "console.log('plain')");
    write(root_ / "app.js.br", "BROTLI");
    write(root_ / "app.js.gz", "GZIP");
    std::string css;
    for (int i = 0; i < 300; ++i) css += ".rule-" + std::to_string(i) + " { color: #123456; }\n";
    write(root_ / "site.css", css);
    write(root_ / "photo.png", std::string(4096, 'p'));
    write(base_ / "secret.txt", "outside the root");
    fs::create_symlink(base_ / "secret.txt", root_ / "leak.txt");
    fs::create_symlink("../secret.txt", root_ / "leak_relative.txt");
    fs::create_symlink("hello.txt", root_ / "alias.txt");  // inside: allowed
    auto files = StaticFiles::open(root_.string());
    ASSERT_TRUE(files.has_value());
    files_.emplace(std::move(*files));
  }
  void TearDown() override { fs::remove_all(base_); }

  static void write(const fs::path& p, std::string_view text) { std::ofstream(p) << text; }

  // Runs one request (a full head) through the handler.
  Response request(std::string_view path, std::string extra_headers = "") {
    text_ = "GET " + std::string(path) + " HTTP/1.1\r\nHost: x\r\n" + extra_headers + "\r\n";
    RequestParser parser;
    auto r = parser.parse(text_, head_);
    EXPECT_EQ(r.state, ParseResult::State::kComplete) << r.reason;
    Request req(head_, "");
    return files_->serve(req, req.path());
  }

  static std::string body_of(Response& r) {
    if (!r.file) return r.body;
    std::string out(r.file->length, '\0');
    EXPECT_EQ(
        ::pread(r.file->fd->get(), out.data(), out.size(), static_cast<off_t>(r.file->offset)),
        static_cast<ssize_t>(out.size()));
    return out;
  }

  std::string body_of_request(std::string_view path) {
    auto r = request(path);
    EXPECT_EQ(r.status, 200) << path;
    return body_of(r);
  }

  fs::path base_, root_;
  std::optional<StaticFiles> files_;
  std::string text_;
  RequestHead head_;
};

}  // namespace

TEST_F(StaticFilesTest, ServesAFileWithTypeEtagAndLastModified) {
  auto r = request("/hello.txt");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(body_of(r), "hello, static world\n");
  EXPECT_EQ(r.headers.get("content-type"), "text/plain; charset=utf-8");
  EXPECT_TRUE(r.headers.get("etag").value_or("").starts_with("\""));
  EXPECT_TRUE(r.headers.get("last-modified").value_or("").ends_with("GMT"));
  EXPECT_EQ(r.headers.get("accept-ranges"), "bytes");
}

TEST_F(StaticFilesTest, ServesIndexFilesAndRedirectsDirectoriesWithoutASlash) {
  auto index = request("/");
  EXPECT_EQ(index.status, 200);
  EXPECT_EQ(body_of(index), "<h1>index</h1>");
  auto redirect = request("/sub?x=1");
  EXPECT_EQ(redirect.status, 301);
  EXPECT_EQ(redirect.headers.get("location"), "/sub/?x=1");
  EXPECT_EQ(request("/sub/").status, 403);  // no index.html there, and no listings
  EXPECT_EQ(request("/sub/page.html").status, 200);
}

TEST_F(StaticFilesTest, AnswersNotModifiedForMatchingValidators) {
  auto first = request("/hello.txt");
  std::string etag(first.headers.get("etag").value());
  std::string modified(first.headers.get("last-modified").value());
  EXPECT_EQ(request("/hello.txt", "If-None-Match: " + etag + "\r\n").status, 304);
  EXPECT_EQ(request("/hello.txt", "If-None-Match: \"other\", W/" + etag + "\r\n").status, 304);
  EXPECT_EQ(request("/hello.txt", "If-None-Match: *\r\n").status, 304);
  EXPECT_EQ(request("/hello.txt", "If-None-Match: \"other\"\r\n").status, 200);
  EXPECT_EQ(request("/hello.txt", "If-Modified-Since: " + modified + "\r\n").status, 304);
  EXPECT_EQ(request("/hello.txt", "If-Modified-Since: Mon, 01 Jan 1990 00:00:00 GMT\r\n").status,
            200);
  // If-None-Match wins over If-Modified-Since.
  EXPECT_EQ(
      request("/hello.txt", "If-None-Match: \"other\"\r\nIf-Modified-Since: " + modified + "\r\n")
          .status,
      200);
}

TEST_F(StaticFilesTest, ServesByteRanges) {
  auto r = request("/hello.txt", "Range: bytes=7-12\r\n");
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(body_of(r), "static");
  EXPECT_EQ(r.headers.get("content-range"), "bytes 7-12/20");
  auto suffix = request("/hello.txt", "Range: bytes=-6\r\n");
  EXPECT_EQ(body_of(suffix), "world\n");
  auto open_end = request("/hello.txt", "Range: bytes=14-\r\n");
  EXPECT_EQ(body_of(open_end), "world\n");
  auto clipped = request("/hello.txt", "Range: bytes=14-999\r\n");
  EXPECT_EQ(clipped.headers.get("content-range"), "bytes 14-19/20");
  auto unsatisfiable = request("/hello.txt", "Range: bytes=20-\r\n");
  EXPECT_EQ(unsatisfiable.status, 416);
  EXPECT_EQ(unsatisfiable.headers.get("content-range"), "bytes */20");
  EXPECT_EQ(request("/hello.txt", "Range: bytes=1-2,4-5\r\n").status, 200);  // several: full
  EXPECT_EQ(request("/hello.txt", "Range: lines=1-2\r\n").status, 200);
  EXPECT_EQ(request("/hello.txt", "Range: bytes=1-2\r\nIf-Range: \"stale\"\r\n").status, 200);
}

TEST_F(StaticFilesTest, PrefersPrecompressedSiblingsTheClientAccepts) {
  auto br = request("/app.js", "Accept-Encoding: gzip, br\r\n");
  EXPECT_EQ(body_of(br), "BROTLI");
  EXPECT_EQ(br.headers.get("content-encoding"), "br");
  EXPECT_EQ(br.headers.get("content-type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(br.headers.get("vary"), "Accept-Encoding");
  auto gz = request("/app.js", "Accept-Encoding: gzip, br;q=0\r\n");
  EXPECT_EQ(body_of(gz), "GZIP");
  auto plain = request("/app.js");
  EXPECT_EQ(body_of(plain), "console.log('plain')");
  EXPECT_FALSE(plain.headers.contains("content-encoding"));
  EXPECT_NE(br.headers.get("etag"), plain.headers.get("etag"));
}

TEST_F(StaticFilesTest, NeverLeavesTheRoot) {
  for (const char* path : {"/../secret.txt", "/sub/../../secret.txt", "/%2e%2e/secret.txt",
                           "/sub/%2E%2E/%2e%2e/secret.txt", "/..%2fsecret.txt", "/%2fetc/passwd",
                           "/hello.txt%00.html", "/bad%zz"}) {
    auto r = request(path);
    EXPECT_TRUE(r.status == 400 || r.status == 403 || r.status == 404) << path << " " << r.status;
    EXPECT_FALSE(r.file.has_value()) << path;
  }
  EXPECT_EQ(request("/leak.txt").status, 404);           // absolute symlink out
  EXPECT_EQ(request("/leak_relative.txt").status, 404);  // relative symlink out
  auto alias = request("/alias.txt");                    // symlink that stays inside
  EXPECT_EQ(alias.status, 200);
  EXPECT_EQ(body_of(alias), "hello, static world\n");
}

TEST_F(StaticFilesTest, RefusesADotDotSegmentEvenOneThatStaysInside) {
  // The handler may be called with a path no normalisation saw (a handler of one's own): a
  // ".." is refused, not resolved, whether or not it would leave the root.
  for (const char* path : {"/sub/../hello.txt", "/sub/%2e%2e/hello.txt", "/sub/.."}) {
    EXPECT_EQ(request(path).status, 400) << path;
  }
  EXPECT_EQ(request("/sub/..hello").status, 404);  // a name that starts with dots is a name
}

TEST_F(StaticFilesTest, MissingFilesAre404) {
  EXPECT_EQ(request("/nope.txt").status, 404);
  EXPECT_EQ(request("/hello.txt/more").status, 404);
}

TEST(StaticFiles, MimeTypesByExtension) {
  EXPECT_EQ(StaticFiles::mime_type("a/b/page.HTML"), "text/html; charset=utf-8");
  EXPECT_EQ(StaticFiles::mime_type("x.png"), "image/png");
  EXPECT_EQ(StaticFiles::mime_type("README"), "application/octet-stream");
  EXPECT_EQ(StaticFiles::mime_type("dir.d/file"), "application/octet-stream");
}

TEST(StaticFiles, DecodePathRejectsEncodedSlashesAndNul) {
  EXPECT_EQ(decode_path("/a%20b"), "/a b");
  EXPECT_FALSE(decode_path("/a%2fb").has_value());
  EXPECT_FALSE(decode_path("/a%00").has_value());
  EXPECT_FALSE(decode_path("/a%5cb").has_value());
  EXPECT_FALSE(decode_path("/a%2").has_value());
  EXPECT_FALSE(decode_path("/a%g0").has_value());
}

TEST(StaticFiles, OpenFailsForAMissingRoot) {
  EXPECT_FALSE(StaticFiles::open("/nonexistent/spindle/root").has_value());
}

TEST_F(StaticFilesTest, WorkersCacheFilesAndSeeChangesAfterTheValidity) {
  auto cached = StaticFiles::open(root_.string(),
                                  StaticOptions{.cache_validity = std::chrono::milliseconds(200)});
  ASSERT_TRUE(cached.has_value());
  spindle::testing::run_in_fiber(
      [&] {
        files_.emplace(std::move(*cached));
        auto first = request("/hello.txt");
        EXPECT_FALSE(first.file.has_value());  // small and cached: served from memory
        EXPECT_EQ(first.body, "hello, static world\n");
        write(root_ / "hello.txt", "changed on disk\n");
        EXPECT_EQ(request("/hello.txt").body, "hello, static world\n");  // within the validity
        (void)spindle::this_fiber::sleep_for(std::chrono::milliseconds(300));
        EXPECT_EQ(request("/hello.txt").body, "changed on disk\n");
        fs::remove(root_ / "hello.txt");
        (void)spindle::this_fiber::sleep_for(std::chrono::milliseconds(300));
        EXPECT_EQ(request("/hello.txt").status, 404);
        auto range = request("/index.html", "Range: bytes=1-2\r\n");
        EXPECT_EQ(range.status, 206);
        EXPECT_EQ(range.body, "h1");
      },
      1);
}

TEST_F(StaticFilesTest, CompressesTextFilesOnTheFlyWithTheirOwnEtag) {
  spindle::testing::run_in_fiber(
      [&] {
        std::string css = request("/site.css").body;
        std::string identity_tag(request("/site.css").headers.get("etag").value_or(""));
        ASSERT_GT(css.size(), 1024u);

        auto gz = request("/site.css", "Accept-Encoding: gzip\r\n");
        EXPECT_EQ(gz.status, 200);
        EXPECT_EQ(gz.headers.get("content-encoding").value_or(""), "gzip");
        EXPECT_EQ(gz.headers.get("vary").value_or(""), "Accept-Encoding");
        EXPECT_EQ(spindle::testing::gunzip(gz.body), css);
        EXPECT_LT(gz.body.size(), css.size() / 4);
        std::string gz_tag(gz.headers.get("etag").value_or(""));
        EXPECT_NE(gz_tag, identity_tag);

        auto br = request("/site.css", "Accept-Encoding: gzip, br\r\n");
        EXPECT_EQ(br.headers.get("content-encoding").value_or(""), "br");
        EXPECT_EQ(spindle::testing::unbrotli(br.body), css);
        EXPECT_NE(br.headers.get("etag").value_or(""), gz_tag);

        // Its tag validates it; the identity tag does not match the compressed representation.
        EXPECT_EQ(request("/site.css", "Accept-Encoding: gzip\r\nIf-None-Match: " + gz_tag + "\r\n")
                      .status,
                  304);
        EXPECT_EQ(
            request("/site.css", "Accept-Encoding: gzip\r\nIf-None-Match: " + identity_tag + "\r\n")
                .status,
            200);
        // A range addresses the file as it is; binary types and small files stay as they are.
        auto range = request("/site.css", "Accept-Encoding: gzip\r\nRange: bytes=0-4\r\n");
        EXPECT_EQ(range.status, 206);
        EXPECT_FALSE(range.headers.contains("content-encoding"));
        EXPECT_FALSE(request("/photo.png", "Accept-Encoding: gzip\r\n")
                         .headers.contains("content-encoding"));
        EXPECT_FALSE(request("/hello.txt", "Accept-Encoding: gzip\r\n")
                         .headers.contains("content-encoding"));
        EXPECT_FALSE(request("/site.css", "Accept-Encoding: identity\r\n")
                         .headers.contains("content-encoding"));
      },
      1);
}

TEST_F(StaticFilesTest, OnTheFlyCompressionSeesTheFileChange) {
  auto fresh = StaticFiles::open(root_.string(),
                                 StaticOptions{.cache_validity = std::chrono::milliseconds(100)});
  ASSERT_TRUE(fresh.has_value());
  spindle::testing::run_in_fiber(
      [&] {
        files_.emplace(std::move(*fresh));
        auto before = request("/site.css", "Accept-Encoding: gzip\r\n");
        std::string changed(3000, 'x');
        write(root_ / "site.css", changed);
        (void)spindle::this_fiber::sleep_for(std::chrono::milliseconds(150));
        auto after = request("/site.css", "Accept-Encoding: gzip\r\n");
        EXPECT_EQ(spindle::testing::gunzip(after.body), changed);
        EXPECT_NE(after.headers.get("etag"), before.headers.get("etag"));
      },
      1);
}

// A FIFO (or a socket, or a device) under the root is not a file to serve: 404 at once, never a
// wait for a writer that would hold the worker for good (issue 67 item 11). Without a cache (no
// worker) and with one, by name and as a folder's index.
TEST_F(StaticFilesTest, AFifoOrASocketUnderTheRootIsNotFoundAtOnce) {
  ASSERT_EQ(::mkfifo((root_ / "pipe").c_str(), 0644), 0);
  ASSERT_EQ(::mkfifo((root_ / "pipe.txt").c_str(), 0644), 0);
  fs::create_directories(root_ / "piped");
  ASSERT_EQ(::mkfifo((root_ / "piped" / "index.html").c_str(), 0644), 0);
  fs::create_symlink("pipe", root_ / "to_pipe");
  int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{.sun_family = AF_UNIX};
  std::string sock_path = (root_ / "sock").string();
  ASSERT_LT(sock_path.size(), sizeof address.sun_path);
  std::copy(sock_path.begin(), sock_path.end(), address.sun_path);
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  auto check = [&] {
    for (auto path : {"/pipe", "/pipe.txt", "/to_pipe", "/sock", "/piped/"}) {
      auto r = request(path, "Accept-Encoding: gzip, br\r\n");
      // A folder whose index is no file is a folder without one: 403, as no listing is made.
      EXPECT_EQ(r.status, std::string_view(path) == "/piped/" ? 403 : 404) << path;
      EXPECT_FALSE(r.file.has_value()) << path;
    }
    EXPECT_EQ(request("/hello.txt").status, 200);
  };
  check();  // no worker: no cache
  spindle::testing::run_in_fiber([&] { check(), check(); }, 1);
  ::close(sock);
}

// The root is the folder its path names now, as nginx's root: a deploy that swaps the symlink
// `current -> releases/N` is served from the new release once the validity has passed, and a
// deleted old release never leaves every file 404 (issue 70 item 7). Without a cache, at once.
TEST_F(StaticFilesTest, ASymlinkSwapOfTheRootIsFollowed) {
  fs::create_directories(base_ / "releases" / "1");
  fs::create_directories(base_ / "releases" / "2");
  write(base_ / "releases" / "1" / "app.txt", "release one");
  write(base_ / "releases" / "2" / "app.txt", "release two");
  write(base_ / "releases" / "2" / "new.txt", "only in two");
  fs::create_symlink("releases/1", base_ / "current");
  auto swap_to = [&](const char* release) {
    fs::create_symlink(release, base_ / "current.next");
    fs::rename(base_ / "current.next", base_ / "current");  // atomic, as deploy tools do
  };
  for (int validity : {0, 100}) {
    fs::remove(base_ / "current");
    fs::create_symlink("releases/1", base_ / "current");
    auto files =
        StaticFiles::open((base_ / "current").string(),
                          StaticOptions{.cache_validity = std::chrono::milliseconds(validity)});
    ASSERT_TRUE(files.has_value());
    files_.emplace(std::move(*files));
    spindle::testing::run_in_fiber(
        [&] {
          EXPECT_EQ(body_of_request("/app.txt"), "release one") << validity;
          EXPECT_EQ(request("/new.txt").status, 404) << validity;
          swap_to("releases/2");
          (void)spindle::this_fiber::sleep_for(std::chrono::milliseconds(validity + 50));
          EXPECT_EQ(body_of_request("/app.txt"), "release two") << validity;
          EXPECT_EQ(body_of_request("/new.txt"), "only in two") << validity;
          // The old release deleted, then a third deployed: still served, never 404 for good.
          fs::remove_all(base_ / "releases" / "1");
          fs::create_directories(base_ / "releases" / "3");
          write(base_ / "releases" / "3" / "app.txt", "release three");
          swap_to("releases/3");
          (void)spindle::this_fiber::sleep_for(std::chrono::milliseconds(validity + 50));
          EXPECT_EQ(body_of_request("/app.txt"), "release three") << validity;
          // The root gone: 404, and back once it is there again.
          fs::remove(base_ / "current");
          (void)spindle::this_fiber::sleep_for(std::chrono::milliseconds(validity + 50));
          EXPECT_EQ(request("/app.txt").status, 404) << validity;
          fs::create_symlink("releases/3", base_ / "current");
          (void)spindle::this_fiber::sleep_for(std::chrono::milliseconds(validity + 50));
          EXPECT_EQ(body_of_request("/app.txt"), "release three") << validity;
        },
        1);
    fs::create_directories(base_ / "releases" / "1");
    write(base_ / "releases" / "1" / "app.txt", "release one");
  }
}
