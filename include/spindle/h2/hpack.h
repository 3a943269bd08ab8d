#pragma once
/// HPACK (RFC 7541), header compression for HTTP/2: pure code, bytes in and fields out, fields
/// in and bytes out; no I/O, no allocation per decoded field.
///
///   hpack::Decoder decoder;
///   auto status = decoder.decode(block, [&](const hpack::Decoded& f) {
///     ...  // f.field's views are valid during the call only: copy what you keep
///   });
///
///   hpack::Encoder encoder;
///   std::string out;
///   encoder.encode({{":status", "200"}, {"content-type", "text/plain"}}, out);
///
/// One Decoder per connection for what the peer sends, one Encoder for what we send: each keeps
/// the dynamic table of its direction.

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "spindle/http/header_map.h"
#include "spindle/http/release.h"

namespace spindle::h2 {

/// RFC 9113 §8.2.1: a field name of HTTP/2 is token characters in lower case (a pseudo-field's
/// ':' first only); a value neither starts nor ends with a space or tab, and holds what an
/// HTTP/1.1 value may (http::is_field_value: no control character but tab, no DEL; stricter
/// than §8.2.1's no NUL, CR or LF, so that what HTTP/2 takes can go on as HTTP/1.1). The decoder
/// checks each dynamic table entry once, when it is added (Decoded::checked).
bool valid_name(std::string_view name);
bool valid_value(std::string_view value);

}  // namespace spindle::h2

namespace spindle::h2::hpack {

/// Why a header block could not be decoded (any of them is a connection error,
/// COMPRESSION_ERROR, except kHeaderListTooLarge, which the caller may answer per stream).
enum class Status {
  kOk = 0,
  kTruncated,           ///< the block ends inside a representation
  kBadInteger,          ///< an integer longer than 32 bits
  kBadIndex,            ///< index 0, or past the static and dynamic tables
  kBadHuffman,          ///< bad padding, or the EOS symbol inside a string
  kBadTableSizeUpdate,  ///< above the allowed size, or after the first field of a block
  kHeaderListTooLarge,  ///< the decoded fields (name + value + 32 each) passed the limit
};

std::string_view to_string(Status status);

/// One field to encode. `sensitive`: never indexed, here or by any intermediary (RFC 7541
/// §7.1.3); so always are the names the token table marks sensitive (authorization,
/// proxy-authorization, cookie, set-cookie, x-api-key and the like: http/tokens.h).
/// `token`: the name's token (http/tokens.h), which must then be the name as given (lower
/// case); left null, the encoder looks the name up itself.
struct Field {
  std::string_view name;
  std::string_view value;
  bool sensitive = false;
  const http::Token* token = nullptr;

  /// A field of a known name.
  static Field known(const http::Token& name, std::string_view value) {
    return {name.name, value, false, &name};
  }
  /// A HeaderMap's field to send: a known name as its token's (lower case), another
  /// lower-cased into `names` (made room in beforehand: make_room_for_names).
  static Field to_send(const http::Field& f, std::string& names);
  /// Empties `names` and makes room in it for every name of `fields`: to_send's views into it
  /// then stay put.
  static void make_room_for_names(std::string& names, const http::HeaderMap& fields) {
    std::size_t bytes = 0;
    for (const http::Field& f : fields) bytes += f.name.size();
    names.clear();
    names.reserve(bytes);
  }
};

/// One decoded field: its views (into the block, the decoder's buffer or its table) valid
/// during the call only; the name's token when it has one (found once: for a table entry when
/// it was added). `checked`: the name and value are known to pass valid_name and valid_value
/// (a static entry, or a dynamic one checked when added); otherwise the caller checks them.
/// `name_checked`: the name alone is known to pass (a literal value under a table's name).
struct Decoded {
  http::Field field;
  bool checked = false;
  bool name_checked = false;
  /// Sent as a literal never indexed (RFC 7541 §6.2.3): whoever passes it on must send it so.
  bool never_indexed = false;
};

/// Huffman coding (RFC 7541 Appendix B), table-driven both ways.
namespace huffman {
/// Bytes `text` takes Huffman-coded.
std::size_t encoded_size(std::string_view text);
/// Appends `text` Huffman-coded (padded with the EOS prefix) to `out`.
void encode(std::string_view text, std::string& out);
/// Writes `text` Huffman-coded at `out`: exactly encoded_size(text) bytes; returns their end.
char* encode(std::string_view text, char* out);
/// Writes `text` Huffman-coded at `out` if that takes fewer bytes than `text` (returns their
/// end), else returns nullptr; writes only within `out`'s first text.size() bytes either way.
char* encode_if_shorter(std::string_view text, char* out);
/// Appends the decoding of `code` to `out`; false if it is not a valid Huffman string.
bool decode(std::span<const std::uint8_t> code, std::string& out);
}  // namespace huffman

/// The dynamic table of one direction: the newest entry is index 62 (after the 61 static
/// ones); each entry counts name + value + 32 bytes against the size. A ring: entries are
/// added at one end and evicted at the other, and the slot an entry leaves keeps its storage
/// for a later one, so a connection's table allocates only while it grows.
class DynamicTable {
 public:
  /// One entry: the name's bytes, then the value's, in one string; the name's token; whether
  /// the entry passed valid_name and valid_value (set by the decoder, which checks).
  struct Entry {
    std::string bytes;
    const http::Token* token = nullptr;
    std::uint32_t name_size = 0;  // (an entry is at most the table's size, itself 32-bit)
    bool valid = false;
    std::string_view name() const { return {bytes.data(), name_size}; }
    std::string_view value() const { return std::string_view(bytes).substr(name_size); }
  };

  explicit DynamicTable(std::size_t max_size) : max_size_(max_size) {}
  /// Entry `index` (62 and up), or nullptr. Valid until the next add, eviction or resize.
  const Entry* get(std::size_t index) const;
  /// Adds an entry, evicting the oldest to make room (an entry larger than the table empties
  /// it and is not added). `name` and `value` may be views into entries of the table.
  void add(std::string_view name, std::string_view value, const http::Token* token = nullptr,
           bool valid = false);
  void set_max_size(std::size_t max_size);
  /// Evicts every entry.
  void clear() { evict_to(0); }
  /// Gives back the storage kept for the next entry (the entries stay).
  void trim() { release(spare_); }
  std::size_t size() const { return size_; }
  std::size_t max_size() const { return max_size_; }
  std::size_t count() const { return count_; }
  /// Entries added since the table was made (the newest is number added()).
  std::uint32_t added() const { return added_; }
  /// The index (62 and up) of the entry that was number `number` to be added; 0 if it has
  /// been evicted since.
  std::size_t index_of_added(std::uint32_t number) const {
    const std::uint32_t age = added_ - number;
    return number != 0 && age < count_ ? 62 + age : 0;
  }
  /// The index (62 and up) of an entry named `name` with `value` (0 if none); in `name_only`
  /// the index of one named `name` (0 if none). With a token, names are compared by it (entries
  /// added with their tokens, as the encoder adds them).
  std::size_t find(std::string_view name, const http::Token* token, std::string_view value,
                   std::size_t& name_only) const;

 private:
  void evict_to(std::size_t size);
  /// Entry `i` of the ring, 0 the newest.
  Entry& at(std::size_t i) { return ring_[(newest_ - i) & (ring_.size() - 1)]; }
  const Entry& at(std::size_t i) const { return ring_[(newest_ - i) & (ring_.size() - 1)]; }

  /// The slots (a power of two of them; count_ in use, the newest at newest_, older ones
  /// before it, wrapping around).
  std::vector<Entry> ring_;
  std::size_t newest_ = 0;
  std::size_t count_ = 0;
  /// The next entry is made here before it takes a slot, whose storage then comes back here.
  std::string spare_;
  std::size_t size_ = 0;
  std::size_t max_size_;
  std::uint32_t added_ = 0;
};

/// Literal values decoded from Huffman, kept by their coded bytes: kEntries of up to kMaxCoded
/// bytes (see Decoder::enable_value_memo). A new one replaces the oldest not found again since
/// the last time it was passed over (a clock): values that keep coming stay, whatever the
/// number of values seen once (request ids, a date a second) between them.
class ValueMemo {
 public:
  static constexpr std::size_t kEntries = 8;
  static constexpr std::size_t kMaxCoded = 48;
  /// The most symbols kMaxCoded bytes may hold (the shortest code is 5 bits).
  static constexpr std::size_t kMaxText = kMaxCoded * 8 / 5;
  struct Entry {
    std::uint8_t coded_size = 0;  ///< 0: empty
    std::uint8_t text_size = 0;
    bool valid = false;  ///< the text passes valid_value
    bool used = false;   ///< found since the clock last passed it
    char coded[kMaxCoded];
    char text[kMaxText];
    std::string_view text_view() const { return {text, text_size}; }
  };
  /// The entry of a string coded as `coded`, or nullptr.
  const Entry* find(std::span<const std::uint8_t> coded);
  /// Keeps `text`, decoded from `coded`; nullptr if either is too long to keep.
  const Entry* add(std::span<const std::uint8_t> coded, std::string_view text);
  /// How many strings were found here (not decoded again).
  std::uint64_t hits() const { return hits_; }

 private:
  std::array<Entry, kEntries> entries_{};
  std::size_t next_ = 0;
  std::uint64_t hits_ = 0;
};

class Decoder {
 public:
  /// `max_table_size`: our SETTINGS_HEADER_TABLE_SIZE (the most a size update may ask);
  /// `max_header_list`: the most the decoded fields of one block may add up to (name + value
  /// + 32 each, as SETTINGS_MAX_HEADER_LIST_SIZE counts), so that a small block referencing
  /// a large entry many times (an "HPACK bomb") stops at the limit, not after.
  explicit Decoder(std::size_t max_table_size = 4096, std::size_t max_header_list = 65536)
      : table_(max_table_size), max_table_size_(max_table_size), max_list_(max_header_list) {}

  /// Decodes one whole header block, calling `on_field(const Decoded&)` (or
  /// `on_field(name, value)`) for each field in order (views valid during that call). Stops at the
  /// first error; the fields before it were delivered, and the decoder's table may be out of step
  /// with the peer's: the connection must end. Past the header list limit the fields are no longer
  /// delivered but the block is read to its end (the table stays in step): kHeaderListTooLarge, and
  /// the connection may go on.
  template <typename OnField>
  Status decode(std::span<const std::uint8_t> block, OnField&& on_field) {
    return decode_with(block, &on_field, [](void* sink, const Decoded& f) {
      auto& fn = *static_cast<std::remove_reference_t<OnField>*>(sink);
      if constexpr (std::is_invocable_v<OnField&, const Decoded&>) {
        fn(f);
      } else {
        fn(f.field.name, f.field.value);
      }
    });
  }

  /// Reads the next piece of a header block only for the table, delivering nothing (a block
  /// whose fields will never be kept, too large to gather whole): the whole representations at
  /// the start of `piece` are read; the bytes of one cut at its end are left, what the block's
  /// next piece must be appended to. `read` says how many bytes were read. `field_seen`: a
  /// field came in an earlier piece of the block (false for its first). Errors are the
  /// decode()'s: the connection must end.
  Status skim(std::span<const std::uint8_t> piece, bool& field_seen, std::size_t& read) {
    return decode_with(piece, nullptr, nullptr, &field_seen, &read);
  }

  /// Our SETTINGS_HEADER_TABLE_SIZE changed (acknowledged by the peer).
  void set_max_table_size(std::size_t size) { max_table_size_ = size; }
  /// Keeps the last few Huffman-coded literal values it decoded, by their coded bytes: a peer
  /// that sends the same values again and again without indexing them (nginx's responses:
  /// server, content-type, the date of each second) has them decoded and checked once. For a
  /// client's session (a few upstream connections serve every request; about 1 KiB each), not
  /// a server's (each of its many connections would carry it).
  void enable_value_memo() { memo_ = std::make_unique<ValueMemo>(); }
  /// Values the memo gave (0 without one).
  std::uint64_t value_memo_hits() const { return memo_ ? memo_->hits() : 0; }
  /// Gives back the memory of the buffers kept between blocks (the table stays).
  void trim() {
    release(name_buffer_);
    release(value_buffer_);
    table_.trim();
  }
  const DynamicTable& table() const { return table_; }

 private:
  /// decode() (and with `deliver` null, skim(): `field_seen` and `read` given).
  Status decode_with(std::span<const std::uint8_t> block, void* sink,
                     void (*deliver)(void*, const Decoded&), bool* field_seen = nullptr,
                     std::size_t* read = nullptr);
  DynamicTable table_;
  std::size_t max_table_size_;
  std::size_t max_list_;
  std::string name_buffer_, value_buffer_;  ///< Huffman-decoded strings of the current field
  std::unique_ptr<ValueMemo> memo_;         ///< See enable_value_memo (nullptr: off).
};

class Encoder {
 public:
  /// `max_table_size`: the most this encoder uses of the table the peer allows.
  explicit Encoder(std::size_t max_table_size = 4096)
      : table_(max_table_size), own_limit_(max_table_size) {}

  /// The table carries the messages of many clients (a gateway's connection to an upstream):
  /// only the values of names the token table marks shared (field_flag::kSharedValue: a method,
  /// a media type, the gateway's Via) are indexed or referred to in it; any other value goes as
  /// a literal never indexed (a static table entry aside), so that no client's value becomes
  /// another's reference (a right guess would make a block shorter: CRIME's side channel), and
  /// the next hop is told not to index it either. A name new in every message (x-request-id)
  /// still takes one entry, for its name. (docs/security.md)
  void share_between_clients() { shared_ = true; }

  /// Appends the header block of `fields` to `out`.
  void encode(std::span<const Field> fields, std::string& out);
  void encode(std::initializer_list<Field> fields, std::string& out) {
    encode(std::span<const Field>(fields.begin(), fields.size()), out);
  }
  /// The peer's SETTINGS_HEADER_TABLE_SIZE: the next block starts with a size update.
  void set_peer_max_table_size(std::size_t size);
  const DynamicTable& table() const { return table_; }
  /// Blocks written as a copy of the one before (see LastBlock): how well the fields repeat.
  std::uint64_t copied_blocks() const { return copied_blocks_; }
  /// See DynamicTable::trim; the last block goes too.
  void trim() {
    table_.trim();
    release(last_.fields);
    release(last_.text);
    release(last_.bytes);
    release(literal_at_);
  }

 private:
  /// True if `fields` are those of the last block, and what that block wrote is what they
  /// write now: it left the table as it was, and the table is as it left it. A value new in
  /// every message (a request id) need only be as long as the last one's: it went as it is.
  bool repeats_last(std::span<const Field> fields) const;
  /// Keeps `fields` and `bytes` as the last block (one that changed nothing in the table).
  void remember(std::span<const Field> fields, std::string_view bytes);
  /// The index in table_ of `f` (its name `token`), and in `name_only` that of another value
  /// of its name (0 if none). The newest entry of a known name is looked at first; the rest
  /// of the table only if `whole_table`.
  std::size_t find(const Field& f, const http::Token* token, std::size_t& name_only,
                   bool whole_table) const;
  /// encode(), at `p` (room made by the caller); returns the end.
  char* encode_to(std::span<const Field> fields, char* p);

  DynamicTable table_;
  /// The newest entry of a few tokens (by token number, modulo): a response's repeated
  /// fields (content-type, server, date) are found without a walk through the table.
  struct Recent {
    std::uint32_t token = 0;   ///< its place in the token table, plus one (0: none)
    std::uint32_t number = 0;  ///< DynamicTable::added() just after its entry was added
  };
  std::array<Recent, 16> recent_{};
  /// The last block, when it changed nothing in the table (every field found there or in the
  /// static table, none added): a server's responses repeat their fields (content-type,
  /// server, date within its second), and the same fields then write the same bytes, which
  /// are copied instead of looked up again. A gateway's requests repeat too, but for the
  /// values new in each (x-request-id, traceparent): those went as they are, not indexed, so
  /// a new value of the same length is written over the old one in the copy. Empty (`bytes`
  /// empty) otherwise.
  struct LastBlock {
    /// No literal_at: the value was not written as it is (found in a table, or Huffman-coded).
    static constexpr std::uint32_t kNoLiteral = UINT32_MAX;
    struct Shape {
      const http::Token* token;
      std::uint32_t name_size, value_size;
      bool sensitive;
      /// Where in `bytes` the value of a field new in every message was written as it is
      /// (compared by its length only); kNoLiteral for the others (compared whole).
      std::uint32_t literal_at;
    };
    std::vector<Shape> fields;
    std::string text;   ///< the names and values, one after another
    std::string bytes;  ///< what they wrote
  } last_;
  /// Set by encode_to: for each field, where in the block its value was written as it is
  /// because it is new in every message, or kNoLiteral (remember() keeps them).
  std::vector<std::uint32_t> literal_at_;
  /// Blocks copied from the last one (see last_).
  std::uint64_t copied_blocks_ = 0;
  std::size_t own_limit_;
  /// See share_between_clients.
  bool shared_ = false;
  bool update_pending_ = false;
  std::size_t smallest_since_update_ = SIZE_MAX;
};

/// Appends an HPACK integer of `prefix_bits` bits, the byte's other bits `first_bits`.
void encode_integer(std::uint64_t value, int prefix_bits, std::uint8_t first_bits,
                    std::string& out);

}  // namespace spindle::h2::hpack
