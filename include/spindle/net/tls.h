#pragma once
/// TLS on OpenSSL 3 over the fiber socket: TlsServerContext (certificates chosen by SNI, ALPN,
/// session tickets, TLS 1.2 and 1.3, kTLS when offered), TlsClientContext (verification on by
/// default, SNI, ALPN, hostname check) and TlsStream, whose calls park the fiber on
/// WANT_READ / WANT_WRITE and take deadlines like TcpStream's.

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/fiber/buffer_pool.h"
#include "spindle/io/deadline.h"
#include "spindle/net/tcp_stream.h"

using SSL = struct ssl_st;
using SSL_CTX = struct ssl_ctx_st;
using SSL_SESSION = struct ssl_session_st;
using BIO = struct bio_st;

namespace spindle {

/// The category of OpenSSL's error codes ("tls"); messages come from OpenSSL.
const std::error_category& tls_category();

/// One certificate chain with its key, and the host names it serves.
struct TlsCertificate {
  /// PEM file with the certificate, then its chain.
  std::string cert_file;
  /// PEM file with the private key.
  std::string key_file;
  /// SNI names it answers ("example.com", "*.example.com"); empty: the names in the
  /// certificate (subjectAltName DNS entries, else the common name).
  std::vector<std::string> names;
};

/// Whether the kernel offers kTLS: it has, or can load, the "tls" upper-layer protocol. Asked
/// once per process; contexts enable OpenSSL's kTLS only then, so that no connection pays a
/// refused system call for it.
bool kernel_offers_ktls();

/// How a server speaks TLS.
struct TlsServerOptions {
  /// The certificates; the first one also answers clients that send no or an unknown name.
  std::vector<TlsCertificate> certificates;
  /// Protocols offered by ALPN, in the server's order of preference (e.g. "h2", "http/1.1").
  /// A client that offers none of them is refused; one that sends no ALPN is accepted.
  std::vector<std::string> alpn = {"http/1.1"};
  /// Resumption by session tickets (TLS 1.2 and 1.3), keys rotated by OpenSSL.
  bool session_tickets = true;
  /// Let the kernel encrypt (kTLS) when the kernel and OpenSSL can.
  bool ktls = true;
  /// Largest plaintext per TLS record sent, 512 to 16384 (as nginx's ssl_buffer_size):
  /// smaller records let a client start on the first bytes sooner, at some CPU cost.
  std::size_t max_record_size = 16384;
};

/// How a client speaks TLS.
struct TlsClientOptions {
  /// CA bundle (PEM) to verify servers against; empty: the system store.
  std::string ca_file;
  /// Skips verification of the server's certificate and name. For tests only.
  bool insecure = false;
  /// Protocols offered by ALPN, in order of preference; empty: no ALPN.
  std::vector<std::string> alpn;
};

/// A server's TLS setup, shared read-only by every worker.
class TlsServerContext {
 public:
  /// Loads the certificates and keys. Errors name the file and what OpenSSL said.
  [[nodiscard]] static std::expected<std::shared_ptr<const TlsServerContext>, std::string> create(
      TlsServerOptions options);
  ~TlsServerContext();
  TlsServerContext(const TlsServerContext&) = delete;
  TlsServerContext& operator=(const TlsServerContext&) = delete;

  /// The context a new connection starts with (the first certificate's).
  SSL_CTX* default_context() const;
  /// The context whose names match `server_name`, or nullptr.
  SSL_CTX* context_for(std::string_view server_name) const;
  /// The options it was made from.
  const TlsServerOptions& options() const { return options_; }

 private:
  TlsServerContext() = default;
  struct Site;
  TlsServerOptions options_;
  std::vector<Site> sites_;
  /// ALPN protocols in wire format (length-prefixed), for the selection callback.
  std::string alpn_wire_;
  friend struct TlsCallbacks;
};

/// A client's TLS setup, shared by every worker. It remembers the last session each server
/// gave (by server name), so the next connection to it resumes.
class TlsClientContext {
 public:
  /// Loads the CA store. Errors name the file and what OpenSSL said.
  [[nodiscard]] static std::expected<std::shared_ptr<const TlsClientContext>, std::string> create(
      TlsClientOptions options = {});
  ~TlsClientContext();
  TlsClientContext(const TlsClientContext&) = delete;
  TlsClientContext& operator=(const TlsClientContext&) = delete;

  /// The OpenSSL context.
  SSL_CTX* native() const { return ctx_; }
  /// The options it was made from.
  const TlsClientOptions& options() const { return options_; }
  /// Its settings by content: verification, the CA bundle's path and a digest of its bytes
  /// (the system store by name), ALPN. Two contexts of one identity verify and offer alike,
  /// so connections made with one may serve the other (a reload's new context).
  const std::string& identity() const { return identity_; }

 private:
  TlsClientContext() = default;
  friend struct TlsCallbacks;
  friend class TlsStream;
  /// Sets `ssl` to resume the session remembered for `name`, if any.
  void resume(SSL* ssl, const std::string& name) const;

  TlsClientOptions options_;
  /// identity().
  std::string identity_;
  SSL_CTX* ctx_ = nullptr;
  /// The last session per server name (owned references).
  mutable std::mutex sessions_lock_;
  mutable std::unordered_map<std::string, SSL_SESSION*> sessions_;
};

/// A TLS connection over a TcpStream. Move-only; owned by one worker, like its socket.
class TlsStream {
 public:
  TlsStream() = default;
  TlsStream(TlsStream&&) noexcept;
  TlsStream& operator=(TlsStream&&) noexcept;
  ~TlsStream();

  /// Runs the server side of the handshake on `stream`, giving up at `deadline`
  /// (std::errc::timed_out). A client that speaks something else than TLS fails at once.
  [[nodiscard]] static Result<TlsStream> accept(TcpStream stream,
                                                std::shared_ptr<const TlsServerContext> context,
                                                Deadline deadline);
  /// Runs the client side on `stream`: SNI and (unless insecure) the name check use
  /// `server_name`.
  [[nodiscard]] static Result<TlsStream> connect(TcpStream stream,
                                                 std::shared_ptr<const TlsClientContext> context,
                                                 std::string_view server_name, Deadline deadline);

  /// Reads some decrypted bytes; 0 once the peer closed (close_notify or a bare FIN).
  [[nodiscard]] Result<std::size_t> read(std::span<char> buffer,
                                         Deadline deadline = Deadline::never());
  /// Writes all of `data`.
  [[nodiscard]] Result<void> write_all(std::span<const char> data,
                                       Deadline deadline = Deadline::never());
  /// Writes all of the buffers, in order, gathering small ones into full TLS records.
  [[nodiscard]] Result<std::size_t> writev(std::span<const iovec> buffers,
                                           Deadline deadline = Deadline::never());
  /// Sends `count` bytes of `file_fd` from `offset` (SSL_sendfile under kTLS, else read and
  /// encrypted here). Returns the bytes sent.
  [[nodiscard]] Result<std::size_t> sendfile(int file_fd, off_t offset, std::size_t count,
                                             Deadline deadline = Deadline::never());
  /// Sends close_notify (without waiting for the peer's), then half-closes TCP.
  [[nodiscard]] Result<void> shutdown(TcpStream::Shutdown how);

  /// Gives OpenSSL's record buffers (about 34 KiB) back; the next read or write takes them
  /// again. True if it did (or held none); false while OpenSSL holds bytes in them (a record
  /// half read or half written, or has_pending()). A server keeps them between the records of
  /// a busy connection and gives them back from a connection quiet for a while (server.cc).
  bool release_buffers();
  /// Keeps OpenSSL's record buffers from record to record, where the client's context has
  /// them given back after each (pooled idle connections stay small): for a connection few and
  /// busy, as an upstream HTTP/2 session, taking two ~17 KiB blocks a record costs more.
  void keep_buffers();
  /// A count of the reads, writes and handshake steps so far (it wraps): unchanged between
  /// two looks, the stream was quiet in between.
  std::uint32_t io_count() const { return io_; }
  /// True if decrypted or undecrypted bytes wait in OpenSSL's buffers (a read would not block).
  bool has_pending() const;
  /// True if the last read of the socket came back shorter than asked or would have blocked,
  /// nothing has arrived since, and OpenSSL holds nothing but part of a record (a record whose
  /// last bytes have not come): a read would park (read() then waits without calling
  /// OpenSSL), as TcpStream::drained().
  bool drained() const;
  /// The protocol ALPN chose ("" if none).
  std::string_view alpn() const;
  /// The name the client asked for by SNI ("" if none).
  std::string_view server_name() const;
  /// True if the handshake resumed an earlier session.
  bool session_reused() const;
  /// True if the kernel encrypts what this stream sends (kTLS).
  bool ktls_send() const;
  /// "TLSv1.3" and the like.
  std::string_view version() const;

  /// The TCP connection underneath.
  TcpStream& tcp() { return tcp_; }
  const TcpStream& tcp() const { return tcp_; }
  [[nodiscard]] Result<Address> peer_address() const { return tcp_.peer_address(); }
  [[nodiscard]] Result<Address> local_address() const { return tcp_.local_address(); }
  int fd() const { return tcp_.fd(); }
  bool is_open() const { return tcp_.is_open(); }
  /// As TcpStream::on_readable; check has_pending() first, as OpenSSL may hold bytes already.
  void on_readable(void (*callback)(IoSlot& slot), void* owner) {
    tcp_.on_readable(callback, owner);
  }
  void cancel_on_readable() { tcp_.cancel_on_readable(); }
  bool on_readable_armed() const { return tcp_.on_readable_armed(); }

 private:
  TlsStream(TcpStream stream, SSL* ssl) : tcp_(std::move(stream)), ssl_(ssl) {}
  /// Runs an SSL call until it succeeds, parking on WANT_READ/WANT_WRITE.
  template <typename Op>
  Result<int> drive(Deadline deadline, Op&& op);
  /// Runs the handshake (the side is set already).
  Result<void> handshake(Deadline deadline);
  /// SSL_write of all of `data`.
  Result<void> write_record(std::span<const char> data, Deadline deadline);
  /// Gives the socket to OpenSSL, and watches its reads for drained(). With `read_ahead`
  /// (a client), OpenSSL reads through a BIO of ours that reads the socket ahead (tls.cc).
  Result<void> attach(bool read_ahead = false);
  /// Points the read watch at this object (again, after a move).
  void watch_reads();
  /// The read-ahead BIO's read: bytes from `ahead_`, refilled by one recv when empty.
  friend struct ReadAheadBio;
  int read_ahead(BIO* bio, char* out, std::size_t want, std::size_t* got);

  TcpStream tcp_;
  SSL* ssl_ = nullptr;
  /// Client side: socket bytes read ahead of what OpenSSL asked for, [ahead_begin_,
  /// ahead_end_) of a pooled buffer, given back once all are taken.
  BufferPool::Buffer ahead_;
  std::uint32_t ahead_begin_ = 0;
  std::uint32_t ahead_end_ = 0;
  bool reads_ahead_ = false;
  /// The last OpenSSL call wanted more bytes from the socket and none came since it: what
  /// OpenSSL holds, if anything, is part of a record (drained()).
  bool starved_ = false;
  /// io_count().
  std::uint32_t io_ = 0;
  /// Keeps the context (and its SSL_CTXs) alive as long as the connection.
  std::shared_ptr<const void> context_;
  /// Client side: the server's name, on the heap so that SSL app data can point at it.
  std::unique_ptr<std::string> peer_name_;
};

}  // namespace spindle
