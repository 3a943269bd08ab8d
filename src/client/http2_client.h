#pragma once
// The HTTP/2 client session (private to src/client): one connection to an endpoint, its
// exchanges streams on it. The pools of exchange.cc open them; http2_client.cc has the rest.

#include <memory>
#include <string_view>

#include "spindle/client/exchange.h"

namespace spindle::http::detail {

/// An HTTP/2 client connection: a reader and a writer fiber move the bytes; exchanges are
/// streams on it (those beyond the peer's SETTINGS_MAX_CONCURRENT_STREAMS wait their turn).
class Http2Session : public std::enable_shared_from_this<Http2Session> {
 public:
  /// Starts a session (and its fibers) on a connected stream.
  static std::shared_ptr<Http2Session> start(Stream stream);
  ~Http2Session();
  /// True while new streams may go on it.
  bool usable() const;
  /// True if one more stream may go on it now, within the server's
  /// SETTINGS_MAX_CONCURRENT_STREAMS (open() would not wait).
  bool has_room() const;
  /// When its last stream ended, while none is open (time_point::max() while one is).
  Clock::time_point idle_since() const;
  /// Streams the server allows at once (see h2::ClientSession::max_concurrent).
  std::uint32_t max_concurrent() const;
  /// Until the server's SETTINGS come, assumes it allows `n` streams at once.
  void assume_max_concurrent(std::uint32_t n);
  /// Starts an exchange on a new stream.
  Result<std::unique_ptr<ClientExchange>> open(const ClientRequestHead& head,
                                               std::string_view authority,
                                               const ExchangeTimeouts& timeouts);
  /// Ends the connection; its fibers finish on their own.
  void close();
  /// Ends the connection once no stream is open (now, if none is): for an endpoint no
  /// configuration names any more.
  void retire();

  struct Impl;

 private:
  explicit Http2Session(Stream stream);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spindle::http::detail
