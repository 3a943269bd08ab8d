#pragma once
/// One HTTP/2 connection (RFC 9113), either end, pure: bytes from the peer in, events to a
/// handler, frames out into an output buffer the driver writes. Stream states, flow control
/// both ways, SETTINGS, PING, GOAWAY, header blocks across CONTINUATION, HPACK, and the checks of
/// RFC 9113 §8 on requests (ServerSession) and responses (ClientSession): a malformed message is
/// reset, the connection goes on. No I/O, no fibers.
///
/// Limits against the published attacks are the session's, whichever end the peer is: a header
/// block bounded in bytes and frames (CONTINUATION floods), the decoded header list bounded
/// (HPACK bombs), output the peer makes us queue without reading bounded (PING, SETTINGS and
/// reset floods), resets, empty frames and SETTINGS budgeted per connection (Rapid Reset and
/// the 2019 floods): past any of them, GOAWAY ENHANCE_YOUR_CALM.
///
/// A stream we reset (or refuse) is remembered until the peer has surely read the reset (it
/// answered a PING the session sends after it, or reset the stream too): what the peer sent on
/// it before is ignored (RFC 9113 §5.1), never counted as its error; its DATA counts for the
/// connection's window, and no more of it than the stream's window allowed.

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spindle/h2/frame.h"
#include "spindle/h2/hpack.h"

namespace spindle::h2 {

namespace detail {
class ResetStreams;
}

struct SessionLimits {
  /// Streams the peer may open at once (a server's SETTINGS_MAX_CONCURRENT_STREAMS).
  std::uint32_t max_concurrent_streams = 100;
  /// Our receive window per stream (SETTINGS_INITIAL_WINDOW_SIZE).
  std::uint32_t stream_window = 65535;
  /// Our receive window for the whole connection (raised by WINDOW_UPDATE at the start).
  std::uint32_t connection_window = 1 << 20;
  /// Whether the connection's window reopens as DATA arrives rather than as the driver consumes
  /// it: each stream's unread bytes then wait within its own window only. A client whose
  /// connection carries many callers' streams needs it, or a caller that reads nothing holds the
  /// connection's window and stops every other stream on it. (A server keeps the default: its
  /// connection is one client's, and the connection window bounds what that client buffers.)
  bool connection_window_on_receipt = false;
  std::uint32_t max_frame_size = kDefaultMaxFrameSize;
  std::uint32_t max_header_list_size = 65536;
  /// One header block (HEADERS and its CONTINUATIONs): bytes, and frames. Past either a
  /// server's session ends the connection (its client's only). A client's session ends it past
  /// neither: its connection carries many callers' streams, and a response head past them (an
  /// upstream reflecting a request) is one stream's error. Its block is gathered whole up to
  /// max_continuations + 1 frames of max_frame_size and decoded to keep the table in step
  /// (max_header_list_size bounds what is kept of it); past them the stream is reset at once and
  /// the rest of the block is read a frame at a time, for the table only (one representation
  /// cut by a frame's end kept between frames, at most those bytes: past them, or an error in
  /// the block, the connection ends).
  std::size_t max_header_block = 65536 + 16384;
  std::size_t max_continuations = 32;
  /// Output queued and not taken by the driver: past it the client is not reading.
  std::size_t max_output = 1 << 20;
  /// RFC 8441's SETTINGS_ENABLE_CONNECT_PROTOCOL.
  bool enable_connect_protocol = false;
  /// Resets a connection may cause beyond the streams it completes: RST_STREAM from the client
  /// (Rapid Reset, CVE-2023-44487) and the resets its errors make us send (reset flood,
  /// CVE-2019-9514). Each completed stream earns one more.
  std::size_t reset_budget = 200;
  /// Frames that carry nothing (DATA without data or END_STREAM, padded or not, empty header
  /// fragments without END_HEADERS: CVE-2019-9518), beyond the streams the connection completes.
  std::size_t empty_frame_budget = 200;
  /// SETTINGS frames per connection (settings flood, CVE-2019-9515).
  std::size_t settings_budget = 100;
};

/// What the session tells its driver. Views are valid during the call only.
/// Open streams by id, ascending, in one vector (a new stream's id is above every open one's,
/// so it goes last). Streams end roughly in the order they began: one that ends moves the fewer
/// of its older or its newer neighbours by one place (the older ones to the right, leaving a gap
/// at the front that a later addition reclaims). Adding or removing a stream moves others: hold
/// no pointer into it across a call that may (a handler's event).
template <typename T>
class StreamTableOf {
 public:
  struct Entry {
    std::uint32_t id;
    T stream;
  };
  T* find(std::uint32_t id) { return const_cast<T*>(std::as_const(*this).find(id)); }
  const T* find(std::uint32_t id) const {
    auto it = std::lower_bound(begin(), end(), id, by_id);
    return it != end() && it->id == id ? &it->stream : nullptr;
  }
  bool contains(std::uint32_t id) const { return find(id) != nullptr; }
  /// The stream `id`, added (value-initialised) if it is not there.
  T& add(std::uint32_t id) {
    if (empty() || entries_.back().id < id) {
      if (head_ > 0 && entries_.size() == entries_.capacity()) {
        // The gap at the front is reclaimed before the vector would grow.
        entries_.erase(entries_.begin(), begin());
        head_ = 0;
      }
      return entries_.emplace_back(id).stream;
    }
    auto it = std::lower_bound(begin(), end(), id, by_id);
    if (it != end() && it->id == id) return it->stream;
    return entries_.insert(it, Entry{id, {}})->stream;
  }
  /// False if `id` was not there.
  bool erase(std::uint32_t id) {
    auto it = std::lower_bound(begin(), end(), id, by_id);
    if (it == end() || it->id != id) return false;
    if (it - begin() < end() - it - 1) {
      std::move_backward(begin(), it, it + 1);  // the older ones one place right
      ++head_;
    } else {
      entries_.erase(it);
    }
    if (head_ == entries_.size()) {
      entries_.clear();
      head_ = 0;
    }
    return true;
  }
  void clear() {
    entries_.clear();
    head_ = 0;
  }
  /// Gives its memory back if it is empty.
  void trim() {
    if (empty()) {
      release(entries_);
      head_ = 0;
    }
  }
  std::size_t size() const { return entries_.size() - head_; }
  bool empty() const { return size() == 0; }
  /// The highest id (the table is not empty).
  std::uint32_t highest() const { return entries_.back().id; }
  auto begin() { return entries_.begin() + static_cast<std::ptrdiff_t>(head_); }
  auto end() { return entries_.end(); }
  auto begin() const { return entries_.begin() + static_cast<std::ptrdiff_t>(head_); }
  auto end() const { return entries_.end(); }

 private:
  static bool by_id(const Entry& entry, std::uint32_t id) { return entry.id < id; }
  /// entries_[head_, end) are the streams; those before head_ are gone.
  std::vector<Entry> entries_;
  std::size_t head_ = 0;
};

class SessionHandler {
 public:
  virtual ~SessionHandler() = default;
  /// A request's head begins (its fields follow, then on_headers).
  virtual void on_request_begin(std::uint32_t /*stream*/) {}
  /// One field of a message's (or its trailers') header block, already checked, with its
  /// name's token (views valid during the call only).
  virtual void on_field(std::uint32_t stream, const http::Field& field) = 0;
  /// Called just before on_field for a field the peer sent never indexed (RFC 7541 §6.2.3): an
  /// intermediary must send it on so.
  virtual void on_never_indexed(std::uint32_t /*stream*/, const http::Field& /*field*/) {}
  /// The block is complete; `end_stream`: no body follows; `trailers`: it was the trailers. (A
  /// client gets each interim 1xx head this way too, before the final one.)
  virtual void on_headers(std::uint32_t stream, bool end_stream, bool trailers) = 0;
  virtual void on_data(std::uint32_t stream, std::span<const std::uint8_t> data,
                       bool end_stream) = 0;
  /// The stream ended without its message complete: reset by the peer, or malformed, or (on a
  /// client) above the last stream of the server's GOAWAY (kRefusedStream: nothing of it was
  /// processed).
  virtual void on_reset(std::uint32_t stream, ErrorCode code) = 0;
  /// More may be sent on `stream` (0: on the connection) than before.
  virtual void on_window(std::uint32_t stream) = 0;
  /// The answer to a PING the driver sent (shutdown_notice); not to the session's own.
  virtual void on_ping_ack(std::span<const std::uint8_t, 8> /*payload*/) {}
  /// A request head decoded past SETTINGS_MAX_HEADER_LIST_SIZE (its fields stopped at the
  /// limit): true if the driver answers it itself (431, RFC 9113 §10.5.1), and the stream goes
  /// on as a request whose head is complete (on_headers follows); false to have it reset
  /// (REFUSED_STREAM). A client's session: a response block past what it gathers
  /// (SessionLimits::max_header_block), whose stream is then reset (PROTOCOL_ERROR, on_reset).
  virtual bool on_head_too_large(std::uint32_t /*stream*/, bool /*end_stream*/) { return false; }
  /// The peer's GOAWAY: no stream above `last_stream` was or will be processed (they are
  /// reset, on_reset, right after).
  virtual void on_goaway(std::uint32_t /*last_stream*/, ErrorCode /*code*/) {}
};

/// What both ends share; a ServerSession or a ClientSession is made.
class Session {
 public:
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session();

  /// Takes bytes from the peer (a client's preface first). False once the connection must end:
  /// a GOAWAY saying why is in the output, to be written before closing.
  bool receive(std::span<const std::uint8_t> bytes);

  /// The frames to write, taken (the session starts a new buffer). A PING goes last when a
  /// stream reset since the last one waits to learn that the peer has read its reset.
  std::string take_output();
  /// The same into `into` (cleared first), whose buffer the session keeps for its next output:
  /// two buffers take turns, and neither is allocated again.
  void take_output(std::string& into);
  std::size_t output_size() const { return out_.size(); }
  /// Gives back the memory of the buffers that hold nothing now, as an idle connection does:
  /// what remains is the connection's settings, windows and HPACK tables.
  void trim();

  /// A header block on an open stream: a response head (or an interim one), or trailers with
  /// `end_stream`.
  void submit_headers(std::uint32_t stream, std::span<const hpack::Field> fields, bool end_stream);
  /// As much of `data` as the windows allow now (all of it if they do); what was taken. With
  /// `end_stream`, the stream ends when the last byte is taken.
  std::size_t submit_data(std::uint32_t stream, std::string_view data, bool end_stream);
  /// Bytes that may be sent on `stream` now (the smaller of its window and the connection's).
  std::size_t send_window(std::uint32_t stream) const;
  /// send_window() for a connection whose streams belong to different callers: a stream
  /// sends only while what it holds of the connection's window (sent and not yet given back)
  /// stays within what the connection has left, so a stream whose reader never reads leaves
  /// the others at least as much as it holds (k such streams, at least 1/2^k of the window).
  /// What it holds is the smaller of what its own window and the connection's lack (a peer
  /// that gives back only the connection's window holds a stream to what all lack).
  std::size_t shared_send_window(std::uint32_t stream) const;
  /// The driver consumed `n` bytes of the stream's DATA: the windows reopen (in batches; the
  /// connection's already has if `connection_window_on_receipt`).
  void consumed(std::uint32_t stream, std::size_t n);
  /// Resets a stream (its handler gave up, say): what the peer sent on it before it knew is
  /// ignored, not an error.
  void reset(std::uint32_t stream, ErrorCode code);
  /// Streams reset that the peer may not know of yet (it has not answered the PING sent after
  /// their reset).
  std::size_t unacknowledged_resets() const;
  /// A request head has begun and is not whole: the connection preface, or a header block
  /// (HEADERS and its CONTINUATIONs, or a frame of one) is partly here. The driver bounds how
  /// long that may last (a slowloris holds a block's memory).
  bool head_pending() const;
  /// GOAWAY: no stream above the last one begun will be processed.
  void goaway(ErrorCode code, std::string_view debug = {});
  /// GOAWAY naming `last_stream` (at most the last one begun): the streams above it are
  /// refused by the driver, and any new one is ignored.
  void goaway(ErrorCode code, std::uint32_t last_stream, std::string_view debug = {});

  std::size_t open_streams() const { return streams_.size(); }
  /// One window both ways, as this end counts it: what it may send, what the peer may send,
  /// and what was consumed here but not yet given back (WINDOW_UPDATE goes in batches).
  struct Windows {
    std::int64_t send = 0;
    std::int64_t receive = 0;
    std::size_t unacked = 0;
  };
  /// The connection's windows (`stream` 0) or an open stream's; nullopt for a stream that is
  /// not open. (What tests and metrics look at.)
  std::optional<Windows> windows(std::uint32_t stream) const;
  /// What the connection has spent of its budgets (SessionLimits: resets, empty frames), and
  /// the streams it completed (each earns one more of each).
  struct Spent {
    std::size_t resets = 0;
    std::size_t empty_frames = 0;
    std::size_t completed = 0;
  };
  Spent spent() const { return {resets_, empty_frames_, completed_}; }
  /// The highest stream begun (by the client, whichever end we are).
  std::uint32_t last_stream_id() const { return last_stream_; }
  /// A GOAWAY went or came: no new stream will be served.
  bool closing() const { return closing_; }
  /// A connection error: its GOAWAY is in the output; the connection must end.
  bool failed() const { return failed_; }

 protected:
  enum class Role { kServer, kClient };
  Session(Role role, SessionLimits limits, SessionHandler& handler);

  struct Stream {
    enum State { kOpen, kHalfClosedRemote, kHalfClosedLocal } state = kOpen;
    std::int64_t send_window = 0;
    std::int64_t receive_window = 0;
    std::size_t unacked = 0;  ///< consumed, not yet given back by WINDOW_UPDATE
    std::int64_t content_length = -1;
    std::int64_t data_received = 0;
    bool headers_done = false;  ///< the (final) head arrived: a later block is trailers
    bool head_request = false;  ///< a client's HEAD: its response has no body, whatever it says
  };

  using StreamTable = StreamTableOf<Stream>;

  bool on_frame(const Frame& f);
  bool connection_error(ErrorCode code, std::string_view reason);
  bool on_headers(const Frame& f);
  bool end_header_block(std::span<const std::uint8_t> block);
  /// A new stream of ours (client) or the peer's (server), its head sent or received.
  Stream& add_stream(std::uint32_t id);
  bool on_data(const Frame& f);
  /// DATA on a stream that is not open: ignored if sent before the peer knew we closed it
  /// (its window counted), else a reset; false on a connection error.
  bool on_data_not_open(const Frame& f);
  /// HEADERS on a stream begun and not open: true if its block is to be read for the table
  /// alone (sent before the peer knew we closed it); false after a connection error.
  bool on_headers_not_open(const Frame& f);
  bool on_rst_stream(const Frame& f);
  bool on_ping(const Frame& f);
  bool on_settings(const Frame& f);
  /// A client's: the server's GOAWAY ends the streams above its last.
  void on_goaway(const Frame& f);
  bool on_window_update(const Frame& f);
  void stream_error(std::uint32_t id, ErrorCode code);
  /// `n` more bytes of the connection's window may be given back (WINDOW_UPDATE in batches).
  void give_back_connection_window(std::size_t n);
  /// Applies one SETTINGS payload from the client.
  std::optional<FrameError> apply_settings(std::span<const std::uint8_t> payload);
  /// A stream ends here before the peer ended it (we reset it): what the peer sent before it
  /// knew is ignored until it knows, not an error (RFC 9113 §5.1, "closed").
  void close_stream(std::uint32_t id);
  /// Remembers stream `id` as reset by us (reset_streams_): `window` of DATA and `blocks`
  /// header blocks may still come on it unless `ended`.
  bool skim_block(bool end_headers);
  void remember_reset(std::uint32_t id, std::int64_t window, std::uint8_t blocks, bool ended);
  /// Writes the PING that tells when the peer has read the resets sent so far, if one is due.
  void ping_for_resets();
  /// A GOAWAY goes or came: no new stream from here on. (A server ignores what the client
  /// sends on the streams it begins after.)
  void start_closing();
  /// Both sides ended it: it earns the connection budget.
  void complete_stream(std::uint32_t id);
  bool check_output();
  /// Counts one reset (received or caused) or empty frame against its budget.
  bool spend(std::size_t& count, std::size_t budget, std::string_view what);

  Role role_;
  SessionLimits limits_;
  SessionHandler& handler_;
  FrameReader reader_;
  hpack::Decoder decoder_;
  hpack::Encoder encoder_;
  std::string out_;
  std::size_t preface_seen_ = 0;
  bool settings_seen_ = false;
  bool closing_ = false;
  bool failed_ = false;
  StreamTable streams_;
  /// The highest stream begun; for a client, the last stream of the server's GOAWAY.
  std::uint32_t last_stream_ = 0;
  std::uint32_t goaway_last_ = kMaxWindow;
  std::uint32_t peer_max_concurrent_ = 100;
  /// The peer's SETTINGS_MAX_HEADER_LIST_SIZE (unbounded until it says one).
  std::uint32_t peer_max_header_list_ = std::numeric_limits<std::uint32_t>::max();
  /// The streams we reset that the peer may still send on. (Made by the first stream reset;
  /// most connections never need it.)
  std::unique_ptr<detail::ResetStreams> reset_streams_;
  /// A server's: the last stream begun before the connection began closing (streams above it
  /// are not served: what comes on them is ignored).
  std::uint32_t closing_last_ = kMaxWindow;
  std::int64_t connection_send_window_ = 65535;
  // The most the peer has let the connection's window reach: less what it has now is what
  // was sent and not yet given back.
  std::int64_t connection_send_peak_ = 65535;
  std::int64_t connection_receive_window_ = 65535;
  std::size_t connection_unacked_ = 0;
  std::uint32_t peer_initial_window_ = 65535;
  bool peer_connect_protocol_ = false;
  std::uint32_t peer_max_frame_size_ = kDefaultMaxFrameSize;
  // The header block being read (HEADERS then CONTINUATION).
  std::uint32_t block_stream_ = 0;
  bool block_end_stream_ = false;
  std::string block_;
  std::size_t block_frames_ = 0;
  // A client's block past what it gathers, read a frame at a time for the table only
  // (skim_block): whether one is, and whether a field of it came yet.
  bool block_skimming_ = false;
  bool block_field_seen_ = false;
  // Budgets (SessionLimits): what was spent, and the streams completed that earn more.
  std::size_t resets_ = 0;
  std::size_t empty_frames_ = 0;
  std::size_t settings_frames_ = 0;
  std::size_t completed_ = 0;
};

/// The server's end of a connection.
class ServerSession final : public Session {
 public:
  ServerSession(SessionLimits limits, SessionHandler& handler)
      : Session(Role::kServer, limits, handler) {}

  /// An h2c upgrade (RFC 7540 §3.2): the client's HTTP2-Settings, decoded, apply as its first
  /// SETTINGS (no acknowledgement), and stream 1 is the request that asked, its head and body
  /// complete. False if the settings are invalid: a GOAWAY saying why is in the output.
  bool upgrade(std::span<const std::uint8_t> settings);
  /// RFC 9113 §6.8's graceful shutdown, first step: a GOAWAY that refuses nothing yet, and a
  /// PING whose answer (on_ping_ack) tells that every stream the client opened before it heard
  /// has arrived; then goaway(kNoError) names the last.
  void shutdown_notice(std::span<const std::uint8_t, 8> ping);
};

/// The client's end of a connection (to an upstream): the preface and SETTINGS are in the
/// output from the start; push is refused (SETTINGS_ENABLE_PUSH = 0).
class ClientSession final : public Session {
 public:
  ClientSession(SessionLimits limits, SessionHandler& handler);

  /// True if a new stream may be opened now: the server's SETTINGS_MAX_CONCURRENT_STREAMS is
  /// not reached, no GOAWAY came, ids are left. A stream we reset counts until the server has
  /// read the reset (as it counts it until then).
  bool can_open() const;
  /// Opens a stream with the request head `fields` (pseudo-fields first, names lower case);
  /// `end_stream`: no body follows; `head_request`: the response has no body (HEAD). Its id,
  /// or 0 if none can be opened (can_open).
  std::uint32_t open(std::span<const hpack::Field> fields, bool end_stream,
                     bool head_request = false);
  /// Streams the server allows at once: its SETTINGS_MAX_CONCURRENT_STREAMS, or until they
  /// come what is assumed (100, or assume_max_concurrent's).
  std::uint32_t max_concurrent() const { return peer_max_concurrent_; }
  /// Until the server's SETTINGS come, assumes it allows `n` streams at once (what another
  /// connection to the same server learned), not 100.
  void assume_max_concurrent(std::uint32_t n) {
    if (!settings_seen_) peer_max_concurrent_ = n;
  }
  /// The largest request head the server takes, counted as RFC 9113 §6.5.2 does (each field's
  /// name and value and 32): its SETTINGS_MAX_HEADER_LIST_SIZE. A larger one would cost more
  /// than its stream (an upstream may end the connection for it).
  std::uint32_t max_header_list() const { return peer_max_header_list_; }
  /// The server allows extended CONNECT (RFC 8441's SETTINGS_ENABLE_CONNECT_PROTOCOL). Known
  /// once its first SETTINGS came (settings_received): a client must wait for them before it
  /// sends one (RFC 8441 §3).
  bool connect_protocol() const { return peer_connect_protocol_; }
  /// The server's first SETTINGS came.
  bool settings_received() const { return settings_seen_; }
  /// No stream will ever be opened again: a GOAWAY came or went, or the stream ids are spent.
  bool spent() const { return closing_ || last_stream_ + 2 > kMaxWindow; }
  /// The last stream of the server's GOAWAY (kMaxWindow while none came): the streams above
  /// it were not processed.
  std::uint32_t goaway_last_stream() const { return goaway_last_; }
};

}  // namespace spindle::h2
