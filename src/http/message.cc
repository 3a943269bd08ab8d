#include "spindle/http/message.h"

#include <fmt/format.h>

#include "spindle/http/status.h"

namespace spindle::http {

Request::Request(const RequestHead& head, std::string body) : head_(&head), body_(std::move(body)) {
  std::string_view target = head.target;
  if (target.front() != '/') {
    // absolute-form: the path starts after the authority
    std::size_t scheme = target.find("://");
    std::size_t slash =
        scheme == std::string_view::npos ? std::string_view::npos : target.find('/', scheme + 3);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  std::size_t q = target.find('?');
  path_ = target.substr(0, q);
  if (q != std::string_view::npos) query_ = target.substr(q + 1);
  if (path_.empty()) path_ = "/";
}

std::string_view Request::param(std::string_view name) const {
  for (const auto& [n, v] : params_) {
    if (n == name) return v;
  }
  return {};
}

void Request::set_param(std::string_view name, std::string_view value) {
  params_.emplace_back(name, value);
}

Response Response::error(int status, std::string_view detail) {
  std::string body = fmt::format("{} {}\n", status, reason_phrase(status));
  if (!detail.empty()) body = fmt::format("{} {}: {}\n", status, reason_phrase(status), detail);
  return Response(status, std::move(body), "text/plain; charset=utf-8");
}

}  // namespace spindle::http
