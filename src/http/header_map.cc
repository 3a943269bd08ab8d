#include "spindle/http/header_map.h"

#include <algorithm>
#include <cstring>

namespace spindle::http {
namespace {

constexpr char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

}  // namespace

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool accepts_encoding(std::string_view header, std::string_view coding) {
  while (!header.empty()) {
    std::size_t comma = header.find(',');
    std::string_view item = trim_ows(header.substr(0, comma));
    std::size_t semi = item.find(';');
    if (iequals(trim_ows(item.substr(0, semi)), coding)) {
      if (semi == std::string_view::npos) return true;
      std::string_view q = trim_ows(item.substr(semi + 1));
      // "q=0", "q=0.0", "q=0.000": refused; any non-zero digit: accepted.
      return !(q.starts_with("q=0") && q.find_first_of("123456789") == std::string_view::npos);
    }
    if (comma == std::string_view::npos) break;
    header.remove_prefix(comma + 1);
  }
  return false;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

void HeaderMap::take(HeaderMap&& other) noexcept {
  std::memcpy(arena_, other.arena_, other.arena_used_);
  arena_used_ = other.arena_used_;
  const char* from = other.arena_;
  auto repoint = [&](std::string_view v) {
    if (v.data() >= from && v.data() < from + other.arena_used_) {
      return std::string_view(arena_ + (v.data() - from), v.size());
    }
    return v;  // a borrowed view or text in a heap block: stays where it is
  };
  size_ = other.size_;
  for (std::size_t i = 0; i < std::min(size_, kInline); ++i) {
    inline_.at[i] = {repoint(other.inline_.at[i].name), repoint(other.inline_.at[i].value)};
  }
  overflow_ = std::move(other.overflow_);
  for (Field& f : overflow_) f = {repoint(f.name), repoint(f.value)};
  blocks_ = std::move(other.blocks_);
  block_free_ = other.block_free_;
  block_left_ = other.block_left_;
  other.size_ = 0;
  other.arena_used_ = 0;
  other.overflow_.clear();
  other.blocks_.clear();
  other.block_free_ = nullptr;
  other.block_left_ = 0;
}

void HeaderMap::add_view(std::string_view name, std::string_view value) {
  if (size_ < kInline) {
    inline_.at[size_] = {name, value};
  } else {
    overflow_.push_back({name, value});
  }
  ++size_;
}

void HeaderMap::add(std::string_view name, std::string_view value) {
  std::string_view n = copy(name);
  add_view(n, copy(value));
}

void HeaderMap::set(std::string_view name, std::string_view value) {
  erase(name);
  add(name, value);
}

std::size_t HeaderMap::erase(std::string_view name) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < size_; ++i) {
    if (!iequals(at(i).name, name)) at(kept++) = at(i);
  }
  std::size_t removed = size_ - kept;
  size_ = kept;
  if (size_ <= kInline) {
    overflow_.clear();
  } else {
    overflow_.resize(size_ - kInline);
  }
  return removed;
}

void HeaderMap::clear() {
  size_ = 0;
  overflow_.clear();
  arena_used_ = 0;
  blocks_.clear();
  block_free_ = nullptr;
  block_left_ = 0;
}

std::optional<std::string_view> HeaderMap::get(std::string_view name) const {
  for (const Field& f : *this) {
    if (iequals(f.name, name)) return f.value;
  }
  return std::nullopt;
}

std::size_t HeaderMap::count(std::string_view name) const {
  std::size_t n = 0;
  for (const Field& f : *this) n += iequals(f.name, name) ? 1 : 0;
  return n;
}

bool HeaderMap::has_token(std::string_view name, std::string_view token) const {
  for (const Field& f : *this) {
    if (!iequals(f.name, name)) continue;
    std::string_view rest = f.value;
    while (!rest.empty()) {
      std::size_t comma = rest.find(',');
      if (iequals(trim_ows(rest.substr(0, comma)), token)) return true;
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return false;
}

std::string_view HeaderMap::copy(std::string_view text) {
  if (text.empty()) return {};
  if (arena_used_ + text.size() <= kArenaInline) {
    char* out = arena_ + arena_used_;
    std::memcpy(out, text.data(), text.size());
    arena_used_ += text.size();
    return {out, text.size()};
  }
  if (block_left_ < text.size()) {
    std::size_t size = std::max<std::size_t>(4096, text.size());
    blocks_.push_back(std::make_unique<char[]>(size));
    block_free_ = blocks_.back().get();
    block_left_ = size;
  }
  char* out = block_free_;
  std::memcpy(out, text.data(), text.size());
  block_free_ += text.size();
  block_left_ -= text.size();
  return {out, text.size()};
}

}  // namespace spindle::http
