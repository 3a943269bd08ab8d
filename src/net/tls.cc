#include "spindle/net/tls.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "spindle/base/ascii.h"
#include "spindle/fiber/buffer_pool.h"
#include "spindle/io/bare_recv.h"

namespace spindle {
namespace {

class TlsCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "tls"; }
  std::string message(int code) const override {
    char text[256];
    ERR_error_string_n(static_cast<unsigned long>(code), text, sizeof text);
    return text;
  }
};

// The newest OpenSSL error of this thread as an error_code; the queue is emptied.
std::error_code take_tls_error() {
  unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  if (e == 0) return std::make_error_code(std::errc::protocol_error);
  return {static_cast<int>(e), tls_category()};
}

// What OpenSSL said last, for configuration errors; the queue is emptied.
std::string openssl_message() {
  unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  if (e == 0) return "unknown OpenSSL error";
  char text[256];
  ERR_error_string_n(e, text, sizeof text);
  return text;
}

// TLS 1.2 suites with forward secrecy and AEAD only (TLS 1.3 suites are all of that kind).
constexpr const char* kCiphers12 =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
// TLS 1.3 suites in the same order (OpenSSL's default puts AES-256 first): AES-128-GCM is as
// safe in practice, and both its record encryption and its SHA-256 key schedule cost less.
constexpr const char* kSuites13 =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

// "example.com" matches itself; "*.example.com" matches one more label in front.
bool name_matches(std::string_view pattern, std::string_view name) {
  if (pattern.starts_with("*.")) {
    std::size_t dot = name.find('.');
    return dot != std::string_view::npos && dot > 0 && name.substr(dot) == pattern.substr(1);
  }
  return pattern == name;
}

// The DNS names a certificate is for: subjectAltName DNS entries, else the common name.
std::vector<std::string> certificate_names(X509* cert) {
  std::vector<std::string> names;
  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (sans) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* gn = sk_GENERAL_NAME_value(sans, i);
      if (gn->type != GEN_DNS) continue;
      const unsigned char* data = ASN1_STRING_get0_data(gn->d.dNSName);
      names.push_back(ascii_lower({reinterpret_cast<const char*>(data),
                                   static_cast<std::size_t>(ASN1_STRING_length(gn->d.dNSName))}));
    }
    GENERAL_NAMES_free(sans);
  }
  if (names.empty()) {
    char cn[256];
    int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
    if (n > 0) names.push_back(ascii_lower({cn, static_cast<std::size_t>(n)}));
  }
  return names;
}

// ALPN protocols in their wire format: each one prefixed with its length.
std::expected<std::string, std::string> alpn_wire(const std::vector<std::string>& protocols) {
  std::string wire;
  for (const auto& p : protocols) {
    if (p.empty() || p.size() > 255) return std::unexpected("invalid ALPN protocol '" + p + "'");
    wire += static_cast<char>(p.size());
    wire += p;
  }
  return wire;
}

// The SHA-256 of a file's bytes in hex, or "" if it cannot be read.
std::string file_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    ERR_clear_error();
    return {};
  }
  std::string hex;
  for (unsigned int i = 0; i < size; ++i) {
    fmt::format_to(std::back_inserter(hex), "{:02x}", digest[i]);
  }
  return hex;
}

// TlsClientContext::identity() of `options`: what decides how a connection is verified and
// what it offers, by content (the CA bundle by its bytes: a renewed bundle is new settings).
std::string client_identity(const TlsClientOptions& options) {
  std::string ca = options.insecure          ? std::string("unverified")
                   : options.ca_file.empty() ? std::string("system store")
                                             : fmt::format("ca {} sha256:{}", options.ca_file,
                                                           file_digest(options.ca_file));
  return fmt::format("{} alpn:{}", ca, fmt::join(options.alpn, ","));
}

bool is_ip_literal(std::string_view host) {
  std::string h(host);
  in6_addr a6;
  in_addr a4;
  return ::inet_pton(AF_INET, h.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, h.c_str(), &a6) == 1;
}

// The socket BIO's callback: a read of the socket that came back shorter than asked, or would
// block, proved it drained; a write counts its bytes as sent. The TCP stream (the callback
// argument's) notes both.
long note_socket_read(BIO* bio, int oper, const char* /*argp*/, std::size_t asked, int /*argi*/,
                      long /*argl*/, int ret, std::size_t* got) {
  if (oper == (BIO_CB_READ | BIO_CB_RETURN)) {
    bool drained = ret > 0 ? *got < asked : BIO_should_retry(bio) != 0;
    if (drained) reinterpret_cast<TlsStream*>(BIO_get_callback_arg(bio))->tcp().note_drained();
  } else if (oper == (BIO_CB_WRITE | BIO_CB_RETURN) && ret > 0) {
    reinterpret_cast<TlsStream*>(BIO_get_callback_arg(bio))->tcp().note_sent(*got);
  }
  return ret;
}

}  // namespace

// A client's reads go through this BIO. OpenSSL 3.0's own read-ahead keeps the bytes it read
// past a record in its buffer and, before each record it reads, moves them to the front of it
// (ssl3_read_n aligns the payload): an upstream that sends many records at once cost ~4,000
// instructions per proxied request there (h2 over TLS to h2 over TLS, c100 m10). With this BIO
// (OpenSSL's read-ahead off) one recv fills a pooled buffer, and OpenSSL takes each record's
// header and body from it: no system call more, no move.
struct ReadAheadBio {
  static int read(BIO* bio, char* out, std::size_t want, std::size_t* got) {
    return static_cast<TlsStream*>(BIO_get_data(bio))->read_ahead(bio, out, want, got);
  }
  static long control(BIO* bio, int command, long /*number*/, void* /*pointer*/) {
    switch (command) {
      case BIO_CTRL_PENDING: {
        const auto* tls = static_cast<const TlsStream*>(BIO_get_data(bio));
        return static_cast<long>(tls->ahead_end_ - tls->ahead_begin_);
      }
      case BIO_CTRL_FLUSH:
        return 1;
      default:
        return 0;  // nothing else applies to a reader (kTLS receive among them)
    }
  }
  static BIO_METHOD* method() {
    static BIO_METHOD* const made = [] {
      BIO_METHOD* m =
          BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "spindle read-ahead");
      BIO_meth_set_read_ex(m, &ReadAheadBio::read);
      BIO_meth_set_ctrl(m, &ReadAheadBio::control);
      return m;
    }();
    return made;
  }
};

const std::error_category& tls_category() {
  static const TlsCategory category;
  return category;
}

// ---- server context ------------------------------------------------------------------------

struct TlsServerContext::Site {
  SSL_CTX* ctx = nullptr;
  std::vector<std::string> names;
};

// OpenSSL's callbacks, with access to the context.
struct TlsCallbacks {
  // SNI: switch to the certificate whose names match; unknown names get the default one.
  static int servername(SSL* ssl, int* /*alert*/, void* arg) {
    const auto* self = static_cast<const TlsServerContext*>(arg);
    const char* name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    if (name == nullptr) return SSL_TLSEXT_ERR_OK;
    SSL_CTX* ctx = self->context_for(name);
    if (ctx != nullptr && ctx != SSL_get_SSL_CTX(ssl)) SSL_set_SSL_CTX(ssl, ctx);
    return SSL_TLSEXT_ERR_OK;
  }

  // ALPN: the first of the server's protocols that the client offers.
  static int alpn(SSL* /*ssl*/, const unsigned char** out, unsigned char* out_length,
                  const unsigned char* in, unsigned int in_length, void* arg) {
    const auto* self = static_cast<const TlsServerContext*>(arg);
    std::string_view ours = self->alpn_wire_;
    while (!ours.empty()) {
      auto size = static_cast<unsigned char>(ours[0]);
      std::string_view proto = ours.substr(1, size);
      for (unsigned int i = 0; i < in_length; i += 1u + in[i]) {
        std::string_view offered(reinterpret_cast<const char*>(in + i + 1),
                                 std::min<unsigned int>(in[i], in_length - i - 1));
        if (offered == proto) {
          *out = in + i + 1;
          *out_length = in[i];
          return SSL_TLSEXT_ERR_OK;
        }
      }
      ours.remove_prefix(1 + size);
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL;  // RFC 7301 3.2: no_application_protocol
  }

  // Client: a server sent a session (a TLS 1.3 ticket may come after the handshake). Keeps it
  // for the server's name; returning 1 takes the reference.
  static int new_session(SSL* ssl, SSL_SESSION* session) {
    auto* self = static_cast<TlsClientContext*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
    const char* name = static_cast<const char*>(SSL_get_app_data(ssl));
    if (self == nullptr || name == nullptr) return 0;
    std::lock_guard lock(self->sessions_lock_);
    SSL_SESSION*& slot = self->sessions_[name];
    if (slot != nullptr) SSL_SESSION_free(slot);
    slot = session;
    return 1;
  }
};

bool kernel_offers_ktls() {
  // OpenSSL asks for the "tls" protocol on every connection after its handshake; without it
  // the kernel answers ENOENT each time. Asked here once, on a socket of our own: ENOENT means
  // none (and none to load); with one, an unconnected socket is refused otherwise (ENOTCONN).
  // Anything else (a sandbox's EPERM, no socket at all) leaves the question to OpenSSL.
  static const bool offered = [] {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return true;
    static constexpr char kName[] = "tls";
    bool refused =
        ::setsockopt(fd, SOL_TCP, TCP_ULP, kName, sizeof kName - 1) != 0 && errno == ENOENT;
    ::close(fd);
    return !refused;
  }();
  return offered;
}

std::expected<std::shared_ptr<const TlsServerContext>, std::string> TlsServerContext::create(
    TlsServerOptions options) {
  if (options.certificates.empty()) return std::unexpected("no certificate given");
  if (options.max_record_size < 512 || options.max_record_size > 16384) {
    return std::unexpected(
        fmt::format("max_record_size {}: expected 512 to 16384", options.max_record_size));
  }
  std::shared_ptr<TlsServerContext> self(new TlsServerContext());
  auto wire = alpn_wire(options.alpn);
  if (!wire) return std::unexpected(wire.error());
  self->alpn_wire_ = std::move(*wire);
  for (const TlsCertificate& cert : options.certificates) {
    // OpenSSL would only say "system lib": say which file and why.
    for (const std::string* file : {&cert.cert_file, &cert.key_file}) {
      if (::access(file->c_str(), R_OK) != 0) {
        return std::unexpected(*file + ": " + std::generic_category().message(errno));
      }
    }
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == nullptr) return std::unexpected(openssl_message());
    self->sites_.push_back(Site{ctx, {}});
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_cipher_list(ctx, kCiphers12);
    SSL_CTX_set_ciphersuites(ctx, kSuites13);
    std::uint64_t flags = SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                          SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_COMPRESSION;
    if (!options.session_tickets) flags |= SSL_OP_NO_TICKET;
    SSL_CTX_set_max_send_fragment(ctx, static_cast<long>(options.max_record_size));
    if (options.ktls && kernel_offers_ktls()) flags |= SSL_OP_ENABLE_KTLS;
    SSL_CTX_set_options(ctx, flags);
    // OpenSSL's record buffers stay from record to record (not SSL_MODE_RELEASE_BUFFERS, which
    // frees and takes both around every record: ~170 instructions a request of h2 over TLS);
    // the server gives them back from connections quiet for a second (release_buffers), so
    // idle ones stay small. The chain is sent as the file gives it: OpenSSL would otherwise try
    // to complete it from the trust store on every handshake (as nginx, we leave that to
    // whoever made the file).
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_NO_AUTO_CHAIN);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
    // Read whole records (and whatever follows) in one read(2), not header then body: one
    // system call less per request. has_pending() counts what is held ahead.
    SSL_CTX_set_read_ahead(ctx, 1);
    static const unsigned char kSessionContext[] = "spindle";
    SSL_CTX_set_session_id_context(ctx, kSessionContext, sizeof kSessionContext - 1);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert.cert_file.c_str()) != 1) {
      return std::unexpected(cert.cert_file + ": " + openssl_message());
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, cert.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return std::unexpected(cert.key_file + ": " + openssl_message());
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      return std::unexpected(cert.key_file + ": the key does not match " + cert.cert_file);
    }
    SSL_CTX_set_tlsext_servername_callback(ctx, &TlsCallbacks::servername);
    SSL_CTX_set_tlsext_servername_arg(ctx, self.get());
    SSL_CTX_set_alpn_select_cb(ctx, &TlsCallbacks::alpn, self.get());
    auto& names = self->sites_.back().names;
    for (const auto& n : cert.names) names.push_back(ascii_lower(n));
    if (names.empty()) names = certificate_names(SSL_CTX_get0_certificate(ctx));
  }
  self->options_ = std::move(options);
  return self;
}

TlsServerContext::~TlsServerContext() {
  for (Site& site : sites_) SSL_CTX_free(site.ctx);
}

SSL_CTX* TlsServerContext::default_context() const { return sites_.front().ctx; }

SSL_CTX* TlsServerContext::context_for(std::string_view server_name) const {
  std::string name = ascii_lower(server_name);
  for (const Site& site : sites_) {
    for (const auto& pattern : site.names) {
      if (name_matches(pattern, name)) return site.ctx;
    }
  }
  return nullptr;
}

// ---- client context ------------------------------------------------------------------------

std::expected<std::shared_ptr<const TlsClientContext>, std::string> TlsClientContext::create(
    TlsClientOptions options) {
  std::shared_ptr<TlsClientContext> self(new TlsClientContext());
  self->ctx_ = SSL_CTX_new(TLS_client_method());
  if (self->ctx_ == nullptr) return std::unexpected(openssl_message());
  SSL_CTX* ctx = self->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_cipher_list(ctx, kCiphers12);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF |
                               SSL_OP_NO_COMPRESSION |
                               (kernel_offers_ktls() ? SSL_OP_ENABLE_KTLS : 0));
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
  // Not OpenSSL's read-ahead: ours (ReadAheadBio) reads the socket ahead as it does.
  SSL_CTX_set_app_data(ctx, self.get());
  SSL_CTX_sess_set_new_cb(ctx, &TlsCallbacks::new_session);
  if (!options.insecure) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    bool loaded = options.ca_file.empty()
                      ? SSL_CTX_set_default_verify_paths(ctx) == 1
                      : SSL_CTX_load_verify_locations(ctx, options.ca_file.c_str(), nullptr) == 1;
    if (!loaded) {
      return std::unexpected((options.ca_file.empty() ? "system CA store" : options.ca_file) +
                             ": " + openssl_message());
    }
  }
  if (!options.alpn.empty()) {
    auto wire = alpn_wire(options.alpn);
    if (!wire) return std::unexpected(wire.error());
    // Note: 0 means success here.
    if (SSL_CTX_set_alpn_protos(ctx, reinterpret_cast<const unsigned char*>(wire->data()),
                                static_cast<unsigned int>(wire->size())) != 0) {
      return std::unexpected(openssl_message());
    }
  }
  self->identity_ = client_identity(options);
  self->options_ = std::move(options);
  return self;
}

TlsClientContext::~TlsClientContext() {
  for (auto& [name, session] : sessions_) SSL_SESSION_free(session);
  SSL_CTX_free(ctx_);
}

void TlsClientContext::resume(SSL* ssl, const std::string& name) const {
  std::lock_guard lock(sessions_lock_);
  auto it = sessions_.find(name);
  if (it != sessions_.end()) SSL_set_session(ssl, it->second);
}

// ---- stream ----------------------------------------------------------------------------------

TlsStream::TlsStream(TlsStream&& other) noexcept
    : tcp_(std::move(other.tcp_)),
      ssl_(std::exchange(other.ssl_, nullptr)),
      ahead_(std::move(other.ahead_)),
      ahead_begin_(std::exchange(other.ahead_begin_, 0)),
      ahead_end_(std::exchange(other.ahead_end_, 0)),
      reads_ahead_(other.reads_ahead_),
      starved_(other.starved_),
      io_(other.io_),
      context_(std::move(other.context_)),
      peer_name_(std::move(other.peer_name_)) {
  watch_reads();
}

TlsStream& TlsStream::operator=(TlsStream&& other) noexcept {
  if (this != &other) {
    SSL_free(ssl_);
    tcp_ = std::move(other.tcp_);
    ssl_ = std::exchange(other.ssl_, nullptr);
    ahead_ = std::move(other.ahead_);
    ahead_begin_ = std::exchange(other.ahead_begin_, 0);
    ahead_end_ = std::exchange(other.ahead_end_, 0);
    reads_ahead_ = other.reads_ahead_;
    starved_ = other.starved_;
    io_ = other.io_;
    context_ = std::move(other.context_);
    peer_name_ = std::move(other.peer_name_);
    watch_reads();
  }
  return *this;
}

Result<void> TlsStream::attach(bool read_ahead) {
  if (SSL_set_fd(ssl_, tcp_.fd()) != 1) return fail(take_tls_error());
  // One socket BIO reads and writes; its callback notes what the reads and writes show.
  BIO_set_callback_ex(SSL_get_rbio(ssl_), &note_socket_read);
  if (read_ahead) {
    BIO* reader = BIO_new(ReadAheadBio::method());
    if (reader == nullptr) return fail(take_tls_error());
    BIO_set_init(reader, 1);
    SSL_set0_rbio(ssl_, reader);  // the socket BIO stays the writer
    reads_ahead_ = true;
  }
  watch_reads();
  return {};
}

void TlsStream::watch_reads() {
  if (ssl_ == nullptr) return;
  if (BIO* writer = SSL_get_wbio(ssl_)) BIO_set_callback_arg(writer, reinterpret_cast<char*>(this));
  if (BIO* reader = SSL_get_rbio(ssl_)) {
    if (reads_ahead_) {
      BIO_set_data(reader, this);
    } else {
      BIO_set_callback_arg(reader, reinterpret_cast<char*>(this));
    }
  }
}

int TlsStream::read_ahead(BIO* bio, char* out, std::size_t want, std::size_t* got) {
  BIO_clear_retry_flags(bio);
  if (ahead_begin_ == ahead_end_) {
    if (ahead_.data() == nullptr) {
      try {
        ahead_ = take_buffer();
      } catch (const std::bad_alloc&) {
        errno = ENOMEM;  // (no exception through OpenSSL's frames)
        return 0;
      }
    }
    const ssize_t n = bare_recv(tcp_.fd(), ahead_.data(), BufferPool::kBufferSize);
    if (n <= 0) {
      // Nothing now (retry when readable), the end (0), or an error (errno says which).
      const int saved = errno;
      ahead_ = {};  // back to the pool while nothing waits in it
      if (n < 0 && (saved == EAGAIN || saved == EWOULDBLOCK)) {
        tcp_.note_drained();
        BIO_set_retry_read(bio);
      }
      errno = n < 0 ? saved : 0;
      return 0;
    }
    // Short means the receive queue is empty now (TcpStream::read's rule).
    if (static_cast<std::size_t>(n) < BufferPool::kBufferSize) tcp_.note_drained();
    ahead_begin_ = 0;
    ahead_end_ = static_cast<std::uint32_t>(n);
  }
  const std::size_t n = std::min<std::size_t>(want, ahead_end_ - ahead_begin_);
  std::memcpy(out, ahead_.data() + ahead_begin_, n);
  ahead_begin_ += static_cast<std::uint32_t>(n);
  if (ahead_begin_ == ahead_end_) {
    ahead_ = {};
    ahead_begin_ = ahead_end_ = 0;
  }
  *got = n;
  return 1;
}

bool TlsStream::drained() const {
  // A record cut short (its last bytes never sent) stays in OpenSSL's buffer: a read parks on
  // the socket all the same, and the connection's timeouts must apply to that wait.
  return tcp_.drained() && (starved_ || (SSL_has_pending(ssl_) == 0 && ahead_begin_ == ahead_end_));
}

TlsStream::~TlsStream() {
  if (ssl_ != nullptr && SSL_is_init_finished(ssl_)) {
    // A connection that simply ends keeps its session resumable (OpenSSL would otherwise
    // drop a session whose connection was not shut down).
    SSL_set_shutdown(ssl_, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
  }
  SSL_free(ssl_);
}

// SSL_get_error needs this thread's error queue empty before the call. Rather than clear it
// before every read and write (hundreds of instructions each in OpenSSL 3), every path that can
// leave errors empties it: each failure here, take_tls_error, openssl_message, and the start of
// each handshake (which also guards against errors other code left).
template <typename Op>
Result<int> TlsStream::drive(Deadline deadline, Op&& op) {
  ++io_;
  for (;;) {
    int r = op();
    if (r > 0) {
      starved_ = false;  // (a handshake's last read may have taken a whole record ahead)
      return r;
    }
    int error = SSL_get_error(ssl_, r);
    switch (error) {
      case SSL_ERROR_WANT_READ:
        // Every whole record taken: what OpenSSL holds now is at most part of one.
        starved_ = true;
        if (auto ec = tcp_.wait(IoDirection::kRead, deadline)) return fail(ec);
        continue;
      case SSL_ERROR_WANT_WRITE:
        if (auto ec = tcp_.wait(IoDirection::kWrite, deadline)) return fail(ec);
        continue;
      case SSL_ERROR_ZERO_RETURN:
        ERR_clear_error();
        return 0;
      case SSL_ERROR_SYSCALL:
        if (errno != 0) {
          int saved = errno;
          ERR_clear_error();
          return fail(errno_code(saved));
        }
        return fail(take_tls_error());
      default:
        return fail(take_tls_error());
    }
  }
}

Result<void> TlsStream::handshake(Deadline deadline) {
  ERR_clear_error();
  auto done = drive(deadline, [&] {
    errno = 0;
    return SSL_do_handshake(ssl_);
  });
  if (!done) return fail(done.error());
  if (*done == 0) return fail(make_error_code(Errc::kEndOfStream));  // closed during it
  return {};
}

Result<TlsStream> TlsStream::accept(TcpStream stream,
                                    std::shared_ptr<const TlsServerContext> context,
                                    Deadline deadline) {
  SSL* ssl = SSL_new(context->default_context());
  if (ssl == nullptr) return fail(take_tls_error());
  TlsStream tls(std::move(stream), ssl);
  tls.context_ = std::move(context);
  if (auto attached = tls.attach(); !attached) return fail(attached.error());
  SSL_set_accept_state(ssl);
  if (auto done = tls.handshake(deadline); !done) return fail(done.error());
  return tls;
}

Result<TlsStream> TlsStream::connect(TcpStream stream,
                                     std::shared_ptr<const TlsClientContext> context,
                                     std::string_view server_name, Deadline deadline) {
  SSL* ssl = SSL_new(context->native());
  if (ssl == nullptr) return fail(take_tls_error());
  TlsStream tls(std::move(stream), ssl);
  bool verify = !context->options().insecure;
  if (auto attached = tls.attach(/*read_ahead=*/true); !attached) return fail(attached.error());
  tls.peer_name_ = std::make_unique<std::string>(server_name);
  const std::string& name = *tls.peer_name_;
  SSL_set_app_data(ssl, name.c_str());  // for the new-session callback
  context->resume(ssl, name);
  tls.context_ = std::move(context);
  bool ip = is_ip_literal(name);
  if (!name.empty() && !ip) SSL_set_tlsext_host_name(ssl, name.c_str());
  if (verify && !name.empty()) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                : X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size());
    if (ok != 1) return fail(take_tls_error());
  }
  SSL_set_connect_state(ssl);
  if (auto done = tls.handshake(deadline); !done) return fail(done.error());
  return tls;
}

Result<std::size_t> TlsStream::read(std::span<char> buffer, Deadline deadline) {
  if (buffer.empty()) return 0;
  if (drained()) {  // OpenSSL would only meet EAGAIN
    if (auto ec = tcp_.wait(IoDirection::kRead, deadline)) return fail(ec);
  }
  int size = static_cast<int>(std::min<std::size_t>(buffer.size(), INT_MAX));
  auto n = drive(deadline, [&] {
    errno = 0;
    return SSL_read(ssl_, buffer.data(), size);
  });
  if (!n) return fail(n.error());
  return static_cast<std::size_t>(*n);
}

Result<void> TlsStream::write_record(std::span<const char> data, Deadline deadline) {
  while (!data.empty()) {
    int size = static_cast<int>(std::min<std::size_t>(data.size(), INT_MAX));
    auto n = drive(deadline, [&] {
      errno = 0;
      return SSL_write(ssl_, data.data(), size);
    });
    if (!n) return fail(n.error());
    if (*n == 0) return fail(std::errc::broken_pipe);
    data = data.subspan(static_cast<std::size_t>(*n));
  }
  return {};
}

Result<void> TlsStream::write_all(std::span<const char> data, Deadline deadline) {
  return write_record(data, deadline);
}

Result<std::size_t> TlsStream::writev(std::span<const iovec> buffers, Deadline deadline) {
  // Small pieces are gathered into full records in a buffer of this call's own: a write that
  // waits mid-record must find the same bytes when it resumes (OpenSSL continues from them),
  // whatever other fibers of the worker write meanwhile.
  BufferPool::Buffer staging;
  std::size_t total = 0, gathered = 0;
  for (const iovec& b : buffers) {
    std::span<const char> piece(static_cast<const char*>(b.iov_base), b.iov_len);
    total += piece.size();
    if (gathered + piece.size() <= BufferPool::kBufferSize) {
      if (!staging.data()) staging = take_buffer();
      std::copy(piece.begin(), piece.end(), staging.data() + gathered);
      gathered += piece.size();
      continue;
    }
    if (gathered > 0) {
      if (auto r = write_record({staging.data(), gathered}, deadline); !r) return fail(r.error());
      gathered = 0;
    }
    if (auto r = write_record(piece, deadline); !r) return fail(r.error());
  }
  if (gathered > 0) {
    if (auto r = write_record({staging.data(), gathered}, deadline); !r) return fail(r.error());
  }
  return total;
}

Result<std::size_t> TlsStream::sendfile(int file_fd, off_t offset, std::size_t count,
                                        Deadline deadline) {
  std::size_t sent = 0;
  if (ktls_send()) {
    while (sent < count) {
      ossl_ssize_t n = 0;
      auto r = drive(deadline, [&] {
        errno = 0;
        n = SSL_sendfile(ssl_, file_fd, offset + static_cast<off_t>(sent), count - sent, 0);
        return n > 0 ? 1 : static_cast<int>(n);
      });
      if (!r) return fail(r.error());
      if (*r == 0) break;
      sent += static_cast<std::size_t>(n);
    }
    return sent;
  }
  // Read and encrypted here, through a buffer of this call's own (see writev).
  BufferPool::Buffer chunk = take_buffer();
  while (sent < count) {
    std::size_t want = std::min(count - sent, chunk.size());
    ssize_t n = ::pread(file_fd, chunk.data(), want, offset + static_cast<off_t>(sent));
    if (n < 0) return fail_errno();
    if (n == 0) break;  // the file ended early
    if (auto r = write_record({chunk.data(), static_cast<std::size_t>(n)}, deadline); !r) {
      return fail(r.error());
    }
    sent += static_cast<std::size_t>(n);
  }
  return sent;
}

Result<void> TlsStream::shutdown(TcpStream::Shutdown how) {
  if (ssl_ != nullptr) {
    ERR_clear_error();
    (void)SSL_shutdown(ssl_);  // queues close_notify; the peer's is not awaited
    ERR_clear_error();
  }
  return tcp_.shutdown(how);
}

bool TlsStream::release_buffers() {
  // (SSL_free_buffers refuses, and keeps them, while a record is half read or half written.)
  return ssl_ == nullptr || (!has_pending() && SSL_free_buffers(ssl_) == 1);
}

void TlsStream::keep_buffers() {
  if (ssl_ != nullptr) SSL_clear_mode(ssl_, SSL_MODE_RELEASE_BUFFERS);
}

bool TlsStream::has_pending() const {
  return ssl_ != nullptr && (SSL_has_pending(ssl_) == 1 || ahead_begin_ != ahead_end_);
}

std::string_view TlsStream::alpn() const {
  const unsigned char* data = nullptr;
  unsigned int length = 0;
  if (ssl_ != nullptr) SSL_get0_alpn_selected(ssl_, &data, &length);
  return data == nullptr ? std::string_view()
                         : std::string_view(reinterpret_cast<const char*>(data), length);
}

std::string_view TlsStream::server_name() const {
  const char* name =
      ssl_ == nullptr ? nullptr : SSL_get_servername(ssl_, TLSEXT_NAMETYPE_host_name);
  return name == nullptr ? std::string_view() : std::string_view(name);
}

bool TlsStream::session_reused() const { return ssl_ != nullptr && SSL_session_reused(ssl_) == 1; }

bool TlsStream::ktls_send() const {
  return ssl_ != nullptr && BIO_get_ktls_send(SSL_get_wbio(ssl_)) == 1;
}

std::string_view TlsStream::version() const { return ssl_ == nullptr ? "" : SSL_get_version(ssl_); }

}  // namespace spindle
