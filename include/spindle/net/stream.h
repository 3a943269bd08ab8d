#pragma once
/// Stream: a connected byte stream that is plain TCP or TLS over TCP, for the protocol drivers
/// (HTTP/1, HTTP/2, upstream clients) that serve both the same way.

#include <sys/uio.h>

#include <span>
#include <utility>
#include <variant>

#include "spindle/net/tcp_stream.h"
#include "spindle/net/tls.h"

namespace spindle {

/// Plain TCP or TLS; each call goes to the one it holds. Move-only, owned by one worker.
class Stream {
 public:
  Stream() = default;
  explicit Stream(TcpStream tcp) : s_(std::move(tcp)) {}
  explicit Stream(TlsStream tls) : s_(std::move(tls)) {}

 private:
  /// Calls `f` with the stream held.
  template <typename F>
  decltype(auto) with(F&& f) {
    if (auto* tcp = std::get_if<TcpStream>(&s_)) return f(*tcp);
    return f(std::get<TlsStream>(s_));
  }

 public:
  [[nodiscard]] Result<std::size_t> read(std::span<char> buffer,
                                         Deadline deadline = Deadline::never()) {
    return with([&](auto& s) { return s.read(buffer, deadline); });
  }
  [[nodiscard]] Result<void> write_all(std::span<const char> data,
                                       Deadline deadline = Deadline::never()) {
    return with([&](auto& s) { return s.write_all(data, deadline); });
  }
  [[nodiscard]] Result<std::size_t> writev(std::span<const iovec> buffers,
                                           Deadline deadline = Deadline::never()) {
    return with([&](auto& s) { return s.writev(buffers, deadline); });
  }
  [[nodiscard]] Result<std::size_t> sendfile(int file_fd, off_t offset, std::size_t count,
                                             Deadline deadline = Deadline::never()) {
    return with([&](auto& s) { return s.sendfile(file_fd, offset, count, deadline); });
  }
  [[nodiscard]] Result<void> shutdown(TcpStream::Shutdown how) {
    return with([&](auto& s) { return s.shutdown(how); });
  }
  [[nodiscard]] Result<Address> peer_address() {
    return with([](auto& s) { return s.peer_address(); });
  }
  [[nodiscard]] Result<Address> local_address() {
    return with([](auto& s) { return s.local_address(); });
  }
  void on_readable(void (*callback)(IoSlot& slot), void* owner) {
    with([&](auto& s) { s.on_readable(callback, owner); });
  }
  void cancel_on_readable() {
    with([](auto& s) { s.cancel_on_readable(); });
  }
  bool on_readable_armed() {
    return with([](auto& s) { return s.on_readable_armed(); });
  }
  int fd() {
    return with([](auto& s) { return s.fd(); });
  }

  /// Closes gently before the socket is closed: half-closes (sending FIN, and close_notify on
  /// TLS), then reads and drops what the peer still sends until it closes or `until`. Closing
  /// with unread bytes would make the kernel send a reset, which can destroy the last answer
  /// before the peer reads it (a 413 to a client still uploading, say).
  void linger(Deadline until) {
    (void)shutdown(TcpStream::Shutdown::kWrite);
    char sink[4096];
    for (;;) {
      auto n = read(sink, until);
      if (!n || *n == 0) return;
    }
  }

  /// Bytes the kernel has taken for sending so far (TLS records included): see
  /// TcpStream::bytes_sent.
  std::uint64_t bytes_sent() const {
    if (const auto* t = std::get_if<TlsStream>(&s_)) return t->tcp().bytes_sent();
    return std::get<TcpStream>(s_).bytes_sent();
  }

  /// The TLS layer, or nullptr for plain TCP.
  TlsStream* tls() { return std::get_if<TlsStream>(&s_); }
  /// The plain TCP stream, or nullptr for TLS.
  TcpStream* tcp() { return std::get_if<TcpStream>(&s_); }
  /// True if bytes are already buffered above the socket (TLS), so a read would not block
  /// even if the socket has nothing.
  bool has_pending() {
    TlsStream* t = tls();
    return t != nullptr && t->has_pending();
  }
  /// True if the last read found the socket empty and nothing has arrived since (nor waits
  /// in OpenSSL): an idle connection may be left to the edge-triggered reactor without
  /// another read. See TcpStream::drained.
  bool drained() const {
    if (const auto* t = std::get_if<TlsStream>(&s_)) return t->drained();
    return std::get<TcpStream>(s_).drained();
  }
  /// Waits until a read would find something (bytes, or the peer's close), without reading:
  /// at once unless drained(). See TcpStream::wait_readable.
  [[nodiscard]] Result<void> wait_readable(Deadline deadline) {
    if (!drained()) return {};
    if (auto* t = std::get_if<TlsStream>(&s_)) return t->tcp().wait_readable(deadline);
    return std::get<TcpStream>(s_).wait_readable(deadline);
  }

 private:
  std::variant<TcpStream, TlsStream> s_;
};

}  // namespace spindle
