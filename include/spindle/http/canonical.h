#pragma once
/// The canonical request: what the server's drivers (HTTP/1.1, HTTP/2, and RFC 8441's extended
/// CONNECT) make of every request right after parsing it, before anything judges it. Routes,
/// middlewares, a gateway's auth service and mirror, the access log and the upstream all see
/// this request and no other; what could be read two ways is refused here with a 400 (the
/// connection goes on: the framing is sound). Pure: no I/O, the target rewritten in place.
///
/// What canonical means:
///   - the method: a standard method (RFC 9110 §9.3, and PATCH) in any case is that method in
///     upper case ("put" is PUT: Django and Flask run it as PUT); another method spelt with a
///     lower-case letter is refused (WSGI upper-cases it, Node refuses it, Go keeps it as sent);
///   - the target: origin-form, its path normalised (target.h); an absolute-form target gives
///     the request its authority and goes on as origin-form ("http://h" is "/"); "*" for
///     OPTIONS only; authority-form for CONNECT only (not an extended one, whose :path is a
///     path);
///   - the authority, host[:port] (is_authority): from an absolute-form or CONNECT target, else
///     HTTP/2's :authority, else Host. Two that differ (without regard to case) are refused.
///     The request then has exactly one Host field, which says it exactly;
///   - the fields: a field that may appear once (field_flag::kSingleton: Host, Authorization,
///     Content-Type, Range, ...) appears once; a name with '_' where a field spindle knows has
///     '-' (X_Forwarded_For, Content_Length) is refused, for CGI, WSGI and PHP take both for the
///     same field; the Cookie fields are one, their pairs joined with "; " (RFC 9113 §8.2.3).

#include <optional>
#include <string_view>

#include "spindle/http/head.h"
#include "spindle/http/target.h"

namespace spindle::http {

/// Why a request is refused: answered 400 with this reason.
struct BadRequest {
  std::string_view reason;
};

/// The method as spindle judges and forwards it: a standard method in any case is that method
/// in upper case (a view of static storage); any other method is itself if it has no lower-case
/// letter; nullopt for another method with one.
std::optional<std::string_view> canonical_method(std::string_view method);

/// True if `authority` is host[:port]: a host of letters, digits, '-', '.' and '_' (no
/// user information, path, query, fragment, escape or sub-delimiter: what could make two
/// parsers read two hosts), or an IPv6 literal in brackets; a port of 1 to 5 digits up to 65535.
bool is_authority(std::string_view authority);

/// True if the field name `name` is `known` (lower case) once case is ignored and each '_' of
/// `name` is read as '-': the field CGI, WSGI and PHP (and the frameworks behind them) take it
/// for.
bool names_same_field(std::string_view name, std::string_view known);

/// Makes `head` the canonical request, in place. `target` holds head.target's characters,
/// writable (the driver's buffer): the target is rewritten there and never grows. On entry
/// head.authority is HTTP/2's :authority ("" over HTTP/1.1). Returns why the request is
/// refused, if it is (head is then left part way).
[[nodiscard]] std::optional<BadRequest> canonicalize_request(RequestHead& head, char* target,
                                                             const PathRules& paths);

}  // namespace spindle::http
