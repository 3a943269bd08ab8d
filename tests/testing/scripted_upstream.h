#pragma once
// ScriptedUpstream: an HTTP/1 upstream for client tests, on a Unix socket, that answers each
// request it reads with the next script a test pushed: the response's bytes cut into pieces,
// each written once the client has read the one before (segmented.h), so the client's reads
// see exactly those pieces. Plain threads and blocking sockets: nothing of spindle's.

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "testing/segmented.h"

namespace spindle::testing {

class ScriptedUpstream {
 public:
  /// One answer: its bytes in pieces, and whether the connection closes after them.
  struct Script {
    std::vector<std::string> pieces;
    bool close = false;
  };

  /// Listens on a fresh Unix socket path.
  ScriptedUpstream() : path_(unix_socket_path("upstream")) {
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof address.sun_path - 1);
    ::unlink(path_.c_str());
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener_, 64) != 0) {
      ::close(listener_);
      listener_ = -1;
      return;
    }
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~ScriptedUpstream() {
    {
      std::lock_guard guard(lock_);
      stopping_ = true;
      for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    }
    changed_.notify_all();
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& t : threads_) t.join();
    if (listener_ >= 0) ::close(listener_);
    ::unlink(path_.c_str());
  }
  ScriptedUpstream(const ScriptedUpstream&) = delete;
  ScriptedUpstream& operator=(const ScriptedUpstream&) = delete;

  /// "unix:PATH", for Address::parse.
  std::string address() const { return "unix:" + path_; }
  /// True if it listens.
  bool ok() const { return listener_ >= 0; }

  /// Queues the answer to the next request (on whichever connection it comes).
  void push(Script script) {
    std::lock_guard guard(lock_);
    scripts_.push_back(std::move(script));
    changed_.notify_all();
  }
  /// Request heads received so far, in order.
  std::vector<std::string> requests() const {
    std::lock_guard guard(lock_);
    return requests_;
  }
  /// Connections accepted so far.
  std::size_t accepted() const {
    std::lock_guard guard(lock_);
    return accepted_;
  }

 private:
  void accept_loop() {
    for (;;) {
      pollfd p{listener_, POLLIN, 0};
      int ready = ::poll(&p, 1, 50);
      {
        std::lock_guard guard(lock_);
        if (stopping_) return;
      }
      if (ready <= 0) continue;
      int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::lock_guard guard(lock_);
      ++accepted_;
      connections_.push_back(fd);
      // Threads of connections that ended are joined as new ones come (a fuzzer makes
      // hundreds of thousands).
      std::erase_if(threads_, [&](std::thread& t) {
        if (std::ranges::find(ended_, t.get_id()) == ended_.end()) return false;
        std::erase(ended_, t.get_id());
        t.join();
        return true;
      });
      threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  // Reads one request (head, and a Content-Length body); false when the client closed.
  bool read_request(int fd, std::string& buffer) {
    for (;;) {
      std::size_t end = buffer.find("\r\n\r\n");
      if (end != std::string::npos) {
        std::size_t body = 0;
        std::size_t at = buffer.find("Content-Length: ");
        if (at != std::string::npos && at < end) body = std::stoul(buffer.substr(at + 16));
        if (buffer.size() >= end + 4 + body) {
          std::lock_guard guard(lock_);
          if (requests_.size() == kKeptRequests) requests_.clear();
          requests_.push_back(buffer.substr(0, end + 4));
          buffer.erase(0, end + 4 + body);
          return true;
        }
      }
      char chunk[4096];
      ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) return false;
      buffer.append(chunk, static_cast<std::size_t>(n));
    }
  }

  void serve(int fd) {
    std::string buffer;
    while (read_request(fd, buffer)) {
      Script script;
      {
        std::unique_lock guard(lock_);
        if (!changed_.wait_for(guard, std::chrono::seconds(10),
                               [&] { return stopping_ || !scripts_.empty(); }) ||
            stopping_) {
          break;
        }
        script = std::move(scripts_.front());
        scripts_.pop_front();
      }
      std::vector<std::string_view> pieces(script.pieces.begin(), script.pieces.end());
      if (!write_pieces(fd, pieces) || script.close) break;
    }
    std::lock_guard guard(lock_);
    std::erase(connections_, fd);
    ::close(fd);
    ended_.push_back(std::this_thread::get_id());
  }

  /// Request heads kept (a fuzzer's long run starts the list again past it).
  static constexpr std::size_t kKeptRequests = 10'000;

  std::string path_;
  int listener_ = -1;
  std::thread acceptor_;
  mutable std::mutex lock_;
  std::condition_variable changed_;
  std::deque<Script> scripts_;
  std::vector<std::string> requests_;
  std::vector<int> connections_;
  std::vector<std::thread> threads_;
  /// Threads whose connection ended, to join.
  std::vector<std::thread::id> ended_;
  std::size_t accepted_ = 0;
  bool stopping_ = false;
};

}  // namespace spindle::testing
