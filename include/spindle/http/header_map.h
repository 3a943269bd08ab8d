#pragma once
/// HeaderMap: HTTP header fields — case-insensitive names, insertion order kept, repeated names
/// allowed. Fields are string_views: into the read buffer for a parsed request (no copy), into
/// the map's own arena for values a handler adds. The first 8 fields and 256 bytes of copied
/// text are inside the map; beyond them it takes room from the thread's block cache
/// (base/block_cache.h), as a request's other objects do. A map is small on purpose: requests in
/// flight each hold several (the request, the response, a proxied request's head, the upstream's
/// answer), some in their fibers' stacks, and at a thousand in flight the bytes each request
/// spans are what the worker pays for (docs/performance.md, "Smaller header maps").

#include <cassert>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <type_traits>

#include "spindle/http/tokens.h"

namespace spindle::http {

/// True if `a` and `b` are equal ignoring ASCII case. (The size check is inline: most
/// comparisons of field names end there.)
inline bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && detail::iequals_same_size(a, b);
}

/// `s` without leading and trailing spaces and tabs (RFC 9110 OWS).
inline std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// Calls `fn(item)` for each item of a comma-separated list value (RFC 9110 §5.6.1: items
/// trimmed of spaces and tabs, empty ones skipped), in order. If `fn` returns bool, false stops
/// the walk. The one way spindle reads a list field.
template <typename Fn>
void for_each_list_item(std::string_view list, Fn&& fn) {
  while (!list.empty()) {
    std::size_t comma = list.find(',');
    std::string_view item = trim_ows(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (item.empty()) continue;
    if constexpr (std::is_same_v<decltype(fn(item)), bool>) {
      if (!fn(item)) return;
    } else {
      fn(item);
    }
  }
}

/// True if a comma-separated list value (as of Connection or Vary) holds `token`, compared
/// without regard to case.
bool list_has_token(std::string_view list, std::string_view token);

/// True if an Accept-Encoding value lists `coding` without q=0.
bool accepts_encoding(std::string_view accept_encoding, std::string_view coding);

/// One header field.
struct Field {
  /// The name as received or added (compare with iequals).
  std::string_view name;
  /// The value, without surrounding whitespace.
  std::string_view value;
  /// The name's token (tokens.h) when spindle knows the name, else nullptr: a field of a
  /// HeaderMap always carries it, so `field.token == &token::kHost` is how to ask.
  const Token* token = nullptr;
};

/// An ordered multimap of header fields.
class HeaderMap {
 public:
  /// An empty map. User-provided, not defaulted: value-initializing a class whose default
  /// constructor is defaulted zeroes the whole object first (2 KiB here, for every
  /// `HeaderMap()` and every `make_unique<HeaderMap>()`).
  HeaderMap() {}
  /// A map holding copies of `fields`, in order (for requests built in code).
  HeaderMap(std::initializer_list<std::pair<std::string_view, std::string_view>> fields) {
    for (const auto& [name, value] : fields) add(name, value);
  }
  HeaderMap(const HeaderMap&) = delete;
  HeaderMap& operator=(const HeaderMap&) = delete;
  /// Moves the fields; views into the moved-from map's own text are re-pointed to ours.
  HeaderMap(HeaderMap&& other) noexcept { take(std::move(other)); }
  ~HeaderMap() {
    if (more_ != nullptr || blocks_ != nullptr) release_overflow();
  }
  HeaderMap& operator=(HeaderMap&& other) noexcept {
    if (this != &other) {
      clear();
      take(std::move(other));
    }
    return *this;
  }

  /// Appends a field whose text outlives the map (a parsed buffer, a literal). No copy.
  void add_view(std::string_view name, std::string_view value) {
    add_field({name, value, find_token(name)});
  }
  /// Appends a field of a known name (written in lower case) whose value outlives the map.
  void add_view(const Token& name, std::string_view value) { add_field({name.name, value, &name}); }
  /// Appends a field of a known name as `name` spells it ("Content-Type" for
  /// token::kContentType: the same name, any case), whose text outlives the map. No lookup.
  void add_view(std::string_view name, const Token& token, std::string_view value) {
    assert(find_token(name) == &token);
    add_field({name, value, &token});
  }
  /// Appends a field of another map whose text outlives this one (its token kept). No copy.
  void add_view(const Field& field) {
    assert(field.token == find_token(field.name));
    add_field(field);
  }
  /// Appends a field, copying name and value into the map.
  void add(std::string_view name, std::string_view value);
  /// Appends a copy of a field of another map (its token kept).
  void add(const Field& field) {
    assert(field.token == find_token(field.name));
    add_field({copy(field.name), copy(field.value), field.token});
  }
  /// Appends a copy of a field whose name is, or will be sent, in lower case (HTTP/2's): a
  /// known name is then its token's text, which is not copied; another is copied as it is.
  void add_lower_case(const Field& field) {
    if (field.token != nullptr) {
      add_with_static_name(field.token->name, *field.token, field.value);
    } else {
      add(field);
    }
  }
  /// Appends a field whose name outlives the map (a literal), copying only the value.
  void add_with_static_name(std::string_view name, std::string_view value) {
    add_view(name, copy(value));
  }
  /// The same for a known name as `name` spells it: no lookup.
  void add_with_static_name(std::string_view name, const Token& token, std::string_view value) {
    add_view(name, token, copy(value));
  }
  /// Replaces every field named `name` with one field (copied).
  void set(std::string_view name, std::string_view value);
  /// Removes every field named `name`; returns how many.
  std::size_t erase(std::string_view name);
  std::size_t erase(const Token& name) {
    return erase_if([&](const Field& f) { return f.token == &name; });
  }
  /// Removes every field for which `pred(field)` is true; returns how many.
  template <typename Pred>
  std::size_t erase_if(Pred&& pred) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < size_; ++i) {
      if (!pred(at(i))) at(kept++) = at(i);
    }
    return shrink_to(kept);
  }
  /// Removes everything (keeps the first arena block).
  void clear() {
    size_ = 0;
    flags_ = 0;
    never_indexed_ = false;
    arena_used_ = 0;
    if (more_ != nullptr || blocks_ != nullptr) release_overflow();
  }

  /// The first value of `name`, if present.
  std::optional<std::string_view> get(std::string_view name) const;
  /// The first value of a known name: pointer compares.
  std::optional<std::string_view> get(const Token& name) const {
    for (const Field& f : *this) {
      if (f.token == &name) return f.value;
    }
    return std::nullopt;
  }
  /// True if a field named `name` is present.
  bool contains(std::string_view name) const { return get(name).has_value(); }
  bool contains(const Token& name) const { return get(name).has_value(); }
  /// How many fields are named `name`.
  std::size_t count(std::string_view name) const;
  std::size_t count(const Token& name) const {
    std::size_t n = 0;
    for (const Field& f : *this) n += f.token == &name ? 1 : 0;
    return n;
  }
  /// True if `name`'s comma-separated values contain `token` (case-insensitive), as for
  /// `Connection: keep-alive, Upgrade`.
  bool has_token(std::string_view name, std::string_view token) const;
  bool has_token(const Token& name, std::string_view token) const;

  /// False if no field the map holds, or held since it was last cleared, has a token with
  /// any of the field_flag bits `flags`: a scan for such fields (the hop-by-hop ones, say) is
  /// then known to find none. (Erasing a field leaves its flags here: true may be stale.)
  bool may_hold(std::uint16_t flags) const { return (flags_ & flags) != 0; }

  /// Notes that a field of the message came "never indexed" (HTTP/2's HPACK, RFC 7541 §6.2.3):
  /// whoever sends the message on over HTTP/2 writes every field of it so, as an intermediary
  /// must for that one (which one is not kept: never indexed more than asked is allowed). Kept
  /// by a move, forgotten by clear().
  void mark_never_indexed() { never_indexed_ = true; }
  /// See mark_never_indexed.
  bool never_indexed() const { return never_indexed_; }

  /// Number of fields.
  std::size_t size() const { return size_; }
  /// True if there are none.
  bool empty() const { return size_ == 0; }
  /// Field `i` in insertion order.
  const Field& operator[](std::size_t i) const {
    return i < kInline ? inline_.at[i] : more_[i - kInline];
  }

  /// Iteration in insertion order.
  class Iterator {
   public:
    Iterator(const HeaderMap* map, std::size_t i) : map_(map), i_(i) {}
    const Field& operator*() const { return (*map_)[i_]; }
    const Field* operator->() const { return &(*map_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const Iterator& o) const { return i_ == o.i_; }

   private:
    const HeaderMap* map_;
    std::size_t i_;
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size_}; }

 private:
  static constexpr std::size_t kInline = 8;
  static constexpr std::size_t kArenaInline = 256;
  /// Room for fields beyond kInline made at the first of them (then doubled as needed).
  static constexpr std::size_t kMoreFirst = 24;
  /// Copied text beyond the arena goes into blocks of this many bytes, header included (a
  /// size class of the block cache's exactly), or one block as large as a longer text needs.
  static constexpr std::size_t kTextBlock = 2048;

  Field& at(std::size_t i) { return i < kInline ? inline_.at[i] : more_[i - kInline]; }
  void add_field(const Field& field) {
    if (field.token != nullptr) flags_ |= field.token->flags;
    if (size_ < kInline) {
      inline_.at[size_++] = field;
    } else {
      add_overflow(field);
    }
  }
  /// Keeps the first `kept` fields; returns how many went.
  std::size_t shrink_to(std::size_t kept);
  /// add_field beyond the inline fields.
  void add_overflow(const Field& field);
  /// True if `f` is named `name`, whose token is `token` (nullptr for an unknown name).
  static bool named(const Field& f, std::string_view name, const Token* token) {
    return token != nullptr ? f.token == token : f.token == nullptr && iequals(f.name, name);
  }
  /// Gives back the room for fields and text beyond the inline ones (clear(), destruction).
  void release_overflow();
  /// The move: fields, arena text (re-pointing views into it) and blocks.
  void take(HeaderMap&& other) noexcept;
  /// Copies `text` into the arena; the view stays valid until clear() or destruction.
  std::string_view copy(std::string_view text);

  // The counts and pointers come first, beside the first fields: a map with a few fields and
  // a little copied text then touches few cache lines (with a thousand requests in flight
  // each line a request touches is likely a miss).
  /// Number of fields.
  std::size_t size_ = 0;
  /// The field_flag bits of every field added since the last clear() (may_hold).
  std::uint16_t flags_ = 0;
  /// See mark_never_indexed. (In the padding after flags_: the map is no larger.)
  bool never_indexed_ = false;
  /// How much of the first arena block is used.
  std::size_t arena_used_ = 0;
  /// Free bytes left at the end of the last block, and where they start.
  char* block_free_ = nullptr;
  std::size_t block_left_ = 0;
  /// Fields beyond kInline (size_ - kInline of them), in room for more_room_.
  Field* more_ = nullptr;
  std::size_t more_room_ = 0;
  /// Further blocks for copied text that does not fit, newest first (never moved, so views
  /// stay valid).
  struct TextBlock {
    TextBlock* next;
    std::size_t bytes;  // the whole block's, header included
  };
  TextBlock* blocks_ = nullptr;
  /// Storage for the first kInline fields, left uninitialized (each is written before it is
  /// read): a map is made per request and per response, and zeroing it each time shows.
  union InlineFields {
    InlineFields() {}
    Field at[kInline];
  } inline_;
  /// The first arena block.
  char arena_[kArenaInline];
};

}  // namespace spindle::http
