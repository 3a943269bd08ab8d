#include "spindle/http/header_map.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include "spindle/base/block_cache.h"
#include "spindle/http/bytes.h"

namespace spindle::http {
namespace {

constexpr char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

}  // namespace

bool accepts_encoding(std::string_view header, std::string_view coding) {
  bool accepted = false;
  for_each_list_item(header, [&](std::string_view item) {
    std::size_t semi = item.find(';');
    if (!iequals(trim_ows(item.substr(0, semi)), coding)) return true;
    std::string_view q = semi == std::string_view::npos ? "" : trim_ows(item.substr(semi + 1));
    // "q=0", "q=0.0", "q=0.000": refused; any non-zero digit: accepted.
    accepted = !(q.starts_with("q=0") && q.find_first_of("123456789") == std::string_view::npos);
    return false;  // the first mention decides
  });
  return accepted;
}

bool detail::iequals_same_size(std::string_view a, std::string_view b) {
  std::size_t n = a.size();
  auto same = [](std::uint64_t x, std::uint64_t y) { return x == y || lower8(x) == lower8(y); };
  if (n >= 8) {
    // Whole words, the last one overlapping its neighbour when n is not a multiple of 8.
    for (std::size_t i = 0; i + 8 <= n; i += 8) {
      if (!same(word_at(a.data() + i), word_at(b.data() + i))) return false;
    }
    return n % 8 == 0 || same(word_at(a.data() + n - 8), word_at(b.data() + n - 8));
  }
  // The first four bytes and the last four (overlapping) in one word: "host", "date".
  if (n >= 4) return same(ends_of(a.data(), n), ends_of(b.data(), n));
  for (std::size_t i = 0; i < n; ++i) {
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
  flags_ = other.flags_;
  never_indexed_ = other.never_indexed_;
  for (std::size_t i = 0; i < std::min(size_, kInline); ++i) {
    const Field& f = other.inline_.at[i];
    inline_.at[i] = {repoint(f.name), repoint(f.value), f.token};
  }
  more_ = std::exchange(other.more_, nullptr);
  more_room_ = std::exchange(other.more_room_, 0);
  for (std::size_t i = kInline; i < size_; ++i) {
    Field& f = more_[i - kInline];
    f = {repoint(f.name), repoint(f.value), f.token};
  }
  blocks_ = std::exchange(other.blocks_, nullptr);
  block_free_ = std::exchange(other.block_free_, nullptr);
  block_left_ = std::exchange(other.block_left_, 0);
  other.size_ = 0;
  other.flags_ = 0;
  other.never_indexed_ = false;
  other.arena_used_ = 0;
}

void HeaderMap::add_overflow(const Field& field) {
  const std::size_t more = size_ - kInline;
  if (more == more_room_) {
    const std::size_t room = more_room_ == 0 ? kMoreFirst : 2 * more_room_;
    auto* grown = static_cast<Field*>(take_block(room * sizeof(Field)));
    if (more != 0) std::memcpy(static_cast<void*>(grown), more_, more * sizeof(Field));
    if (more_ != nullptr) give_block(more_, more_room_ * sizeof(Field));
    more_ = grown;
    more_room_ = room;
  }
  more_[more] = field;
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
  const Token* token = find_token(name);
  return erase_if([&](const Field& f) { return named(f, name, token); });
}

std::size_t HeaderMap::shrink_to(std::size_t kept) {
  std::size_t removed = size_ - kept;
  size_ = kept;  // (the room beyond kInline stays until clear() or destruction)
  return removed;
}

void HeaderMap::release_overflow() {
  if (more_ != nullptr) give_block(more_, more_room_ * sizeof(Field));
  more_ = nullptr;
  more_room_ = 0;
  while (TextBlock* block = blocks_) {
    blocks_ = block->next;
    give_block(block, block->bytes);
  }
  block_free_ = nullptr;
  block_left_ = 0;
}

std::optional<std::string_view> HeaderMap::get(std::string_view name) const {
  if (const Token* token = find_token(name)) return get(*token);
  for (const Field& f : *this) {
    if (f.token == nullptr && iequals(f.name, name)) return f.value;
  }
  return std::nullopt;
}

std::size_t HeaderMap::count(std::string_view name) const {
  if (const Token* token = find_token(name)) return count(*token);
  std::size_t n = 0;
  for (const Field& f : *this) n += f.token == nullptr && iequals(f.name, name) ? 1 : 0;
  return n;
}

bool list_has_token(std::string_view list, std::string_view token) {
  bool found = false;
  for_each_list_item(list, [&](std::string_view item) {
    found = iequals(item, token);
    return !found;
  });
  return found;
}

bool HeaderMap::has_token(std::string_view name, std::string_view token) const {
  if (const Token* known = find_token(name)) return has_token(*known, token);
  for (const Field& f : *this) {
    if (f.token == nullptr && iequals(f.name, name) && list_has_token(f.value, token)) return true;
  }
  return false;
}

bool HeaderMap::has_token(const Token& name, std::string_view token) const {
  for (const Field& f : *this) {
    if (f.token == &name && list_has_token(f.value, token)) return true;
  }
  return false;
}

std::string_view HeaderMap::copy(std::string_view text) {
  if (text.empty()) return {};
  if (arena_used_ + text.size() <= kArenaInline) {
    char* out = arena_ + arena_used_;
    copy_bytes(out, text.data(), text.size());
    arena_used_ += text.size();
    return {out, text.size()};
  }
  if (block_left_ < text.size()) {
    const std::size_t bytes = std::max(kTextBlock, sizeof(TextBlock) + text.size());
    auto* block = new (take_block(bytes)) TextBlock{blocks_, bytes};
    blocks_ = block;
    block_free_ = reinterpret_cast<char*>(block + 1);
    block_left_ = bytes - sizeof(TextBlock);
  }
  char* out = block_free_;
  copy_bytes(out, text.data(), text.size());
  block_free_ += text.size();
  block_left_ -= text.size();
  return {out, text.size()};
}

}  // namespace spindle::http
