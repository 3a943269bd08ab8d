// HPACK (RFC 7541): the static table, integers and strings, the dynamic table, the decoder and
// the encoder. Huffman coding is in huffman.cc.
#include "spindle/h2/hpack.h"

#include <array>
#include <cassert>
#include <cstring>

#include "spindle/http/rules.h"
#include "spindle/http/tokens.h"

namespace spindle::h2::hpack {
namespace {

struct StaticEntry {
  std::string_view name;
  std::string_view value;
  const http::Token* token = nullptr;
};

// RFC 7541 Appendix A: the static table's values by index (index 1 is the first); the names
// are the token table's (http/tokens.h: each name's first index).
constexpr std::array<std::string_view, 61> kStaticValues = {
    "",    "GET", "POST", "/",   "/index.html", "http", "https", "200",
    "204", "206", "304",  "400", "404",         "500",  "",      "gzip, deflate"};
constexpr std::array<StaticEntry, 61> static_table() {
  std::array<StaticEntry, 61> table{};
  // The names in HPACK's order, last first: each runs from its first index to the next's.
  for (std::size_t t = std::size(http::detail::kTokens); t-- > 0;) {
    const http::Token& token = http::detail::kTokens[t];
    if (token.hpack_index == 0) continue;
    for (std::size_t i = token.hpack_index - 1; i < table.size() && table[i].name.empty(); ++i) {
      table[i].name = token.name;
      table[i].value = kStaticValues[i];
      table[i].token = &token;
    }
  }
  return table;
}
constexpr std::array<StaticEntry, 61> kStatic = static_table();
constexpr std::size_t kStaticCount = kStatic.size();
constexpr std::size_t kEntryOverhead = 32;  // RFC 7541 §4.1

// Reads an integer of `prefix_bits` at `at`; false if the block ends first or it passes 32 bits.
[[gnu::always_inline]] inline Status read_integer(std::span<const std::uint8_t> in, std::size_t& at,
                                                  int prefix_bits, std::uint64_t& value) {
  if (at >= in.size()) return Status::kTruncated;
  const std::uint8_t mask = static_cast<std::uint8_t>((1u << prefix_bits) - 1);
  value = in[at++] & mask;
  if (value < mask) return Status::kOk;
  for (int shift = 0;; shift += 7) {
    if (at >= in.size()) return Status::kTruncated;
    std::uint8_t byte = in[at++];
    if (shift > 28) return Status::kBadInteger;
    value += static_cast<std::uint64_t>(byte & 0x7f) << shift;
    if (value > UINT32_MAX) return Status::kBadInteger;
    if ((byte & 0x80) == 0) return Status::kOk;
  }
}

// Reads a string literal: a view into the block, or the Huffman decoding in `buffer`.
// A string literal's bytes at `at` (its length read), and whether they are Huffman-coded.
Status take_string(std::span<const std::uint8_t> in, std::size_t& at,
                   std::span<const std::uint8_t>& bytes, bool& huffman) {
  if (at >= in.size()) return Status::kTruncated;
  huffman = (in[at] & 0x80) != 0;
  std::uint64_t length = 0;
  if (Status s = read_integer(in, at, 7, length); s != Status::kOk) return s;
  if (length > in.size() - at) return Status::kTruncated;
  bytes = in.subspan(at, static_cast<std::size_t>(length));
  at += bytes.size();
  return Status::kOk;
}

std::string_view as_text(std::span<const std::uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// A string literal's text: its bytes, or decoded from Huffman into `buffer`.
Status string_text(std::span<const std::uint8_t> bytes, bool huffman, std::string& buffer,
                   std::string_view& out) {
  if (!huffman) {
    out = as_text(bytes);
    return Status::kOk;
  }
  buffer.clear();
  if (!huffman::decode(bytes, buffer)) return Status::kBadHuffman;
  out = buffer;
  return Status::kOk;
}

Status read_string(std::span<const std::uint8_t> in, std::size_t& at, std::string& buffer,
                   std::string_view& out) {
  std::span<const std::uint8_t> bytes;
  bool huffman = false;
  if (Status s = take_string(in, at, bytes, huffman); s != Status::kOk) return s;
  return string_text(bytes, huffman, buffer, out);
}

// An HPACK integer at `p` (at most kMaxIntegerBytes); returns its end.
constexpr std::size_t kMaxIntegerBytes = 11;  // 1 + ceil(64 / 7)
char* put_integer(char* p, std::uint64_t value, int prefix_bits, std::uint8_t first_bits) {
  const std::uint64_t mask = (1u << prefix_bits) - 1;
  if (value < mask) {
    *p++ = static_cast<char>(first_bits | value);
    return p;
  }
  *p++ = static_cast<char>(first_bits | mask);
  value -= mask;
  while (value >= 0x80) {
    *p++ = static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  *p++ = static_cast<char>(value);
  return p;
}

// A string literal at `p`, as it is; returns its end. (An empty value's data() may be null,
// which memcpy may not be given even for no bytes: an upstream's empty field is valid.)
char* put_literal(char* p, std::string_view text) {
  p = put_integer(p, text.size(), 7, 0x00);
  if (!text.empty()) std::memcpy(p, text.data(), text.size());
  return p + text.size();
}

// A string literal at `p`, Huffman-coded when that is shorter (at most kMaxIntegerBytes +
// text.size() bytes); returns its end.
char* put_string(char* p, std::string_view text) {
  if (text.size() < 0x7f) {
    // The length takes one byte either way: the code is written once, behind it, and kept if
    // it came out shorter.
    if (char* end = huffman::encode_if_shorter(text, p + 1); end != nullptr) {
      *p = static_cast<char>(0x80 | (end - p - 1));
      return end;
    }
    return put_literal(p, text);
  }
  const std::size_t coded = huffman::encoded_size(text);
  if (coded < text.size()) {
    p = put_integer(p, coded, 7, 0x80);
    return huffman::encode(text, p);
  }
  return put_literal(p, text);
}

}  // namespace

std::string_view to_string(Status status) {
  switch (status) {
    case Status::kOk:
      return "ok";
    case Status::kTruncated:
      return "header block truncated";
    case Status::kBadInteger:
      return "integer too large";
    case Status::kBadIndex:
      return "bad table index";
    case Status::kBadHuffman:
      return "bad Huffman string";
    case Status::kBadTableSizeUpdate:
      return "bad dynamic table size update";
    case Status::kHeaderListTooLarge:
      return "header list too large";
  }
  return "unknown";
}

void encode_integer(std::uint64_t value, int prefix_bits, std::uint8_t first_bits,
                    std::string& out) {
  char bytes[kMaxIntegerBytes];
  out.append(bytes, put_integer(bytes, value, prefix_bits, first_bits));
}

// --- RFC 9113 §8.2.1 ---------------------------------------------------------------------

namespace {
// The characters of a field name in HTTP/2: token characters, lower case.
constexpr std::array<bool, 256> kNameChars = [] {
  std::array<bool, 256> ok{};
  for (int c = 0x21; c < 0x7f; ++c) ok[c] = !(c >= 'A' && c <= 'Z');
  for (char c : std::string_view(":(),/;<=>?@[\\]{}\"")) ok[static_cast<std::uint8_t>(c)] = false;
  return ok;
}();
}  // namespace

}  // namespace spindle::h2::hpack

namespace spindle::h2 {

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  // A pseudo-field's ':' is allowed first only.
  for (std::size_t i = name.front() == ':' ? 1 : 0; i < name.size(); ++i) {
    if (!hpack::kNameChars[static_cast<std::uint8_t>(name[i])]) return false;
  }
  return name.size() > 1 || name.front() != ':';
}

bool valid_value(std::string_view value) {
  if (value.empty()) return true;
  if (value.front() == ' ' || value.front() == '\t' || value.back() == ' ' ||
      value.back() == '\t') {
    return false;
  }
  // HTTP/1.1's rule (no control character but HTAB, no DEL), stricter than RFC 9113's (no NUL,
  // CR or LF): a value that could not go on as HTTP/1.1 is refused where it arrives, not by the
  // writer of an upstream request (which would blame the upstream).
  return http::is_field_value(value);
}

}  // namespace spindle::h2

namespace spindle::h2::hpack {

Field Field::to_send(const http::Field& f, std::string& names) {
  if (f.token != nullptr) return known(*f.token, f.value);
  const std::size_t at = names.size();
  assert(names.capacity() >= at + f.name.size());  // views into it must stay put
  for (char c : f.name)
    names.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  return {std::string_view(names).substr(at), f.value};
}

// --- DynamicTable ------------------------------------------------------------------------

const DynamicTable::Entry* DynamicTable::get(std::size_t index) const {
  if (index <= kStaticCount || index - kStaticCount - 1 >= count_) return nullptr;
  return &at(index - kStaticCount - 1);
}

void DynamicTable::add(std::string_view name, std::string_view value, const http::Token* token,
                       bool valid) {
  std::size_t entry = name.size() + value.size() + kEntryOverhead;
  if (entry > max_size_) {
    evict_to(0);  // RFC 7541 §4.4: an entry larger than the table empties it
    return;
  }
  // Copied first: the name may be that of an entry the insertion evicts.
  spare_.assign(name);
  spare_.append(value);
  evict_to(max_size_ - entry);
  if (count_ == ring_.size()) {
    // Full: twice the slots, the entries in order from slot 0 (oldest first).
    std::vector<Entry> grown(std::max<std::size_t>(4, ring_.size() * 2));
    for (std::size_t i = 0; i < count_; ++i) grown[count_ - 1 - i] = std::move(at(i));
    ring_ = std::move(grown);
    newest_ = count_ == 0 ? ring_.size() - 1 : count_ - 1;
  }
  newest_ = (newest_ + 1) & (ring_.size() - 1);
  Entry& slot = ring_[newest_];
  slot.bytes.swap(spare_);  // the slot's old storage is the next entry's
  slot.name_size = static_cast<std::uint32_t>(name.size());
  slot.token = token;
  slot.valid = valid;
  ++count_;
  ++added_;
  size_ += entry;
}

void DynamicTable::set_max_size(std::size_t max_size) {
  max_size_ = max_size;
  evict_to(max_size);
}

void DynamicTable::evict_to(std::size_t size) {
  while (size_ > size && count_ != 0) {
    Entry& oldest = at(count_ - 1);
    size_ -= oldest.bytes.size() + kEntryOverhead;
    oldest.bytes.clear();  // keeps its storage for a later entry
    --count_;
  }
}

std::size_t DynamicTable::find(std::string_view name, const http::Token* token,
                               std::string_view value, std::size_t& name_only) const {
  for (std::size_t i = 0; i < count_; ++i) {
    const Entry& entry = at(i);
    if (entry.token != token || (token == nullptr && entry.name() != name)) continue;
    if (entry.value() == value) return kStaticCount + 1 + i;
    if (name_only == 0) name_only = kStaticCount + 1 + i;
  }
  return 0;
}

// --- Decoder -----------------------------------------------------------------------------

const ValueMemo::Entry* ValueMemo::find(std::span<const std::uint8_t> coded) {
  for (Entry& e : entries_) {
    if (e.coded_size == coded.size() && e.coded_size != 0 &&
        std::memcmp(e.coded, coded.data(), coded.size()) == 0) {
      ++hits_;
      e.used = true;
      return &e;
    }
  }
  return nullptr;
}

const ValueMemo::Entry* ValueMemo::add(std::span<const std::uint8_t> coded, std::string_view text) {
  if (coded.empty() || coded.size() > kMaxCoded || text.size() > kMaxText) return nullptr;
  // (At most one turn of the clock: it clears each used mark it passes.)
  Entry* slot = nullptr;
  while (slot == nullptr) {
    Entry& e = entries_[next_];
    next_ = (next_ + 1) % kEntries;
    if (e.used) {
      e.used = false;
    } else {
      slot = &e;
    }
  }
  Entry& e = *slot;
  e.coded_size = static_cast<std::uint8_t>(coded.size());
  if (!coded.empty()) std::memcpy(e.coded, coded.data(), coded.size());
  e.text_size = static_cast<std::uint8_t>(text.size());
  if (!text.empty()) std::memcpy(e.text, text.data(), text.size());
  e.valid = valid_value(text);
  return &e;
}

Status Decoder::decode_with(std::span<const std::uint8_t> in, void* sink,
                            void (*deliver)(void*, const Decoded&), bool* seen, std::size_t* read) {
  std::size_t at = 0;
  std::size_t list_size = 0;
  bool field_seen = seen != nullptr && *seen;
  bool over_limit = false;
  // skim(): a representation cut at the end of the piece is left for the next (nothing of it
  // has changed the table: each changes it only once read whole).
  const auto status = [&](std::size_t begun, Status s) {
    if (read == nullptr) return s;
    *read = begun;
    *seen = field_seen;
    return s == Status::kTruncated ? Status::kOk : s;
  };
  while (at < in.size()) {
    const std::size_t begun = at;
    const std::uint8_t first = in[at];
    if ((first & 0xe0) == 0x20) {  // 001xxxxx: dynamic table size update
      // Only at the start of a block (RFC 7541 §4.2), and within our setting.
      std::uint64_t size = 0;
      if (Status s = read_integer(in, at, 5, size); s != Status::kOk) return status(begun, s);
      if (field_seen || size > max_table_size_) return status(begun, Status::kBadTableSizeUpdate);
      table_.set_max_size(static_cast<std::size_t>(size));
      continue;
    }
    field_seen = true;
    Decoded d;
    http::Field& f = d.field;
    if (first & 0x80) {  // 1xxxxxxx: indexed field
      std::uint64_t index = 0;
      if (Status s = read_integer(in, at, 7, index); s != Status::kOk) return status(begun, s);
      if (index == 0) return status(begun, Status::kBadIndex);
      if (index <= kStaticCount) {
        const StaticEntry& e = kStatic[index - 1];
        f = {e.name, e.value, e.token};
        d.checked = true;
      } else if (const auto* entry = table_.get(static_cast<std::size_t>(index))) {
        f = {entry->name(), entry->value(), entry->token};
        d.checked = entry->valid;
      } else {
        return status(begun, Status::kBadIndex);
      }
    } else {
      // 01xxxxxx with indexing, 0001xxxx never indexed, 0000xxxx without indexing.
      const bool indexing = (first & 0xc0) == 0x40;
      d.never_indexed = (first & 0xf0) == 0x10;
      std::uint64_t index = 0;
      if (Status s = read_integer(in, at, indexing ? 6 : 4, index); s != Status::kOk)
        return status(begun, s);
      if (index == 0) {
        if (Status s = read_string(in, at, name_buffer_, f.name); s != Status::kOk)
          return status(begun, s);
        f.token = http::find_token(f.name);
      } else if (index <= kStaticCount) {
        f.name = kStatic[index - 1].name;
        f.token = kStatic[index - 1].token;
        d.name_checked = true;
      } else if (const auto* entry = table_.get(static_cast<std::size_t>(index))) {
        f.name = entry->name();
        f.token = entry->token;
        d.name_checked = entry->valid;  // (a valid entry's name and value both are)
      } else {
        return status(begun, Status::kBadIndex);
      }
      // The value: a literal, or Huffman-coded (decoded once, with the memo, if it came before).
      std::span<const std::uint8_t> coded;
      bool huffman = false;
      const ValueMemo::Entry* memo = nullptr;
      if (Status s = take_string(in, at, coded, huffman); s != Status::kOk) return status(begun, s);
      if (huffman && memo_ && (memo = memo_->find(coded)) != nullptr) {
        f.value = memo->text_view();
      } else {
        if (Status s = string_text(coded, huffman, value_buffer_, f.value); s != Status::kOk) {
          return status(begun, s);
        }
        if (huffman && memo_) memo = memo_->add(coded, f.value);
      }
      const bool table_too_small =
          indexing && f.name.size() + f.value.size() + kEntryOverhead > table_.max_size();
      if (memo != nullptr && (!indexing || table_too_small)) {
        d.checked = d.name_checked && memo->valid;
      }
      if (indexing) {
        if (table_too_small) {
          // Too large for the table, which it empties (RFC 7541 §4.4; with a table of size 0,
          // every field sent "with incremental indexing"); a name of one of the entries going
          // is kept aside first (the value is a literal: in the block or its buffer).
          if (index > kStaticCount) {
            name_buffer_.assign(f.name.data(), f.name.size());
            f.name = name_buffer_;
          }
          table_.clear();
        } else {
          // Checked once for every later reference to it; then read from the new entry (the
          // name may have been one of those evicted).
          d.checked = (d.name_checked || valid_name(f.name)) &&
                      (memo != nullptr ? memo->valid : valid_value(f.value));
          table_.add(f.name, f.value, f.token, d.checked);
          const auto* added = table_.get(kStaticCount + 1);
          f.name = added->name();
          f.value = added->value();
        }
      }
    }
    // Past the limit nothing more is delivered, but the block is read to its end: the table
    // must stay in step with the peer's (the connection may go on).
    if (deliver == nullptr) continue;  // skim()
    list_size += f.name.size() + f.value.size() + kEntryOverhead;
    if (list_size > max_list_) {
      over_limit = true;
      continue;
    }
    deliver(sink, d);
  }
  if (read != nullptr) return status(in.size(), Status::kOk);
  return over_limit ? Status::kHeaderListTooLarge : Status::kOk;
}

// --- Encoder -----------------------------------------------------------------------------

void Encoder::set_peer_max_table_size(std::size_t size) {
  std::size_t use = std::min(size, own_limit_);
  smallest_since_update_ = std::min(smallest_since_update_, use);
  update_pending_ = true;
  table_.set_max_size(use);
}

namespace {
std::uint32_t token_number(const http::Token* token) {
  return static_cast<std::uint32_t>(token - http::detail::kTokens) + 1;
}
std::size_t recent_slot(const http::Token* token) { return token_number(token) % 16; }
}  // namespace

std::size_t Encoder::find(const Field& f, const http::Token* token, std::size_t& name_only,
                          bool whole_table) const {
  if (token != nullptr) {
    const Recent& recent = recent_[recent_slot(token)];
    if (recent.token == token_number(token)) {
      if (std::size_t index = table_.index_of_added(recent.number); index != 0) {
        const DynamicTable::Entry* entry = table_.get(index);
        if (entry->token == token) {
          if (entry->value() == f.value) return index;
          name_only = index;
        }
      }
    }
  }
  return whole_table ? table_.find(f.name, token, f.value, name_only) : 0;
}

bool Encoder::repeats_last(std::span<const Field> fields) const {
  // (Each block either replaces the last one or forgets it: the table has not changed since,
  // unless the peer's size setting did, which leaves an update pending.)
  if (last_.bytes.empty() || update_pending_ || fields.size() != last_.fields.size()) {
    return false;
  }
  const char* text = last_.text.data();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const Field& f = fields[i];
    const LastBlock::Shape& was = last_.fields[i];
    if (f.name.size() != was.name_size || f.value.size() != was.value_size ||
        f.sensitive != was.sensitive) {
      return false;
    }
    if ((f.token == nullptr || f.token != was.token) &&
        std::memcmp(f.name.data(), text, f.name.size()) != 0) {
      return false;
    }
    text += was.name_size;
    if (was.literal_at == LastBlock::kNoLiteral &&
        std::memcmp(f.value.data(), text, f.value.size()) != 0) {
      return false;
    }
    text += was.value_size;
  }
  return true;
}

void Encoder::remember(std::span<const Field> fields, std::string_view bytes) {
  last_.fields.clear();
  last_.text.clear();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const Field& f = fields[i];
    last_.fields.push_back({f.token, static_cast<std::uint32_t>(f.name.size()),
                            static_cast<std::uint32_t>(f.value.size()), f.sensitive,
                            literal_at_[i]});
    last_.text.append(f.name).append(f.value);
  }
  last_.bytes.assign(bytes);
}

void Encoder::encode(std::span<const Field> fields, std::string& out) {
  if (repeats_last(fields)) {
    const std::size_t start = out.size();
    out.append(last_.bytes);
    for (std::size_t i = 0; i < fields.size(); ++i) {
      if (std::uint32_t at = last_.fields[i].literal_at;
          at != LastBlock::kNoLiteral && !fields[i].value.empty()) {
        std::memcpy(out.data() + start + at, fields[i].value.data(), fields[i].value.size());
      }
    }
    ++copied_blocks_;
    return;
  }
  // Written in place: room for the worst case first (each field's name and value as literals
  // with their lengths and its index), cut to what was written.
  std::size_t room = 2 * kMaxIntegerBytes;  // table size updates
  for (const Field& f : fields) room += 3 * kMaxIntegerBytes + f.name.size() + f.value.size();
  const std::size_t start = out.size();
  const std::uint32_t added = table_.added();
  const bool update = update_pending_;
  out.resize_and_overwrite(start + room, [&](char* data, std::size_t) {
    // (The end comes from what was written: g++ 12 may pass the grown capacity as size.)
    return static_cast<std::size_t>(encode_to(fields, data + start) - data);
  });
  if (!update && table_.added() == added && !fields.empty()) {
    remember(fields, std::string_view(out).substr(start));
  } else {
    last_.bytes.clear();
  }
}

char* Encoder::encode_to(std::span<const Field> fields, char* p) {
  char* const block = p;
  literal_at_.assign(fields.size(), LastBlock::kNoLiteral);
  if (update_pending_) {
    // The smallest size since the last block first (so the peer evicts as we did), then the
    // size in force (RFC 7541 §4.2).
    if (smallest_since_update_ < table_.max_size()) {
      p = put_integer(p, smallest_since_update_, 5, 0x20);
    }
    p = put_integer(p, table_.max_size(), 5, 0x20);
    update_pending_ = false;
    smallest_since_update_ = SIZE_MAX;
  }
  for (std::size_t field = 0; field < fields.size(); ++field) {
    const Field& f = fields[field];
    // The token table gives the name's first static index (entries of one name are
    // together) and whether its values are secrets or new in every message.
    // (Names go as given: a name in another case than the token's is written as it is.)
    const http::Token* token = f.token;
    if (token == nullptr) {
      token = http::find_token(f.name);
      if (token != nullptr && token->name != f.name) token = nullptr;
    }
    assert(token == nullptr || token->name == f.name);
    const std::size_t static_name = token == nullptr ? 0 : token->hpack_index;
    const std::uint16_t flags = token == nullptr ? 0 : token->flags;
    std::size_t static_full = 0;
    for (std::size_t i = static_name; i != 0 && i <= kStaticCount && kStatic[i - 1].token == token;
         ++i) {
      if (kStatic[i - 1].value == f.value) {
        static_full = i;
        break;
      }
    }
    const bool sensitive = f.sensitive || (flags & http::field_flag::kSensitive) != 0;
    if (static_full != 0 && !sensitive) {
      p = put_integer(p, static_full, 7, 0x80);
      continue;
    }
    const bool unique = (flags & http::field_flag::kUniquePerMessage) != 0;
    // A table many clients share keeps only values that name none of them (see
    // share_between_clients): any other is never found in it, and never put in it.
    const bool private_value = shared_ && (flags & http::field_flag::kSharedValue) == 0;
    // (A value unique to its message is not looked for, but its name is: see below.)
    std::size_t dynamic_name = 0;
    std::size_t dynamic_full = sensitive ? 0 : find(f, token, dynamic_name, !unique);
    if (private_value && dynamic_full != 0) {
      if (dynamic_name == 0) dynamic_name = dynamic_full;  // its name, not its value
      dynamic_full = 0;
    }
    if (dynamic_full != 0) {
      p = put_integer(p, dynamic_full, 7, 0x80);
      continue;
    }
    std::size_t name_index = static_name != 0 ? static_name : dynamic_name;
    // Indexed for next time unless sensitive or too large to be worth a place in the table. A
    // value unique to its message is not (an entry that would only push useful ones out),
    // except while its name is nowhere in the tables: one entry then lets every later message
    // refer to the name (x-request-id, traceparent) instead of spelling it out. (On a shared
    // table that entry's value is never referred to: only its name is.)
    const bool indexing = !sensitive && (unique ? name_index == 0 : !private_value) &&
                          f.name.size() + f.value.size() + kEntryOverhead <= table_.max_size() / 2;
    if (indexing) {
      p = put_integer(p, name_index, 6, 0x40);
    } else {
      p = put_integer(p, name_index, 4, sensitive || private_value ? 0x10 : 0x00);
    }
    if (name_index == 0) p = put_string(p, f.name);
    // A value new in every message (a random id) goes as it is: Huffman would save about a
    // third of its hex digits, for more instructions than the rest of its field costs; and a
    // copy of this block (repeats_last) takes the next value of its length in its place.
    if (unique) {
      p = put_literal(p, f.value);
      literal_at_[field] = static_cast<std::uint32_t>(p - block - f.value.size());
    } else {
      p = put_string(p, f.value);
    }
    if (indexing) {
      table_.add(f.name, f.value, token);
      if (token != nullptr) recent_[recent_slot(token)] = {token_number(token), table_.added()};
    }
  }
  return p;
}

}  // namespace spindle::h2::hpack
