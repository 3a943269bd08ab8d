#include "response_head.h"

#include "spindle/base/log.h"

namespace spindle::http::detail {

std::string client_address_text(const Result<Address>& peer) {
  if (!peer) return "-";
  if (peer->family() == Address::Family::kUnix) {
    return peer->unix_path().empty() ? "unix:" : peer->to_string();
  }
  std::string text = peer->to_string();  // "1.2.3.4:80" or "[::1]:80"
  text.resize(text.rfind(':'));
  if (text.starts_with('[')) text = text.substr(1, text.size() - 2);
  return text;
}

AccessRecord access_record(const RequestHead& head, const Response& response,
                           std::string_view remote, int major_version, Clock::time_point started,
                           std::span<const std::pair<std::string, std::string>> attributes) {
  bool no_body = head.method == "HEAD" || status_has_no_body(response.status);
  return AccessRecord{
      .remote = remote,
      .method = head.method,
      .target = head.target,
      .authority = head.authority,
      .major_version = major_version,
      .minor_version = major_version == 2 ? 0 : head.minor_version,
      .status = response.status,
      .bytes = no_body ? 0 : response.body_size(),
      .referer = head.headers.get(token::kReferer).value_or(""),
      .user_agent = head.headers.get(token::kUserAgent).value_or(""),
      .duration = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started),
      .attributes = attributes,
  };
}

std::optional<std::string_view> unsendable_part(const Response& response) {
  if (response.status < 100 || response.status > 599) return ":status";
  for (const Field& f : response.headers) {
    // (A name with a token is one of the token table's, in some case: a valid name.)
    if ((f.token == nullptr && !is_field_name(f.name)) || !is_field_value(f.value)) return f.name;
  }
  return std::nullopt;
}

void refuse_unsendable(Response& response, std::string_view method, std::string_view target) {
  auto part = unsendable_part(response);
  if (!part) return;
  // The name may itself hold the bad bytes: the log shows it escaped.
  log_error("response to {} {} has a field that cannot be sent ({:?}, status {}): answered 500",
            method, target, *part, response.status);
  response = Response::error(500);
}

}  // namespace spindle::http::detail
