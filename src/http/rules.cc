#include "spindle/http/rules.h"

#include <array>
#include <string>

#include "spindle/http/status.h"

namespace spindle::http {

bool is_request_target(std::string_view s) {
  if (s.empty() || target_prefix_length(s) != s.size()) return false;
  if (s.front() == '/' || s == "*") return true;
  // absolute-form ("http://host/path") or authority-form ("host:port", CONNECT)
  std::size_t scheme = s.find("://");
  if (scheme != std::string_view::npos) return scheme > 0 && is_tchar(s.front());
  return s.find('/') == std::string_view::npos && s.find(':') != std::string_view::npos;
}

bool is_trailer_sendable(std::string_view name, std::string_view value) {
  return is_field_name(name) && is_field_value(value) &&
         field_flags(name, field_flag::kHopByHop | field_flag::kNotInTrailers) == 0;
}

bool connection_nominates(const HeaderMap& headers, std::string_view name) {
  return headers.has_token(token::kConnection, name) ||
         headers.has_token(token::kProxyConnection, name);
}

void NominatedFields::read() {
  for (const Field& f : headers_) {
    if (f.token != &token::kConnection && f.token != &token::kProxyConnection) continue;
    for_each_list_item(f.value, [&](std::string_view token) {
      if (count_ == kInline) {
        overflow_ = true;
        return false;
      }
      names_[count_++] = {token, find_token(token)};
      return true;
    });
    if (overflow_) return;
  }
}

bool NominatedFields::listed(const Field& field) const {
  if (overflow_) return connection_nominates(headers_, field.name);
  for (std::size_t i = 0; i < count_; ++i) {
    const Name& listed = names_[i];
    // Both known: the same name if the same token. Otherwise by the text, so that a field
    // made without its token still matches (it would slip past the list otherwise).
    if (listed.token != nullptr && field.token != nullptr
            ? field.token == listed.token
            : listed.text.size() == field.name.size() && iequals(listed.text, field.name)) {
      return true;
    }
  }
  return false;
}

std::size_t remove_hop_by_hop(HeaderMap& headers) {
  // The nominated names first: erasing Connection would lose them.
  std::size_t removed = 0;
  for (const Token* field : {&token::kConnection, &token::kProxyConnection}) {
    for (;;) {
      std::optional<std::string_view> nominated;
      for (const Field& f : headers) {
        if (f.token != field) continue;
        for_each_list_item(f.value, [&](std::string_view token) {
          if (!is_hop_by_hop(token) && headers.contains(token)) nominated = token;
          return !nominated;
        });
        if (nominated) break;
      }
      if (!nominated) break;
      // The view points into the Connection field, which erase() keeps until it is erased.
      std::string name(*nominated);
      removed += headers.erase(name);
    }
  }
  return removed + headers.erase_if(
                       [](const Field& f) { return field_flags(f, field_flag::kHopByHop) != 0; });
}

std::optional<std::uint64_t> parse_content_length(std::string_view value) {
  std::optional<std::uint64_t> result;
  while (true) {
    std::size_t comma = value.find(',');
    std::string_view item = trim_ows(value.substr(0, comma));
    if (item.empty() || item.size() > 18) return std::nullopt;  // 18 digits cannot overflow
    std::uint64_t n = 0;
    for (char c : item) {
      if (c < '0' || c > '9') return std::nullopt;
      n = n * 10 + static_cast<std::uint64_t>(c - '0');
    }
    if (result && *result != n) return std::nullopt;
    result = n;
    if (comma == std::string_view::npos) return result;
    value.remove_prefix(comma + 1);
  }
}

void FramingFields::note_content_length(std::string_view value) {
  ++content_length_fields;
  auto n = parse_content_length(value);
  if (!n || (content_length && *content_length != *n)) {
    content_length_invalid = true;
    return;
  }
  content_length = n;
}

FramingFields collect_framing_fields(const HeaderMap& headers) {
  FramingFields fields;
  for (const Field& f : headers) {
    if (f.token == &token::kContentLength) {
      fields.note_content_length(f.value);
    } else if (f.token == &token::kTransferEncoding) {
      fields.transfer_encoding = true;
    }
  }
  return fields;
}

TransferCodings transfer_codings(const HeaderMap& headers) {
  TransferCodings t;
  bool chunked_seen = false;
  for (const Field& f : headers) {
    if (f.token != &token::kTransferEncoding) continue;
    t.present = true;
    std::string_view rest = f.value;
    while (true) {
      std::size_t comma = rest.find(',');
      std::string_view coding = trim_ows(rest.substr(0, comma));
      coding = trim_ows(coding.substr(0, coding.find(';')));
      if (coding.empty()) {
        t.malformed = true;
      } else if (iequals(coding, "chunked")) {
        if (chunked_seen) t.malformed = true;
        chunked_seen = true;
        t.chunked_last = true;
      } else {
        t.other = true;
        t.chunked_last = false;
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return t;
}

std::optional<FramingError> request_framing(const HeaderMap& headers, const FramingFields& fields,
                                            int minor_version, BodyFraming& out) {
  if (fields.transfer_encoding) {
    if (fields.content_length_fields > 0) {
      return FramingError{400, "both Content-Length and Transfer-Encoding"};
    }
    if (minor_version == 0) return FramingError{400, "Transfer-Encoding in an HTTP/1.0 request"};
    TransferCodings t = transfer_codings(headers);
    if (t.malformed) return FramingError{400, "malformed Transfer-Encoding"};
    if (!t.chunked_last) return FramingError{400, "chunked is not the final transfer coding"};
    if (t.other) return FramingError{501, "transfer coding not implemented"};
    out = {BodyFraming::Kind::kChunked, 0};
    return std::nullopt;
  }
  if (fields.content_length_invalid) return FramingError{400, "invalid Content-Length"};
  if (fields.content_length && *fields.content_length > 0) {
    out = {BodyFraming::Kind::kLength, *fields.content_length};
  } else {
    out = {BodyFraming::Kind::kNone, 0};
  }
  return std::nullopt;
}

std::optional<FramingError> response_framing(const HeaderMap& headers, const FramingFields& fields,
                                             int status, std::string_view request_method,
                                             BodyFraming& out) {
  if (opens_tunnel(status, request_method == "CONNECT")) {
    out = {BodyFraming::Kind::kTunnel, 0};
    return std::nullopt;
  }
  if (request_method == "HEAD" || status_has_no_body(status)) {
    out = {BodyFraming::Kind::kNone, 0};
    return std::nullopt;
  }
  if (fields.transfer_encoding) {
    TransferCodings t = transfer_codings(headers);
    out = {t.chunked_last && !t.malformed ? BodyFraming::Kind::kChunked
                                          : BodyFraming::Kind::kUntilClose,
           0};
    return std::nullopt;
  }
  if (fields.content_length_invalid) return FramingError{502, "invalid Content-Length"};
  if (fields.content_length) {
    out = {BodyFraming::Kind::kLength, *fields.content_length};
    return std::nullopt;
  }
  out = {BodyFraming::Kind::kUntilClose, 0};
  return std::nullopt;
}

bool is_idempotent(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "OPTIONS" || method == "PUT" ||
         method == "DELETE" || method == "TRACE";
}

}  // namespace spindle::http
