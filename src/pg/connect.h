#pragma once
// Opening a libpq connection without holding the worker (private to src/pg): the conninfo is
// read once per Database, with the settings spindle adds; host names are resolved on the
// Database's resolver threads; libpq's non-blocking connect (PQconnectStartParams and
// PQconnectPoll) runs on the calling worker, waiting for its socket on the worker's reactor,
// until the deadline.

#include <libpq-fe.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "spindle/io/deadline.h"
#include "spindle/pg/result.h"

namespace spindle {
class Resolver;
struct IoSlot;
}  // namespace spindle

namespace spindle::pg {

/// The session settings the result decoders rely on (result.h), at connect through `options`.
inline constexpr const char* kSessionOptions =
    "-c TimeZone=UTC -c DateStyle=ISO -c extra_float_digits=3 -c bytea_output=hex";
/// The same as one statement, for a session that came up without them (a pooler that drops
/// `options`, or a conninfo's own options over them): sent first on the connection.
inline constexpr const char* kSessionSettingsSql =
    "SELECT set_config('TimeZone', 'UTC', false), set_config('DateStyle', 'ISO', false), "
    "set_config('extra_float_digits', '3', false), set_config('bytea_output', 'hex', false)";

/// A conninfo read into libpq's keywords, with spindle's additions: TCP keepalives and a user
/// timeout unless it sets them, and the session settings before its own `options`.
struct ConnectParams {
  std::vector<std::pair<std::string, std::string>> params;  ///< keyword, value
  std::string invalid;       ///< why the conninfo could not be read ("" if it could)
  bool names_hosts = false;  ///< a host is a name to resolve (not an address or a socket folder)
  /// The conninfo has `options` of its own: they may set what the session does not report
  /// (extra_float_digits, bytea_output), so kSessionSettingsSql goes first on each connection.
  bool own_options = false;
  /// The conninfo's connect_timeout (libpq's: seconds, at least 2), which then bounds an open
  /// instead of Options::connect_timeout; 0 if it sets none.
  std::chrono::milliseconds connect_timeout{0};
};

/// Reads `conninfo` (key=value pairs or a postgresql:// URI).
ConnectParams connect_params(const std::string& conninfo);

/// A connection made, its socket registered on the calling worker's reactor.
struct Opened {
  PGconn* conn = nullptr;
  IoSlot* slot = nullptr;
};

/// Makes a connection on the calling fiber's worker: host names resolved by `resolver`, then
/// libpq's connect until it is ready or `deadline` passes (Errc::kConnectFailed, with libpq's
/// message or the time it took). True session settings are the caller's to check.
Expected<Opened> connect(const ConnectParams& params, Resolver& resolver, Deadline deadline);

/// True if the session reports the settings of kSessionOptions (a server honoured them).
bool session_settings_in_force(const PGconn* conn);

/// True if bytes wait for libpq where no readiness edge will tell: still in the socket (libpq
/// reads once per call), or records OpenSSL read already.
bool input_pending(PGconn* conn);

}  // namespace spindle::pg
