#include "spindle/server/message.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "spindle/http/status.h"

namespace spindle::http {

const RequestContext Request::kNoContext{};

void Request::set_attribute(std::string_view name, std::string_view value) {
  for (auto& [n, v] : attributes_) {
    if (n == name) {
      v = value;
      return;
    }
  }
  if (attributes_.empty()) attributes_.reserve(8);  // one allocation for a gateway's few
  attributes_.emplace_back(name, value);
}

std::string_view Request::attribute(std::string_view name) const {
  for (const auto& [n, v] : attributes_) {
    if (n == name) return v;
  }
  return {};
}

Request::Request(const RequestHead& head, BodySource& source) : head_(&head), source_(&source) {
  split_target();
}

Request::Request(const RequestHead& head, std::string body) : head_(&head), body_(std::move(body)) {
  split_target();
}

void Request::split_target() {
  std::string_view target = head_->target;
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

const std::string& Request::body() {
  // Drop what read() already returned, then read the rest, growing the buffer by at most a
  // step beyond what has arrived: the announced length is the client's word, not a size to
  // allocate (the source enforces the server's max_body).
  if (whole_) return body_;
  whole_ = true;
  body_.erase(0, body_taken_);
  body_taken_ = 0;
  if (source_ == nullptr) return body_;
  std::uint64_t announced = head_->content_length.value_or(0);
  for (;;) {
    std::size_t have = body_.size();
    std::size_t want = kBodyStep;
    if (announced > have)
      want = static_cast<std::size_t>(std::min<std::uint64_t>(announced - have, kBodyStep));
    body_.resize(have + want);
    std::size_t n = source_->read({body_.data() + have, want});
    body_.resize(have + n);
    if (n == 0 || (announced != 0 && body_.size() == announced)) break;
  }
  source_ = nullptr;
  return body_;
}

std::size_t Request::read(std::span<char> buffer) {
  if (whole_) return 0;  // body() took it all
  if (body_taken_ < body_.size()) {
    std::size_t n = std::min(buffer.size(), body_.size() - body_taken_);
    std::memcpy(buffer.data(), body_.data() + body_taken_, n);
    body_taken_ += n;
    return n;
  }
  return source_ == nullptr ? 0 : source_->read(buffer);
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
