#pragma once
// The route middlewares that look at a request before it goes on (private to src/proxy):
// basic_auth, jwt, cors and traffic_split, and the request attributes they leave for the
// forwarded head. The proxy calls them in a route's order (proxy.cc, answer_first).

#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>

#include "spindle/proxy/config.h"
#include "spindle/server/message.h"
#include "spindle/sync/blocking_pool.h"

namespace spindle::proxy {

/// Password checks for basic_auth. bcrypt is slow on purpose (milliseconds): it runs on helper
/// threads while the worker serves on, and credentials found good are remembered (by a SHA-256
/// of user, password and hash), so a client pays for it once.
class PasswordCheck {
 public:
  /// True if `password` is `user`'s by `hash` (bcrypt, crypt(3)'s others, or "{SHA}" base64).
  /// Parks the fiber while a helper thread runs crypt.
  bool matches(std::string_view user, std::string_view password, const std::string& hash);

 private:
  /// SHA-256 of `text`, as 32 raw bytes.
  static std::string digest(const std::string& text);

  BlockingPool pool_{2};                  ///< the helper threads for crypt
  std::mutex lock_;                       ///< guards good_ (helpers and workers meet there)
  std::unordered_set<std::string> good_;  ///< digests of credentials found good
};

namespace detail {

/// The request attribute that holds a checked JWT's claim (not logged: '_').
std::string claim_attribute(std::string_view claim);

/// The request attribute that holds a field forward_auth's service answered with.
std::string auth_attribute(std::string_view field);

/// The user of the `Authorization: Basic` credentials in `fields` (a request's, as the
/// middlewares before basic_auth left them: JudgedFields), if `auth` knows them and the
/// password is right.
std::optional<std::string> authenticated_user(const http::HeaderMap& fields,
                                              const BasicAuthConfig& auth, PasswordCheck& check);

/// The cookies of one name in a request.
struct FoundCookie {
  std::string_view first;  ///< the value of the first ("" if none), as frameworks read it
  std::size_t count = 0;   ///< how many there are
  /// One is named otherwise than exactly `name=`: a framework may take it for another cookie,
  /// or for this one ("name =", "%6Eame=": Express trims names, PHP decodes them).
  bool misspelt = false;
};

/// The cookies named `name` in the Cookie fields of `fields`, names read as frameworks read
/// them: trimmed of spaces and tabs, percent-escapes decoded.
FoundCookie find_cookie(const http::HeaderMap& fields, std::string_view name);

/// The value of cookie `name` in the request's Cookie fields ("" if none; the first one if
/// several, as frameworks read it).
std::string_view cookie_value(const http::Request& request, std::string_view name);

/// The service a traffic_split sends `request` to: the one its sticky cookie names, or one
/// picked by weight (then `set_cookie` gets the Set-Cookie value that keeps it).
std::string_view split_pick(const http::Request& request, const TrafficSplitConfig& split,
                            std::string& set_cookie);

/// A CORS preflight: OPTIONS with Origin and Access-Control-Request-Method.
bool is_preflight(const http::Request& request);

/// The answer to a CORS preflight: 204 with what the page may do, or 403 (its Vary: Origin
/// comes from add_cors_fields, as every answer's of the route).
http::Response answer_preflight(const http::Request& request, const CorsConfig& cors);

/// On a route with `cors`: Vary: Origin on every answer (allowed, refused or no Origin,
/// preflight or not, whoever answered), and the CORS fields of an answer to an actual (not
/// preflight) request from an allowed origin.
void add_cors_fields(const http::Request& request, const RouteConfig& route,
                     http::Response& response);

/// jwt: nullopt when the token in `fields` (the request's, as the middlewares before jwt left
/// them: JudgedFields) is good (its claims kept as attributes of `request`), else the 401 of
/// RFC 6750.
std::optional<http::Response> check_jwt(http::Request& request, const http::HeaderMap& fields,
                                        const JwtConfig& jwt);

}  // namespace detail
}  // namespace spindle::proxy
