#pragma once
/// A Redis client for fibers: one pipelined connection per worker, on spindle's own sockets
/// (TcpStream), replies parsed by hiredis's redisReader. Calls park the calling fiber, never the
/// thread, and give up at their deadline; a connection that fails or times out is dropped and
/// not tried again for a short back-off, so that while Redis is away a call fails at once
/// instead of each waiting out the timeout.

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/io/deadline.h"
#include "spindle/net/address.h"
#include "spindle/proxy/config.h"
#include "spindle/sync/event.h"

namespace spindle::proxy {

/// A reply, as RESP gives it.
struct RedisReply {
  enum class Type { kString, kStatus, kError, kInteger, kNil, kArray } type = Type::kNil;
  /// kString, kStatus, kError.
  std::string text;
  /// kInteger.
  long long integer = 0;
  /// kArray.
  std::vector<RedisReply> elements;
};

/// The RESP encoding of a command: an array of bulk strings.
std::string redis_command(std::span<const std::string_view> args);

/// The error replies /metrics counts apart, by the reply's first word (Redis's error code).
enum class RedisErrorKind { kReadOnly, kOom, kBusy, kLoading, kOther };

/// Each RedisErrorKind's label in /metrics, in the enum's order.
inline constexpr std::array<std::string_view, 5> kRedisErrorLabels = {"READONLY", "OOM", "BUSY",
                                                                      "LOADING", "other"};

/// The kind of the error reply `text` ("READONLY You can't write...": kReadOnly).
RedisErrorKind redis_error_kind(std::string_view text);

/// Error replies of `kind` every client of the process got so far (all workers, all reloads).
std::uint64_t redis_error_replies(RedisErrorKind kind);

/// One worker's connection to Redis. Use from fibers of one worker only.
class RedisClient {
 public:
  /// A client of the Redis `config` describes, at `address` (none: its name has no address
  /// yet, and every connection is refused).
  RedisClient(RedisConfig config, std::optional<Address> address);
  /// Closes the connection; safe from any thread (its reader fiber ends on its own worker).
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  /// Sends `args` as one command (pipelined behind others in flight) and waits for its reply
  /// until `deadline` (at most the configured timeout). A Redis error (READONLY, OOM, BUSY) is
  /// a kError reply, not a failure, but it starts a back-off as a failed connection does (the
  /// connection is kept; one log line per back-off). A reply announcing more than 1024
  /// elements or holding more than 1 MiB breaks the connection (protocol_error). Fails with
  /// std::errc::timed_out, std::errc::connection_refused (also at once during a back-off),
  /// std::errc::connection_reset (the connection broke), or std::errc::protocol_error (a reply that
  /// is not RESP, or a refused AUTH / SELECT).
  [[nodiscard]] Result<RedisReply> call(std::span<const std::string_view> args, Deadline deadline);

  /// Connections made so far (for tests: a reconnect storm shows here).
  std::uint64_t connects() const { return connects_; }
  /// Error replies so far (each starts a back-off).
  std::uint64_t error_replies() const { return error_replies_; }

 private:
  struct Connection;
  /// Opens a connection (AUTH and SELECT queued first), or fails.
  Result<std::shared_ptr<Connection>> open(Deadline deadline);
  /// Drops the connection (its calls fail) and starts a back-off.
  void drop(const std::shared_ptr<Connection>& connection);
  /// Redis answered `error`: counted, logged once per back-off, and a back-off starts.
  void refused(std::string_view error);

  RedisConfig config_;
  std::optional<Address> address_;
  std::shared_ptr<Connection> connection_;
  /// Set while a fiber connects; the others wait for it.
  std::shared_ptr<Event> connecting_;
  /// No connection is tried before this.
  Clock::time_point retry_at_{};
  std::uint64_t connects_ = 0;
  std::uint64_t error_replies_ = 0;
};

/// A process's clients for one Redis: one per worker, made on first use there.
class RedisClients {
 public:
  /// Clients of the Redis `config` describes, at `address` (none: not resolved yet).
  RedisClients(RedisConfig config, std::optional<Address> address, std::size_t workers);
  /// The calling worker's client.
  RedisClient& current();
  const RedisConfig& config() const { return config_; }

 private:
  RedisConfig config_;
  std::optional<Address> address_;
  std::vector<std::unique_ptr<RedisClient>> clients_;
};

}  // namespace spindle::proxy
