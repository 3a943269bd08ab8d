#include "connections.h"

#include "http2_client.h"
#include "spindle/fiber/worker.h"

namespace spindle::http::detail {

namespace {
// The reactor clears a slot's readable callback when it fires: that is the whole record.
void noted_readable(IoSlot&) {}
}  // namespace

void watch_idle(Stream& stream) { stream.on_readable(&noted_readable, nullptr); }

bool stream_looks_alive(Stream& stream) {
  // An event since the connection went idle: the peer closed it, or sent something unasked
  // (a timeout notice). Neither is reusable. No system call: the reactor saw it, or not.
  bool quiet = stream.on_readable_armed();
  stream.cancel_on_readable();
  if (TlsStream* tls = stream.tls(); tls != nullptr && tls->has_pending()) return false;
  return quiet;
}

Result<Stream> connect_endpoint(const Endpoint& endpoint, Deadline deadline,
                                std::string_view* alpn_out) {
  auto tcp = TcpStream::connect(endpoint.address, deadline);
  if (!tcp) {
    std::error_code ec = tcp.error();
    if (ec == std::errc::timed_out) return fail(make_error_code(ExchangeErrc::kConnectTimeout));
    if (ec == std::errc::connection_refused || ec == std::errc::host_unreachable ||
        ec == std::errc::network_unreachable) {
      return fail(make_error_code(ExchangeErrc::kRefused));
    }
    return fail(make_error_code(ExchangeErrc::kConnectFailed));
  }
  (void)tcp->set_nodelay(true);
  if (!endpoint.tls) return Stream(std::move(*tcp));
  auto tls = TlsStream::connect(std::move(*tcp), endpoint.tls, endpoint.server_name, deadline);
  if (!tls) {
    // The TLS layer's own error says why (a name that does not match, an unknown issuer).
    if (tls.error() == std::errc::timed_out)
      return fail(make_error_code(ExchangeErrc::kConnectTimeout));
    return fail(tls.error().category() == tls_category()
                    ? tls.error()
                    : make_error_code(ExchangeErrc::kTlsFailed));
  }
  if (alpn_out != nullptr) *alpn_out = tls->alpn();
  return Stream(std::move(*tls));
}

void Permit::reset() {
  if (target_) std::exchange(target_, nullptr)->slots->release();
}

void TargetState::went_away(PermitHolder& holder, Clock::time_point since) {
  if (holder.away_) return;
  holder.away_ = true;
  holder.away_since_ = since;
  holder.prev_ = away_last;
  holder.next_ = nullptr;
  (away_last != nullptr ? away_last->next_ : away_first) = &holder;
  away_last = &holder;
}

void TargetState::came_back(PermitHolder& holder) {
  if (!holder.away_) return;
  holder.away_ = false;
  (holder.prev_ != nullptr ? holder.prev_->next_ : away_first) = holder.next_;
  (holder.next_ != nullptr ? holder.next_->prev_ : away_last) = holder.prev_;
  holder.prev_ = holder.next_ = nullptr;
}

std::size_t TargetState::open_count() const { return connections + idle.size() + http2.size(); }

void TargetState::put_idle(Stream stream) {
  auto now = coarse_now();
  drop_expired(now);
  if (retired || idle.size() >= limits.max_idle) return;  // closed as it goes
  watch_idle(stream);
  idle.push_back({std::move(stream), now});
}

std::optional<Stream> TargetState::take_idle() {
  auto now = coarse_now();  // idle timeouts are seconds: the coarse clock is close enough
  drop_expired(now);
  while (!idle.empty()) {
    Stream stream = std::move(idle.back().stream);
    idle.pop_back();
    if (stream_looks_alive(stream)) return stream;
  }
  return std::nullopt;
}

void TargetState::drop_expired(Clock::time_point now) {
  // Oldest first (connections are added at the back): only the expired ones are looked at.
  std::size_t expired = 0;
  while (expired < idle.size() && now - idle[expired].since >= limits.idle_timeout) ++expired;
  if (expired != 0) idle.erase(idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(expired));
}

void TargetState::retire() {
  retired = true;
  idle.clear();
  for (const auto& session : http2) session->retire();
  http2.clear();
}

}  // namespace spindle::http::detail
