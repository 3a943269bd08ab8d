#pragma once
// What the server sends for a handler's response, decided once for the HTTP/1 and HTTP/2
// drivers (which differ only in how they encode it), and the access-log record of a request
// (private to src/http).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "spindle/base/error.h"
#include "spindle/h1/parser.h"
#include "spindle/http/rules.h"
#include "spindle/http/status.h"
#include "spindle/io/deadline.h"
#include "spindle/net/address.h"
#include "spindle/server/access_log.h"
#include "spindle/server/message.h"

namespace spindle::http::detail {

/// True if a field of an interim response (Request::send_interim) goes out: a valid name and
/// value, and one a final head would send (forwardable for kResponse, as each_response_field):
/// not hop-by-hop, not named by its Connection fields (`nominated`), no framing (no 1xx has a
/// body, RFC 9110 §8.6).
inline bool interim_field_sendable(const Field& f, const NominatedFields& nominated) {
  return is_field_name(f.name) && is_field_value(f.value) &&
         forwardable(f, nominated, FieldsFor::kResponse);
}

/// What each_response_field saw of the handler's fields.
struct HandlerFields {
  /// The handler set Date / Server itself (the server's own are then left out).
  bool has_date = false;
  bool has_server = false;
};

/// The first thing of `response` that may not be sent at all: a status outside 100-599
/// (":status"), a field name that is not a token, or a value with CR, LF, NUL or another
/// control character (rules.h). nullopt if it may all go out.
std::optional<std::string_view> unsendable_part(const Response& response);

/// Replaces `response` with a 500 if unsendable_part finds something, and logs what.
/// call_router does this for every handler's response, on HTTP/1 and HTTP/2 alike, so that a
/// handler can never split a response or smuggle a field in.
void refuse_unsendable(Response& response, std::string_view method, std::string_view target);

/// Calls `emit(field)` for each field of a handler's response that goes out as given: every
/// field but Content-Length and the hop-by-hop ones (rules.h), whose values the server decides
/// (a 101 response keeps Upgrade and Connection). The response has passed refuse_unsendable.
template <typename Emit>
HandlerFields each_response_field(const Response& response, Emit&& emit) {
  HandlerFields seen;
  // A Connection field may name more fields (a proxied response's, say: read once).
  NominatedFields nominated(response.headers);
  bool upgrade = response.status == 101;
  for (const Field& f : response.headers) {
    seen.has_date = seen.has_date || f.token == &token::kDate;
    seen.has_server = seen.has_server || f.token == &token::kServer;
    if (!forwardable(f, nominated, FieldsFor::kResponse)) {
      // A 101 keeps its Upgrade and Connection: they are the response.
      if (!upgrade || !(f.token == &token::kUpgrade || f.token == &token::kConnection)) continue;
    }
    emit(f);
  }
  return seen;
}

/// How the body of a response goes out, whatever the protocol.
struct ResponseBodyPlan {
  /// Body bytes are sent (not for HEAD, nor for statuses without a body).
  bool send_body = false;
  /// The body comes from a producer (Response::stream), its length unknown beforehand unless
  /// content_length is set too.
  bool streamed = false;
  /// A Content-Length is announced (also for HEAD, as the GET would have had), with this value.
  std::optional<std::uint64_t> content_length;
};

/// Decides how `response` (to a HEAD request if `head_request`) carries its body.
inline ResponseBodyPlan plan_response_body(const Response& response, bool head_request) {
  ResponseBodyPlan plan;
  // A 2xx with a takeover answers CONNECT: the tunnel follows the head, which carries no body
  // framing (RFC 9110 9.3.6).
  bool no_body = status_has_no_body(response.status) ||
                 (response.takeover && response.status >= 200 && response.status < 300);
  plan.streamed = response.stream && !no_body;
  plan.send_body = !no_body && !head_request;
  if (!no_body && !plan.streamed) plan.content_length = response.body_size();
  if (plan.streamed && response.stream_length) plan.content_length = response.stream_length;
  return plan;
}

/// The client's address as the access log shows it: "192.0.2.1", "2001:db8::1" (no brackets,
/// no port), "unix:/path", or "-" if unknown.
std::string client_address_text(const Result<Address>& peer);

/// The access-log record of a request answered with `response`: `bytes` is what the body
/// sends, `started` when its head was complete.
AccessRecord access_record(const RequestHead& head, const Response& response,
                           std::string_view remote, int major_version, Clock::time_point started,
                           std::span<const std::pair<std::string, std::string>> attributes = {});

}  // namespace spindle::http::detail
