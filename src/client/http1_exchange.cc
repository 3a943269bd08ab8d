// The HTTP/1.1 exchange: the request head written in one pass, the body as given (sized or
// chunked), the response parsed from reads of the connection as they come.
#include "http1_exchange.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <charconv>
#include <cstring>

#include "spindle/base/block_cache.h"
#include "spindle/fiber/worker.h"
#include "spindle/h1/chunked.h"
#include "spindle/h1/head_writer.h"
#include "spindle/http/rules.h"
#include "spindle/http/status.h"

namespace spindle::http::detail {

namespace {

constexpr std::size_t kReadChunk = 16 * 1024;

class Http1Exchange final : public ClientExchange, public PermitHolder, public BlockCached {
 public:
  Http1Exchange(std::shared_ptr<TargetState> target, Stream stream, bool reused,
                const ClientRequestHead& head, std::string_view authority,
                const ExchangeTimeouts& timeouts, Permit permit = {})
      : permit_(std::move(permit)),
        target_(std::move(target)),
        stream_(std::move(stream)),
        timeouts_(timeouts),
        head_request_(head.method == "HEAD"),
        connect_request_(head.method == "CONNECT") {
    reused_ = reused;
    ++target_->connections;
    leave();  // its caller has it now
    // A head with an Upgrade field asks to switch protocols: it goes with `Connection:
    // upgrade`, written here (a Connection field of the head only names fields not to send).
    auto upgrade = head.headers.get(token::kUpgrade);
    bool upgrading = upgrade.has_value();
    if (head.chunked) {
      mode_ = BodyMode::kChunked;
    } else if (head.content_length) {
      mode_ = BodyMode::kLength;
      body_left_ = *head.content_length;
    }
    // The head is written in one pass into room for its longest form, then cut to size.
    constexpr std::size_t kFixed = 128;  // request line and Host punctuation, framing, ends
    std::size_t room = kFixed + head.method.size() + head.target.size() + authority.size() +
                       (upgrading ? upgrade->size() : 0);
    for (const Field& f : head.headers) room += f.name.size() + f.value.size() + 4;
    NominatedFields nominated(head.headers);
    out_.resize_and_overwrite(room, [&](char* begin, std::size_t) {
      HeadWriter w{begin};
      w.put(head.method);
      w.put(" ");
      w.put(head.target);
      w.put(" HTTP/1.1\r\n");
      w.field("Host", authority);
      for (const Field& f : head.headers) {
        if (forwardable(f, nominated, FieldsFor::kRequest)) w.field(f.name, f.value);
      }
      // An upgrade (WebSocket) keeps its Upgrade and Connection fields: they are the request.
      if (upgrading) {
        w.field("Connection", "upgrade");
        w.field("Upgrade", *upgrade);
      }
      if (mode_ == BodyMode::kChunked) {
        w.field("Transfer-Encoding", "chunked");
      } else if (mode_ == BodyMode::kLength) {
        w.put("Content-Length: ");
        w.number(*head.content_length);
        w.put("\r\n");
      }
      w.put("\r\n");
      return static_cast<std::size_t>(w.at - begin);
    });
  }

  ~Http1Exchange() override { end(); }

  void preempt() override {
    preempted_ = true;
    if (!reusable()) cancel();
    end();  // a complete exchange's connection goes back to the pool
  }

  Result<void> write(std::string_view data) override {
    Call call(*this);
    if (cancelled_) return fail(cancel_reason());
    if (data.empty()) return {};
    if (request_done_) return fail(std::errc::invalid_argument);  // the request has ended
    if (mode_ == BodyMode::kNone || (mode_ == BodyMode::kLength && data.size() > body_left_)) {
      broken_ = true;
      return fail(std::errc::invalid_argument);  // more body than the head announced
    }
    char size[24];
    std::size_t size_length = 0;
    if (mode_ == BodyMode::kChunked) {
      size_length = fmt::format_to_n(size, sizeof size, "{:x}\r\n", data.size()).size;
    }
    iovec parts[4];
    std::size_t n = 0;
    if (!head_sent_) parts[n++] = {out_.data(), out_.size()};
    if (size_length != 0) parts[n++] = {size, size_length};
    parts[n++] = {const_cast<char*>(data.data()), data.size()};
    if (mode_ == BodyMode::kChunked) parts[n++] = {const_cast<char*>("\r\n"), 2};
    if (auto sent = send({parts, n}); !sent) return sent;
    if (mode_ == BodyMode::kLength) body_left_ -= data.size();
    return {};
  }

  Result<void> finish(const HeaderMap* trailers) override {
    Call call(*this);
    if (cancelled_) return fail(cancel_reason());
    if (request_done_) return {};
    if (mode_ == BodyMode::kLength && body_left_ != 0) {
      broken_ = true;
      return fail(std::errc::invalid_argument);  // less body than announced
    }
    std::string tail;
    if (mode_ == BodyMode::kChunked) {
      tail = "0\r\n";
      if (trailers != nullptr) {
        for (const Field& f : *trailers) {
          if (is_trailer_sendable(f.name, f.value)) {
            tail.append(f.name).append(": ").append(f.value) += "\r\n";
          }
        }
      }
      tail += "\r\n";
    }
    iovec parts[2];
    std::size_t n = 0;
    if (!head_sent_) parts[n++] = {out_.data(), out_.size()};
    if (!tail.empty()) parts[n++] = {tail.data(), tail.size()};
    // A request that is its head alone goes with the others of the round (queue_head).
    if (n == 1 && tail.empty() && mode_ == BodyMode::kNone && queue_head()) n = 0;
    if (n != 0) {
      if (auto sent = send({parts, n}); !sent) return sent;
    }
    request_done_ = true;
    return {};
  }

  Result<bool> await_continue(std::chrono::milliseconds wait) override {
    Call call(*this);
    if (have_head_) return false;
    if (auto sent = send_head(); !sent) return fail(sent.error());
    Deadline deadline = Deadline::after_coarse(std::min(wait, timeouts_.first_byte));
    ResponseParser parser(kResponseHeadLimits);
    ResponseHead head;
    for (;;) {
      auto consumed = buffered_head(parser, head);
      if (!consumed) return fail(consumed.error());
      if (*consumed != 0) {
        if (head.status >= 200 || head.status == 101) return false;  // read_head takes it
        in_begin_ += *consumed;
        if (head.status == 100) return true;
        pass_interim(head);
        continue;
      }
      auto more = read_more(deadline, true, /*soft_timeout=*/true);
      if (!more && more.error() == std::errc::timed_out) return true;  // silence: go on
      if (!more) return fail(more.error());
    }
  }

  Result<const ClientResponseHead*> read_head() override {
    Call call(*this);
    if (have_head_) return &response_;
    if (!head_sent_ && !broken_) {
      if (auto sent = send_head(); !sent) return fail(sent.error());
      request_done_ = mode_ == BodyMode::kNone;  // a request without a body is complete
    }
    Deadline deadline = Deadline::after_coarse(timeouts_.first_byte);
    ResponseParser parser(kResponseHeadLimits);
    ResponseHead head;
    std::string_view parsed_from;  // the bytes the final head was parsed from
    for (;;) {
      auto consumed = buffered_head(parser, head);
      if (!consumed) return fail(consumed.error());
      if (*consumed != 0) {
        if (head.status < 200 && head.status != 101) {
          pass_interim(head);
          in_begin_ += *consumed;  // an interim answer: the final one follows
          continue;
        }
        parsed_from = std::string_view(in_).substr(in_begin_, *consumed);
        head_bytes_.assign(parsed_from);
        in_begin_ += *consumed;
        break;
      }
      if (auto more = read_more(deadline, true); !more) return fail(more.error());
    }
    // The head's views point into the read buffer, which the body will reuse: the fields are
    // kept as views into the copy the exchange keeps (same offsets).
    response_.status = head.status;
    response_.version = head.minor_version == 0 ? 10 : 11;
    auto kept = [&](std::string_view v) {
      return v.empty()
                 ? v
                 : std::string_view(head_bytes_)
                       .substr(static_cast<std::size_t>(v.data() - parsed_from.data()), v.size());
    };
    for (const Field& f : head.headers) {
      response_.headers.add_view({kept(f.name), kept(f.value), f.token});  // (its token kept)
    }
    framing_ = head.framing;  // as the parser read it: the answer to a GET
    keep_alive_ = head.keep_alive;
    if (opens_tunnel(head.status, connect_request_)) {
      framing_.kind = BodyFraming::Kind::kTunnel;
    } else if (head_request_) {
      framing_.kind = BodyFraming::Kind::kNone;
    }
    response_.no_body = framing_.kind == BodyFraming::Kind::kNone;
    if (framing_.kind == BodyFraming::Kind::kLength) {
      response_.content_length = framing_.length;
      body_left_in_ = framing_.length;
    } else if (head_request_) {
      response_.content_length = head.content_length;  // what the GET would have had
    }
    if (framing_.kind == BodyFraming::Kind::kChunked) decoder_ = ChunkedDecoder();
    // A body of length 0 is complete with the head (a read must not wait for bytes).
    response_done_ = framing_.kind == BodyFraming::Kind::kNone ||
                     (framing_.kind == BodyFraming::Kind::kLength && framing_.length == 0);
    have_head_ = true;
    return &response_;
  }

  Result<std::size_t> read(std::span<char> buffer) override {
    Call call(*this);
    auto n = read_body(buffer);
    // At the body's end a reusable connection goes back to the pool now, and the permit to
    // the next request: not when the caller has relayed the last piece and let the exchange go.
    if (n && *n == 0 && response_done_ && reusable()) end();
    return n;
  }

  // An HTTP/1.1 upstream's trailers are read past (ChunkedDecoder checks and skips them), not
  // kept: none to hand on, and no map in every exchange for them.
  const HeaderMap& trailers() const override {
    static const HeaderMap none;
    return none;
  }

  void cancel() override {
    if (cancelled_) return;
    cancelled_ = true;
    broken_ = true;
    withdraw_head();  // (nothing of it went)
    // (Once ended, the connection is another exchange's, or closing with this one.)
    if (!ended_) (void)stream_.shutdown(TcpStream::Shutdown::kBoth);  // wakes a fiber on it
  }

  Result<Stream> take_connection(std::string& early) override {
    if (!have_head_ || framing_.kind != BodyFraming::Kind::kTunnel) {
      return fail(std::errc::invalid_argument);
    }
    early.assign(std::string_view(in_).substr(in_begin_));
    broken_ = true;  // the connection leaves the pool for good
    tunnel_ = true;  // and a tunnel is not a stalled exchange: never preempted
    target_->came_back(*this);
    return std::move(stream_);
  }

 private:
  enum class BodyMode { kNone, kLength, kChunked };

  Result<std::size_t> read_body(std::span<char> buffer) {
    if (!have_head_) {
      if (auto head = read_head(); !head) return fail(head.error());
    }
    if (cancelled_) return fail(cancel_reason());
    if (response_done_ || buffer.empty()) return 0;
    Deadline deadline = Deadline::after_coarse(timeouts_.read);
    switch (framing_.kind) {
      case BodyFraming::Kind::kLength: {
        std::size_t want = std::min<std::uint64_t>(buffer.size(), body_left_in_);
        std::size_t n = take_buffered(buffer.first(want));
        if (n == 0) {
          auto got = stream_.read(buffer.first(want), deadline);
          if (!got) return fail(read_error(got.error(), false));
          if (*got == 0) return fail(cut());
          n = *got;
        }
        body_left_in_ -= n;
        if (body_left_in_ == 0) response_done_ = true;
        return n;
      }
      case BodyFraming::Kind::kChunked:
        for (;;) {
          if (!pending_.empty()) {
            std::size_t n = std::min(buffer.size(), pending_.size());
            std::memcpy(buffer.data(), pending_.data(), n);
            pending_.remove_prefix(n);
            return n;
          }
          auto step = decoder_.next(std::string_view(in_).substr(in_begin_));
          if (step.kind == ChunkedDecoder::Step::Kind::kError) {
            broken_ = true;
            return fail(make_error_code(ExchangeErrc::kProtocolError));
          }
          in_begin_ += step.consumed;
          if (step.kind == ChunkedDecoder::Step::Kind::kData) {
            pending_ = step.data;  // a view into in_, which stays put until handed out
            continue;
          }
          if (step.kind == ChunkedDecoder::Step::Kind::kDone) {
            response_done_ = true;
            return 0;
          }
          if (auto more = read_more(deadline, false); !more) return fail(more.error());
        }
      case BodyFraming::Kind::kUntilClose: {
        keep_alive_ = false;
        std::size_t n = take_buffered(buffer);
        if (n != 0) return n;
        auto got = stream_.read(buffer, deadline);
        if (!got) return fail(read_error(got.error(), false));
        if (*got == 0) response_done_ = true;
        return *got;
      }
      case BodyFraming::Kind::kNone:
      case BodyFraming::Kind::kTunnel:
        return 0;
    }
    return 0;
  }

  /// One call of the caller's: the exchange is not away from it meanwhile.
  class Call {
   public:
    explicit Call(Http1Exchange& exchange) : exchange_(exchange) {
      exchange_.target_->came_back(exchange_);
    }
    ~Call() { exchange_.leave(); }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    Http1Exchange& exchange_;
  };

  /// Its caller is away from it from now: preemptible, while it holds a permit.
  void leave() {
    if (permit_.held() && !tunnel_) target_->went_away(*this, Worker::last_poll_time());
  }

  /// The exchange is over for the pool: the connection back (if reusable, else closed), the
  /// permit back to the next request waiting. Once: at the body's end, at a preemption, or
  /// when it goes.
  void end() {
    if (ended_) return;
    ended_ = true;
    if (withdraw_head() && !cancelled_) {
      // Let go with its head still queued: it goes now, as far as the socket takes it (the
      // request was finished; the connection closes, its answer unread).
      write_queued_head(queued_head_);
    }
    target_->came_back(*this);
    --target_->connections;
    if (reusable()) target_->put_idle(std::move(stream_));
    permit_.reset();  // after the connection: a request waiting for a permit finds it idle
  }

  std::error_code cancel_reason() const {
    return make_error_code(preempted_ ? ExchangeErrc::kPreempted : ExchangeErrc::kCancelled);
  }

  bool reusable() const {
    return !broken_ && !cancelled_ && request_done_ && response_done_ && keep_alive_ &&
           framing_.kind != BodyFraming::Kind::kTunnel && in_begin_ == in_.size();
  }

  Result<void> send(std::span<const iovec> parts) {
    const std::uint64_t before = stream_.bytes_sent();
    auto sent = stream_.writev(parts, Deadline::after_coarse(timeouts_.write));
    if (!sent) {
      broken_ = true;
      if (cancelled_) return fail(cancel_reason());
      if (sent.error() == std::errc::timed_out)
        return fail(make_error_code(ExchangeErrc::kWriteTimeout));
      // Nothing of this request reached the upstream only if its first write failing (reset,
      // broken pipe: the upstream had closed) took no byte at all. A write that took some and
      // then failed may have delivered them: only an idempotent request may go again then.
      bool reached = head_sent_ || stream_.bytes_sent() != before;
      return fail(make_error_code(reached ? ExchangeErrc::kClosedBeforeResponse
                                          : ExchangeErrc::kClosedBeforeWrite));
    }
    head_sent_ = true;
    return {};
  }

  // Reads more response bytes onto in_. While waiting for the head, a close or reset before
  // any response byte says whether the request went out.
  // Reads more of the response onto in_. A timeout breaks the exchange unless `soft_timeout`
  // (then it is plain std::errc::timed_out, and the exchange goes on).
  Result<void> read_more(Deadline deadline, bool for_head, bool soft_timeout = false) {
    if (in_begin_ == in_.size()) {
      in_.clear();
      in_begin_ = 0;
      pending_ = {};
    } else if (in_begin_ > kReadChunk && pending_.empty()) {
      in_.erase(0, in_begin_);
      in_begin_ = 0;
    }
    // Reads straight onto the end of in_, without zeroing the room first. The new bytes go
    // where the old ones end: never derive that from the size resize_and_overwrite passes to
    // its callback, which libstdc++ 12 gives as the grown capacity, not the size asked for.
    Result<std::size_t> n = 0;
    for (;;) {
      if (head_short_) {
        if (auto sent = settle_head(); !sent) return sent;
      }
      const std::size_t at = in_.size();
      in_.resize_and_overwrite(at + kReadChunk, [&](char* data, std::size_t) {
        n = stream_.read({data + at, kReadChunk}, deadline);
        return at + (n ? *n : 0);
      });
      if (!queued_head_.queued && !head_short_) break;
      // The head had not all gone when the read came back: it goes first (so an answer is
      // never taken for this request's before the request went). If the worker's write of it
      // stopped short, that woke this read: it reads again once the rest is written.
      const bool woken_for_rest = head_short_ && !n && n.error() == std::errc::operation_canceled;
      if (auto sent = settle_head(); !sent) return sent;
      if (!woken_for_rest) break;
    }
    if (!n && soft_timeout && n.error() == std::errc::timed_out && !cancelled_) {
      return fail(std::errc::timed_out);
    }
    if (!n) return fail(read_error(n.error(), for_head));
    if (*n == 0) {
      broken_ = true;
      if (cancelled_) return fail(cancel_reason());
      if (!got_response_byte_) return fail(make_error_code(ExchangeErrc::kClosedBeforeResponse));
      return fail(for_head ? make_error_code(ExchangeErrc::kProtocolError) : cut());
    }
    got_response_byte_ = true;
    return {};
  }

  std::error_code read_error(std::error_code ec, bool for_head) {
    broken_ = true;
    if (cancelled_) return cancel_reason();
    if (ec == std::errc::timed_out) {
      return make_error_code(got_response_byte_ ? ExchangeErrc::kReadTimeout
                                                : ExchangeErrc::kFirstByteTimeout);
    }
    if (!got_response_byte_) return make_error_code(ExchangeErrc::kClosedBeforeResponse);
    return for_head ? make_error_code(ExchangeErrc::kProtocolError) : cut();
  }

  // Leaves the head of a request without a body to the worker, to be written at the end of
  // the current round of fibers (Worker::at_round_end) with the requests the other fibers of
  // the round make: a round of proxied requests costs one run of the kernel's send path in a
  // row instead of one between each request's own work. Plain TCP only (OpenSSL writes a TLS
  // stream, from a fiber). Until written, the exchange's next read settles it (settle_head).
  bool queue_head() {
    Worker* worker = Worker::current();
    if (worker == nullptr || stream_.tcp() == nullptr || head_sent_ || broken_) return false;
    queued_head_.run = &write_queued_head;
    queued_head_.exchange = this;
    worker->at_round_end(queued_head_);
    return true;
  }

  // The worker's write of a queued head, without waiting. What the socket does not take now
  // (all of it, on an error) stays in out_, and the fiber parked for the answer is woken to
  // write it itself: waiting for the socket, and telling whether any of the request went.
  static void write_queued_head(RoundEndTask& task) {
    Http1Exchange& x = *static_cast<QueuedHead&>(task).exchange;
    TcpStream& tcp = *x.stream_.tcp();
    const std::size_t written = tcp.write_now(x.out_);
    if (written > 0) x.head_sent_ = true;
    if (written == x.out_.size()) return;
    x.out_.erase(0, written);
    x.head_short_ = true;
    tcp.cancel_waits();
  }

  // True if the head was still queued (it is not any more).
  bool withdraw_head() {
    if (!queued_head_.queued) return false;
    Worker::current()->withdraw(queued_head_);
    return true;
  }

  // Writes what the worker did not of a queued head: all of it if the round has not ended
  // (the exchange's read came back first), the rest if the worker's write stopped short.
  Result<void> settle_head() {
    if (!withdraw_head() && !head_short_) return {};
    head_short_ = false;
    iovec part{out_.data(), out_.size()};
    return send({&part, 1});
  }

  // Sends the request head alone, unless it (or anything) went already or is queued.
  Result<void> send_head() {
    if (head_sent_ || broken_ || queued_head_.queued) return {};
    iovec part{out_.data(), out_.size()};
    return send({&part, 1});
  }

  // Parses a response head from the bytes buffered: how many it took (0: not whole yet), or
  // kProtocolError (the exchange is then broken).
  Result<std::size_t> buffered_head(ResponseParser& parser, ResponseHead& head) {
    auto parsed = parser.parse(std::string_view(in_).substr(in_begin_), head);
    if (parsed.state == ParseResult::State::kError) {
      broken_ = true;
      return fail(make_error_code(ExchangeErrc::kProtocolError));
    }
    return parsed.state == ParseResult::State::kComplete ? parsed.consumed : 0;
  }

  // An interim head read off the connection, to the on_informational callback.
  void pass_interim(const ResponseHead& head) {
    if (!informational_ || head.status == 100) return;
    ClientResponseHead interim;
    interim.status = head.status;
    interim.version = head.minor_version == 0 ? 10 : 11;
    for (const Field& f : head.headers) interim.headers.add_view(f);
    interim.no_body = true;
    informational(interim);
  }

  std::error_code cut() {
    broken_ = true;
    return cancelled_ ? cancel_reason() : make_error_code(ExchangeErrc::kResponseCut);
  }

  std::size_t take_buffered(std::span<char> buffer) {
    std::size_t n = std::min(buffer.size(), in_.size() - in_begin_);
    std::memcpy(buffer.data(), in_.data() + in_begin_, n);
    in_begin_ += n;
    return n;
  }

  /// Given back by end(), after the connection.
  Permit permit_;
  std::shared_ptr<TargetState> target_;
  Stream stream_;
  ExchangeTimeouts timeouts_;
  bool head_request_;
  bool connect_request_;
  /// The request: its head (until sent), body framing and what is left of a sized body.
  BlockString out_;
  BodyMode mode_ = BodyMode::kNone;
  std::uint64_t body_left_ = 0;
  /// Set once any of the request went (so a failure later may have reached the upstream).
  bool head_sent_ = false;
  /// The head while the worker holds it for the end of the round (queue_head).
  struct QueuedHead : RoundEndTask {
    Http1Exchange* exchange = nullptr;
  } queued_head_;
  /// The worker's write of the queued head stopped short: out_ holds the rest, for the
  /// exchange to write itself (settle_head).
  bool head_short_ = false;
  bool request_done_ = false;
  /// The response: bytes read ([in_begin_, end) not yet used), the head's own bytes, the head.
  /// The read buffer (16 KiB a read) and the head's copy come from the block cache: an
  /// exchange per request.
  BlockString in_;
  std::size_t in_begin_ = 0;
  BlockString head_bytes_;
  ClientResponseHead response_;
  bool have_head_ = false;
  bool got_response_byte_ = false;
  BodyFraming framing_;
  std::uint64_t body_left_in_ = 0;
  ChunkedDecoder decoder_;
  std::string_view pending_;
  bool response_done_ = false;
  bool keep_alive_ = true;
  /// Set once the connection cannot carry another exchange.
  bool broken_ = false;
  bool cancelled_ = false;
  /// Given up to a waiting request (cancelled_ too, unless it was complete).
  bool preempted_ = false;
  /// Its connection became a tunnel (take_connection).
  bool tunnel_ = false;
  /// end() has run.
  bool ended_ = false;
};

}  // namespace

std::unique_ptr<ClientExchange> start_http1_exchange(
    std::shared_ptr<TargetState> target, Stream stream, bool reused, const ClientRequestHead& head,
    std::string_view authority, const ExchangeTimeouts& timeouts, Permit permit) {
  return std::make_unique<Http1Exchange>(std::move(target), std::move(stream), reused, head,
                                         authority, timeouts, std::move(permit));
}

}  // namespace spindle::http::detail
