#pragma once
/// Request, Response and HttpError: what a handler sees and returns.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spindle/base/block_cache.h"
#include "spindle/h1/parser.h"
#include "spindle/http/header_map.h"
#include "spindle/io/deadline.h"
#include "spindle/io/unique_fd.h"
#include "spindle/net/address.h"
#include "spindle/net/stream.h"

namespace spindle::http {

/// Where a request body comes from while the handler reads it: the protocol driver, which
/// reads it off the connection only as the handler asks (so `Expect: 100-continue` is
/// answered only when the body is wanted, and a large body never has to sit in memory).
class BodySource {
 public:
  virtual ~BodySource() = default;
  /// Reads up to `buffer.size()` bytes of the body; 0 at its end. Throws HttpError when the
  /// body cannot be had: 413 over the size limit, 400 malformed or cut short, 408 too slow.
  virtual std::size_t read(std::span<char> buffer) = 0;
};

/// Where a handler's interim (1xx) responses go: the protocol driver of its request.
class InterimSink {
 public:
  virtual ~InterimSink() = default;
  /// Sends an interim response, `status` (100, or 102-199) with `fields`, now, ahead of the
  /// final one. False if the client cannot take it (HTTP/1.0; a 100 it does not wait for) or
  /// the connection failed.
  virtual bool send_interim(int status, const HeaderMap& fields) = 0;
};

/// What a request arrived on, for handlers and middleware: filled by the server's protocol
/// drivers. The views stay valid until the handler returns.
struct RequestContext {
  /// The client's address as text: "192.0.2.1", "2001:db8::1" (no brackets, no port), or "-".
  std::string_view remote = "-";
  /// The client's address and the server's own address the connection came to (nullptr if
  /// unknown).
  const Address* peer = nullptr;
  const Address* local = nullptr;
  /// True over TLS ("https"), false in cleartext ("http").
  bool tls = false;
  /// 1 for HTTP/1.x, 2 for HTTP/2.
  int major_version = 1;
  /// The name the client asked for by SNI, and the protocol ALPN chose ("" if none).
  std::string_view server_name;
  std::string_view alpn;
  /// When the request's head was complete.
  Clock::time_point started{};
};

/// Who can say what a request arrived on: the protocol drivers, asked only when a handler
/// wants to know (the lookups cost system calls a plain request does without).
class ContextSource {
 public:
  virtual ~ContextSource() = default;
  /// The facts of the connection, looked up on first use.
  virtual const RequestContext& request_context() = 0;
};

/// What Request::on_client_gone runs. Move-only: a callback holding a smart pointer (a
/// gateway's upstream exchange, as a weak_ptr) stays inline, where a std::function would
/// allocate for it on every request.
using ClientGone = std::move_only_function<void()>;

/// One request as a handler sees it. The views stay valid until the handler returns.
class Request {
 public:
  /// A request over a parsed head (which it refers to) and its complete body.
  Request(const RequestHead& head, std::string body);
  /// A request whose body is read from `source` as the handler asks for it.
  Request(const RequestHead& head, BodySource& source);

  /// The method, e.g. "GET" (a HEAD request is seen as HEAD; the router also runs GET routes
  /// for it and the server drops the body).
  std::string_view method() const { return head_->method; }
  /// The request target: in the server's requests the canonical one (http/canonical.h),
  /// origin-form with its path normalised ("*" for OPTIONS, host:port for CONNECT).
  std::string_view target() const { return head_->target; }
  /// The authority the request is for, host[:port], validated; "" if it names none. In the
  /// server's requests the canonical one: from an absolute-form target, :authority or Host,
  /// which never differ.
  std::string_view authority() const { return head_->authority; }
  /// The path part of the target (still percent-encoded); "/" for "*" and authority forms.
  std::string_view path() const { return path_; }
  /// The query after '?', without it ("" if none).
  std::string_view query() const { return query_; }
  /// 0 for HTTP/1.0, 1 for HTTP/1.1.
  int minor_version() const { return head_->minor_version; }
  /// The header fields.
  const HeaderMap& headers() const { return head_->headers; }
  /// The parsed head: framing (content_length, chunked for a body of unknown length) too.
  const RequestHead& head() const { return *head_; }
  /// The first value of a header field, or "".
  std::string_view header(std::string_view name) const { return headers().get(name).value_or(""); }
  std::string_view header(const Token& name) const { return headers().get(name).value_or(""); }
  /// The whole body, read on the first call (so it may throw as `read` does); read() returns 0
  /// after it. After earlier `read` calls it holds only what they had not yet returned. Memory
  /// grows with the bytes received (kBodyStep at a time), never with the announced length.
  const std::string& body();
  /// How far body() reads ahead of what has arrived.
  static constexpr std::size_t kBodyStep = 64 * 1024;
  /// Streams the body: reads up to `buffer.size()` bytes, 0 at the end. Throws HttpError
  /// (413, 400, 408) when the body is over the server's limit, malformed or too slow; the
  /// server then answers with that status unless the handler catches it.
  std::size_t read(std::span<char> buffer);

  /// The connection the request arrived on (defaults when the server cannot say).
  const RequestContext& context() const {
    if (context_ == nullptr)
      context_ = source_of_context_ ? &source_of_context_->request_context() : &kNoContext;
    return *context_;
  }
  /// Says who provides the context (the server's drivers do; it must outlive the request).
  void set_context_source(ContextSource* source) {
    source_of_context_ = source;
    context_ = nullptr;
  }

  /// Asks to be told when the client goes away before the response is complete (an HTTP/2
  /// RST_STREAM; on HTTP/1.1 a FIN or reset while the handler runs, as nginx takes it):
  /// `callback` then runs on the request's worker, outside the handler's fiber, so that a wait
  /// on its behalf (an upstream exchange) can be cancelled. One callback per request; the last
  /// one set counts. Once the response is being sent, a gone client shows as a failed write.
  void on_client_gone(ClientGone callback) {
    if (gone_ != nullptr) *gone_ = std::move(callback);
  }
  /// Where on_client_gone keeps its callback (the driver's; nullptr: not supported).
  void set_client_gone_slot(ClientGone* slot) { gone_ = slot; }

  /// Sends an interim response ahead of the final one: 103 Early Hints, say. A 100 Continue
  /// goes only to a request that expects one, before its body is read (the server sends a bare
  /// one when the body is first read otherwise); 101 is a final response here. Fields that may
  /// not be sent, and those a final head would not send (hop-by-hop, framing), are left out.
  /// False if the client cannot take one (HTTP/1.0, no driver to send it, a 100 not owed) or
  /// the connection failed.
  bool send_interim(int status, const HeaderMap& fields) {
    if (interim_ == nullptr || status >= 200 || status == 101) return false;
    if (status < 100 || (status == 100 && !head().expect_continue)) return false;
    return interim_->send_interim(status, fields);
  }
  /// Says where send_interim goes (the server's drivers do; it must outlive the request).
  void set_interim_sink(InterimSink* sink) { interim_ = sink; }

  /// Per-request attributes, for middleware to pass facts along (a route name, a user id).
  /// The access log writes them all, except those whose name starts with '_'.
  void set_attribute(std::string_view name, std::string_view value);
  /// An attribute's value, or "".
  std::string_view attribute(std::string_view name) const;
  /// Every attribute, in the order first set.
  std::span<const std::pair<std::string, std::string>> attributes() const { return attributes_; }

  /// The value of a route parameter ({name} or *name), or "".
  std::string_view param(std::string_view name) const;
  /// Sets a route parameter (the router does).
  void set_param(std::string_view name, std::string_view value);
  /// Clears the route parameters.
  void clear_params() { params_.clear(); }

 private:
  /// Sets path_ and query_ from the head's target.
  void split_target();

  /// The parsed head.
  const RequestHead* head_;
  /// The body read so far by body() (or given whole), and how much of it read() returned.
  std::string body_;
  std::size_t body_taken_ = 0;
  /// Set once body() has read the rest: read() then returns 0.
  bool whole_ = false;
  /// Where the rest of the body comes from (nullptr: body_ is all of it).
  BodySource* source_ = nullptr;
  /// Path and query split from the target.
  std::string_view path_, query_;
  /// Route parameters, in pattern order.
  std::vector<std::pair<std::string_view, std::string_view>> params_;
  /// The connection's facts.
  mutable const RequestContext* context_ = nullptr;
  ContextSource* source_of_context_ = nullptr;
  static const RequestContext kNoContext;
  /// See on_client_gone.
  ClientGone* gone_ = nullptr;
  /// See send_interim.
  InterimSink* interim_ = nullptr;
  /// See set_attribute. From the block cache: a gateway sets some on each request it forwards.
  using Attribute = std::pair<std::string, std::string>;
  std::vector<Attribute, BlockAllocator<Attribute>> attributes_;
};

/// A byte range of an open file, sent with sendfile(2) instead of a body string.
struct FileBody {
  /// The open file (shared: a file cache may keep it open for later requests).
  std::shared_ptr<const UniqueFd> fd;
  /// Where the range starts.
  std::uint64_t offset = 0;
  /// How many bytes to send.
  std::uint64_t length = 0;
};

/// Writes a streamed response body, piece by piece, as the handler produces it.
class BodyWriter {
 public:
  virtual ~BodyWriter() = default;
  /// Sends `data` now (as one chunk on HTTP/1.1). Returns false once the client is gone or too
  /// slow (the write timeout passed): the producer should stop.
  virtual bool write(std::string_view data) = 0;
  /// Trailer fields to send after the body (HTTP/2, and chunked HTTP/1.1; dropped where the
  /// body is not chunked). Call before the producer returns; the fields are copied.
  virtual void set_trailers(const HeaderMap& trailers) = 0;
};

/// Produces a streamed body; runs on the connection's fiber after the head was sent.
using BodyProducer = std::function<void(BodyWriter&)>;

/// The client's side of a tunnel, once the response that opens it is sent: an HTTP/1.1
/// connection after a 101 (or a 2xx to CONNECT), or an HTTP/2 stream after a 2xx to an
/// extended CONNECT (RFC 8441). Bytes only: no framing of its own is seen.
class TunnelEnd {
 public:
  virtual ~TunnelEnd() = default;
  /// Reads what the client sends: a count, 0 once it has finished sending (FIN, END_STREAM),
  /// or an error (reset, timed out, cancelled).
  [[nodiscard]] virtual Result<std::size_t> read(std::span<char> buffer, Deadline deadline) = 0;
  /// Sends all of `data`, waiting while the client does not take more (TCP's window, or the
  /// stream's flow-control window).
  [[nodiscard]] virtual Result<void> write(std::string_view data, Deadline deadline) = 0;
  /// This side has nothing more to send (a half-close: FIN, END_STREAM).
  virtual void close_write() = 0;
  /// Ends both directions at once, as an error (a reset, RST_STREAM).
  virtual void abort() = 0;
};

/// A TunnelEnd over a whole connection (TCP or TLS).
class StreamTunnelEnd final : public TunnelEnd {
 public:
  explicit StreamTunnelEnd(Stream& stream) : stream_(stream) {}
  Result<std::size_t> read(std::span<char> buffer, Deadline deadline) override {
    return stream_.read(buffer, deadline);
  }
  Result<void> write(std::string_view data, Deadline deadline) override {
    return stream_.write_all(data, deadline);
  }
  void close_write() override { (void)stream_.shutdown(TcpStream::Shutdown::kWrite); }
  void abort() override { (void)stream_.shutdown(TcpStream::Shutdown::kBoth); }

 private:
  Stream& stream_;
};

/// Runs a tunnel once the response that opens it is sent: gets the client's end and the bytes
/// the client sent after its request head (HTTP/1.1; "" on HTTP/2); the connection (or stream)
/// ends when it returns.
using ConnectionTakeover = std::function<void(TunnelEnd& client, std::string_view early)>;

/// A response. The server adds Date, Server, Content-Length (or Transfer-Encoding) and
/// Connection.
struct Response {
  /// The status code.
  int status = 200;
  /// Header fields set by the handler.
  HeaderMap headers;
  /// The body (ignored for HEAD requests and for 1xx/204/304).
  std::string body;
  /// If set, the body is this file range instead of `body`.
  std::optional<FileBody> file;
  /// If set, the body is streamed by this producer (chunked on HTTP/1.1 unless stream_length
  /// is known; on HTTP/1.0 the connection closes after it). Then `body`, if not empty, is the
  /// beginning of the streamed body: it goes out with the head, in one write, and the
  /// producer writes the rest.
  BodyProducer stream;
  /// With `stream`: the body's length, if known beforehand. It is announced (Content-Length,
  /// no chunks) and held to: a producer that writes more is stopped, and one that writes less
  /// (or throws) ends the connection (HTTP/1.1) or resets the stream (HTTP/2), so the client
  /// never takes a short body for a whole one.
  std::optional<std::uint64_t> stream_length;
  /// With status 101, or a 2xx answering CONNECT (HTTP/1.1) or an extended CONNECT (HTTP/2):
  /// what runs on the connection, or the stream, once the head is sent (a WebSocket tunnel, a
  /// CONNECT tunnel). Ignored otherwise.
  ConnectionTakeover takeover;

  /// Bytes of body this response carries.
  std::uint64_t body_size() const { return file ? file->length : body.size(); }

  /// An empty 200. User-provided, so that value-initializing one does not zero its 2 KiB
  /// of inline field storage first (as HeaderMap's).
  Response() {}
  /// A response with `status` and no body.
  explicit Response(int s) : status(s) {}
  /// A response with `status`, a body and its Content-Type.
  Response(int s, std::string b, std::string_view content_type) : status(s), body(std::move(b)) {
    headers.add_with_static_name("Content-Type", token::kContentType, content_type);
  }

  /// 200 with a text/plain body.
  static Response text(std::string body, int status = 200) {
    return Response(status, std::move(body), "text/plain; charset=utf-8");
  }
  /// 200 with an application/json body (already serialized).
  static Response json(std::string body, int status = 200) {
    return Response(status, std::move(body), "application/json");
  }
  /// 200 with a text/html body.
  static Response html(std::string body, int status = 200) {
    return Response(status, std::move(body), "text/html; charset=utf-8");
  }
  /// A short error page for `status` (its reason phrase, plus `detail` if given).
  static Response error(int status, std::string_view detail = {});
};

/// Thrown by a handler to answer with `status` instead of 500.
class HttpError : public std::runtime_error {
 public:
  /// An error answered with `status`; `message` goes to the log and the error page.
  HttpError(int status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  /// The status to answer with.
  int status() const { return status_; }

 private:
  /// The status.
  int status_;
};

}  // namespace spindle::http
