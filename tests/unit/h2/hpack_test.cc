// HPACK: RFC 7541 Appendix C's examples, every Huffman symbol, the errors a peer can make, the
// header list limit against an "HPACK bomb", and both directions against nghttp2's coder on
// random field lists over many blocks (dynamic tables, evictions, size updates).
#include "spindle/h2/hpack.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "h2_testing.h"
#include "nghttp2_oracle.h"
#include "spindle/http/tokens.h"

using namespace spindle::h2::hpack;
using spindle::testing::bytes;
using spindle::testing::FieldList;
using spindle::testing::from_hex;
using spindle::testing::OracleDeflater;
using spindle::testing::OracleInflater;

namespace {

// Decodes `block`; the fields, and the status in `status`.
FieldList decode(Decoder& decoder, const std::string& block, Status* status = nullptr) {
  FieldList out;
  Status s = decoder.decode(
      bytes(block), [&](std::string_view n, std::string_view v) { out.emplace_back(n, v); });
  if (status) *status = s;
  return out;
}

}  // namespace

TEST(Hpack, IntegersAsRfc7541C1) {
  std::string out;
  encode_integer(10, 5, 0, out);
  EXPECT_EQ(out, from_hex("0a"));
  out.clear();
  encode_integer(1337, 5, 0, out);
  EXPECT_EQ(out, from_hex("1f9a0a"));
  out.clear();
  encode_integer(42, 8, 0, out);
  EXPECT_EQ(out, from_hex("2a"));
}

TEST(Hpack, HuffmanAsRfc7541C4) {
  for (auto [text, hex] :
       {std::pair{"www.example.com", "f1e3c2e5f23a6ba0ab90f4ff"},
        std::pair{"no-cache", "a8eb10649cbf"}, std::pair{"custom-key", "25a849e95ba97d7f"},
        std::pair{"custom-value", "25a849e95bb8e8b4bf"}}) {
    std::string coded;
    huffman::encode(text, coded);
    EXPECT_EQ(coded, from_hex(hex)) << text;
    EXPECT_EQ(huffman::encoded_size(text), coded.size());
    std::string decoded;
    ASSERT_TRUE(huffman::decode(bytes(coded), decoded));
    EXPECT_EQ(decoded, text);
  }
}

TEST(Hpack, EveryHuffmanSymbolThroughNghttp2sDecoder) {
  // Each byte value alone and all 256 in one string, Huffman-coded by us (as the value of a
  // literal field), decoded by nghttp2.
  std::vector<std::string> texts;
  std::string all;
  for (int c = 0; c < 256; ++c) {
    texts.emplace_back(3, static_cast<char>(c));
    all.push_back(static_cast<char>(c));
  }
  texts.push_back(all);
  OracleInflater oracle;
  for (const std::string& text : texts) {
    std::string code;
    huffman::encode(text, code);
    std::string block(
        "\x00\x03"
        "abc",
        5);  // literal, not indexed, new name "abc"
    encode_integer(code.size(), 7, 0x80, block);
    block += code;
    auto fields = oracle.inflate(block);
    ASSERT_TRUE(fields.has_value()) << static_cast<int>(static_cast<unsigned char>(text[0]));
    ASSERT_EQ(fields->size(), 1u);
    EXPECT_EQ((*fields)[0].second, text);
    std::string back;
    ASSERT_TRUE(huffman::decode(bytes(code), back));
    EXPECT_EQ(back, text);
  }
}

TEST(Hpack, HuffmanIsWrittenOnlyWhenShorterAndNeverPastTheText) {
  // Random texts of each length up to past the one-byte length prefix, from alphabets the code
  // makes shorter (hex digits), about as long (all printable) or longer (high bytes): the code
  // comes out as encode() writes it when it is shorter, and nothing is written past the text's
  // own size whatever the outcome.
  std::mt19937 random(20261126);
  const std::string alphabets[] = {"0123456789abcdef",
                                   [] {
                                     std::string printable;
                                     for (char c = 0x20; c < 0x7f; ++c) printable += c;
                                     return printable;
                                   }(),
                                   [] {
                                     std::string high;
                                     for (int c = 0x80; c < 0x100; ++c)
                                       high += static_cast<char>(c);
                                     return high;
                                   }()};
  int shorter = 0, not_shorter = 0;
  for (const std::string& alphabet : alphabets) {
    for (std::size_t size = 0; size < 140; ++size) {
      for (int round = 0; round < 20; ++round) {
        std::string text;
        for (std::size_t i = 0; i < size; ++i) text += alphabet[random() % alphabet.size()];
        std::string out(size + 8, '\xa5');
        char* end = huffman::encode_if_shorter(text, out.data());
        std::string code;
        huffman::encode(text, code);
        if (code.size() < size) {
          ++shorter;
          ASSERT_NE(end, nullptr) << text;
          EXPECT_EQ(std::string_view(out.data(), end - out.data()), code);
        } else {
          ++not_shorter;
          EXPECT_EQ(end, nullptr) << text;
        }
        EXPECT_EQ(out.substr(size), std::string(8, '\xa5')) << "written past the text";
      }
    }
  }
  EXPECT_GT(shorter, 1000);
  EXPECT_GT(not_shorter, 1000);
}

TEST(Hpack, HuffmanStringsHoldingEosAreRefused) {
  // EOS (30 ones) inside a string, after a symbol, padded: an error, and nothing is added.
  std::string code;
  huffman::encode("a", code);  // "a" is 00011, then five ones of padding... made into EOS:
  std::string eos = from_hex("1fffffff");  // 00011 + 27 ones: a then 27 of EOS's 30 bits
  eos += from_hex("e0");                   // the last 3 ones, then zeros
  std::string out = "kept";
  EXPECT_FALSE(huffman::decode(bytes(eos), out));
  EXPECT_EQ(out, "kept");
  EXPECT_TRUE(huffman::decode(bytes(code), out));
  EXPECT_EQ(out, "kepta");
}

TEST(Hpack, RequestsAsRfc7541C3AndC4) {
  // C.3: without Huffman; C.4: with. Three requests on one connection, the table growing.
  for (bool huffman_coded : {false, true}) {
    Decoder decoder;
    std::vector<std::string> blocks =
        huffman_coded
            ? std::vector<std::string>{from_hex("828684418cf1e3c2e5f23a6ba0ab90f4ff"),
                                       from_hex("828684be5886a8eb10649cbf"),
                                       from_hex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf")}
            : std::vector<std::string>{
                  from_hex("828684410f7777772e6578616d706c652e636f6d"),
                  from_hex("828684be58086e6f2d6361636865"),
                  from_hex("828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565")};
    std::vector<FieldList> expected = {{{":method", "GET"},
                                        {":scheme", "http"},
                                        {":path", "/"},
                                        {":authority", "www.example.com"}},
                                       {{":method", "GET"},
                                        {":scheme", "http"},
                                        {":path", "/"},
                                        {":authority", "www.example.com"},
                                        {"cache-control", "no-cache"}},
                                       {{":method", "GET"},
                                        {":scheme", "https"},
                                        {":path", "/index.html"},
                                        {":authority", "www.example.com"},
                                        {"custom-key", "custom-value"}}};
    std::vector<std::size_t> sizes = {57, 110, 164};
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      Status status;
      EXPECT_EQ(decode(decoder, blocks[i], &status), expected[i]) << i;
      EXPECT_EQ(status, Status::kOk);
      EXPECT_EQ(decoder.table().size(), sizes[i]) << i;
    }
  }
}

TEST(Hpack, WhatAPeerGetsWrongIsAnError) {
  struct Case {
    const char* hex;
    Status status;
  };
  for (Case c :
       {Case{"80", Status::kBadIndex},                        // index 0
        Case{"be", Status::kBadIndex},                        // dynamic entry 62, none yet
        Case{"ff80808080808001", Status::kBadInteger},        // past 32 bits
        Case{"ff", Status::kTruncated},                       // integer cut
        Case{"0003616263", Status::kTruncated},               // value missing
        Case{"000361626305616263", Status::kTruncated},       // value shorter than said
        Case{"00036162638400ffffff", Status::kBadHuffman},    // "0a", then 22 bits of padding
        Case{"0003616263 83 ff ff ff", Status::kBadHuffman},  // 24 bits of padding
        Case{"8220", Status::kBadTableSizeUpdate},            // a size update after a field
        Case{"3fe21f", Status::kBadTableSizeUpdate}}) {       // 4097 > 4096
    Decoder decoder;
    Status status;
    (void)decode(decoder, from_hex(c.hex), &status);
    EXPECT_EQ(status, c.status) << c.hex << ": " << to_string(status);
  }
}

TEST(Hpack, AnHpackBombStopsAtTheHeaderListLimit) {
  // One 4 KB field in the table, then a block that names it 16,000 times (16 KB on the wire,
  // 64 MB decoded): decoding stops at the limit, having delivered what fits.
  Decoder decoder(4096, 64 * 1024);
  std::string block;
  encode_integer(0, 6, 0x40, block);  // with indexing, new name
  encode_integer(1, 7, 0, block);
  block += "x";
  encode_integer(4000, 7, 0, block);
  block += std::string(4000, 'y');
  Status status;
  (void)decode(decoder, block, &status);
  ASSERT_EQ(status, Status::kOk);
  std::string bomb;
  for (int i = 0; i < 16000; ++i) encode_integer(62, 7, 0x80, bomb);
  std::size_t delivered = 0;
  status = decoder.decode(bytes(bomb), [&](std::string_view, std::string_view) { ++delivered; });
  EXPECT_EQ(status, Status::kHeaderListTooLarge);
  EXPECT_EQ(delivered, 64 * 1024 / (4001 + 32));
}

TEST(Hpack, SensitiveFieldsAreNeverIndexed) {
  Encoder encoder;
  std::string block;
  encoder.encode({{"authorization", "Basic YTpi"},
                  {"cookie", "session=1"},
                  {"x-token", "t", /*sensitive=*/true},
                  {"x-plain", "p"}},
                 block);
  EXPECT_EQ(encoder.table().count(), 1u);  // x-plain only
  OracleInflater oracle;
  std::vector<std::string> never;
  auto fields = oracle.inflate(block, &never);
  ASSERT_TRUE(fields.has_value());
  EXPECT_EQ(never, (std::vector<std::string>{"authorization", "cookie", "x-token"}));
}

// An upstream's field may be empty (Go sends "sec-websocket-protocol:" so), and an empty view
// may hold no pointer at all: it is encoded (the first time, then again as the same block
// with other values, then from the table) without handing memcpy a null pointer, which UBSan
// in the sanitizer build stops the process for.
TEST(Hpack, EmptyValuesWithNoPointerAreEncodedWithoutTouchingMemory) {
  Encoder encoder;
  OracleInflater oracle;
  for (int round = 0; round < 3; ++round) {
    std::string block;
    encoder.encode({{":status", "200"},
                    {"sec-websocket-protocol", std::string_view()},
                    {"x-empty", std::string_view(), /*sensitive=*/true},
                    {"x-round", round == 1 ? std::string_view() : std::string_view("r")}},
                   block);
    auto fields = oracle.inflate(block);
    ASSERT_TRUE(fields.has_value()) << round;
    ASSERT_EQ(fields->size(), 4u);
    EXPECT_EQ((*fields)[1].second, "");
    EXPECT_EQ((*fields)[2].second, "");
  }
}

TEST(Hpack, FieldsUniqueToEachMessageDoNotChurnTheTable) {
  // A gateway's request id and trace context are new in every request: indexing each value
  // would only push the fields that do repeat out of the table. Their names go in once (with
  // the first values), and every later message refers to them.
  Encoder encoder;
  OracleInflater oracle;
  std::size_t first_size = 0;
  for (int i = 0; i < 50; ++i) {
    std::string block;
    const std::string id = std::to_string(1000000 + i);
    const std::string trace = "00-" + std::to_string(100 + i) + "-01";
    encoder.encode({{"x-request-id", id}, {"traceparent", trace}, {"x-forwarded-proto", "https"}},
                   block);
    auto fields = oracle.inflate(block);
    ASSERT_TRUE(fields.has_value());
    EXPECT_EQ(
        *fields,
        (FieldList{{"x-request-id", id}, {"traceparent", trace}, {"x-forwarded-proto", "https"}}));
    // Each later block: a name index (2 bytes), a length and the value as it is (7 and 9
    // bytes: a random id gains little from Huffman) for each unique field, one byte for
    // x-forwarded-proto: the names (17 bytes Huffman-coded) are not spelled out.
    EXPECT_NE(block.find(id), std::string::npos) << i;
    EXPECT_NE(block.find(trace), std::string::npos) << i;
    if (i == 0) first_size = block.size();
    if (i > 0) {
      EXPECT_EQ(block.size(), (2 + 1 + 7) + (2 + 1 + 9) + 1u) << i;
    }
  }
  EXPECT_GT(first_size, 30u);
  EXPECT_EQ(encoder.table().count(), 3u);  // the first id and trace, x-forwarded-proto
}

// A gateway's requests to one upstream repeat but for their request id and traceparent. Once
// those names are in the table, each block is the last one copied with the new values written
// over the old ones (they went as they are); any other change, or a value of another length,
// and the block is encoded again. nghttp2 reads every block back as the fields sent.
TEST(Hpack, RequestsThatDifferOnlyInTheirIdsAreCopiesWithTheNewIds) {
  std::mt19937 random(20261128);
  auto hex = [&](std::size_t n) {
    std::string s(n, '0');
    for (char& c : s) c = "0123456789abcdef"[random() % 16];
    return s;
  };
  Encoder encoder;
  OracleInflater inflater;
  std::uint64_t expected_copies = 0;
  bool previous_copyable = false;
  FieldList previous;
  for (int block = 0; block < 3000; ++block) {
    FieldList fields = {{":method", "GET"},
                        {":scheme", "https"},
                        {":authority", "upstream"},
                        {":path", "/plaintext"},
                        {"x-request-id", hex(16)},
                        {"x-forwarded-for", "127.0.0.1"},
                        {"traceparent", "00-" + hex(32) + "-" + hex(16) + "-01"}};
    const unsigned roll = random() % 100;
    if (roll < 5) fields[4].second = hex(1 + random() % 30);  // an id of another length
    if (roll >= 5 && roll < 10) fields[3].second = "/" + hex(1 + random() % 3);
    if (roll >= 10 && roll < 12) fields[5].second = "10.0.0." + std::to_string(random() % 3);
    if (roll == 12) fields[4].first = "X-Request-Id";  // not the token: compared whole
    if (roll == 13) encoder.set_peer_max_table_size(random() % 2 == 0 ? 4096 : 300);
    std::vector<Field> ours;
    for (const auto& [n, v] : fields) ours.push_back({n, v});
    if (roll == 14) ours[6].sensitive = true;
    const std::uint32_t added_before = encoder.table().added();
    const std::uint64_t copies_before = encoder.copied_blocks();
    std::string out;
    encoder.encode(ours, out);
    auto back = inflater.inflate(out);
    ASSERT_TRUE(back.has_value()) << block;
    ASSERT_EQ(*back, fields) << block;
    // A copy exactly when the block before was kept (it added nothing) and these fields match
    // it but for the ids, of the same lengths.
    bool same_shape =
        previous_copyable && roll != 13 && roll != 14 && fields.size() == previous.size();
    for (std::size_t i = 0; same_shape && i < fields.size(); ++i) {
      same_shape = fields[i].first == previous[i].first &&
                   (i == 4 || i == 6 ? fields[i].second.size() == previous[i].second.size()
                                     : fields[i].second == previous[i].second);
    }
    EXPECT_EQ(encoder.copied_blocks() - copies_before, same_shape ? 1u : 0u) << block;
    if (same_shape) {
      ++expected_copies;
      // The ids as they are behind a name index: the block is no longer than an encoding.
      EXPECT_NE(out.find(fields[4].second), std::string::npos) << block;
      EXPECT_NE(out.find(fields[6].second), std::string::npos) << block;
    }
    previous = fields;
    previous_copyable = encoder.table().added() == added_before && roll != 13 && roll != 14;
  }
  EXPECT_EQ(encoder.copied_blocks(), expected_copies);
  // (A change costs two or three blocks: its own, and the next, which adds or finds again.)
  EXPECT_GT(expected_copies, 1200u);
}

TEST(Hpack, ATableSizeTheyAskForIsSaidAtTheNextBlock) {
  Encoder encoder;
  OracleInflater oracle;
  std::string block;
  encoder.encode({{"x-a", "1"}}, block);
  ASSERT_TRUE(oracle.inflate(block).has_value());
  encoder.set_peer_max_table_size(0);
  encoder.set_peer_max_table_size(1024);
  block.clear();
  encoder.encode({{"x-b", "2"}}, block);
  EXPECT_EQ(block.substr(0, 1), from_hex("20"));  // 0 first: the table emptied as ours was
  EXPECT_EQ(encoder.table().max_size(), 1024u);
  auto fields = oracle.inflate(block);
  ASSERT_TRUE(fields.has_value());
  EXPECT_EQ(*fields, (FieldList{{"x-b", "2"}}));
}

// A block whose fields are the last block's, when that one changed nothing in the table, is
// written again as it was (the encoder copies it); any change in between — an entry added by
// another block, a table size update, a field marked sensitive, a value, a name — and it is
// encoded again. nghttp2 decodes every block to its fields either way.
TEST(Hpack, RepeatedBlocksAreWrittenAgainOnlyWhileTheTableIsAsTheyLeftIt) {
  std::mt19937 random(20261126);
  Encoder encoder;
  OracleInflater inflater;
  std::string date = "Thu, 26 Nov 2026 15:00:00 GMT";
  std::string previous;
  FieldList previous_fields;
  bool previous_added_nothing = false;
  bool previous_sensitive = false;
  std::size_t repeated = 0;
  for (int block = 0; block < 3000; ++block) {
    FieldList fields = {{":status", "200"},
                        {"content-type", "text/plain"},
                        {"content-length", "13"},
                        {"server", "spindle"},
                        {"date", date}};
    const unsigned roll = random() % 100;
    if (roll < 5) date[24] = static_cast<char>('0' + random() % 10);  // a new second
    if (roll >= 5 && roll < 10) fields.emplace_back("x-new", std::to_string(random()));
    if (roll >= 10 && roll < 13) fields[2].second = std::to_string(random() % 100);
    if (roll >= 13 && roll < 15) fields.emplace_back("Server", "spindle");  // another name
    if (roll == 15) encoder.set_peer_max_table_size(random() % 2 == 0 ? 4096 : 200);
    std::vector<Field> ours;
    for (const auto& [n, v] : fields) ours.push_back({n, v});
    if (roll >= 16 && roll < 18) ours[3].sensitive = true;
    const std::uint32_t added_before = encoder.table().added();
    std::string out;
    encoder.encode(ours, out);
    auto back = inflater.inflate(out);
    ASSERT_TRUE(back.has_value()) << block;
    ASSERT_EQ(*back, fields) << block;
    // The same fields right after a block that added nothing, with no update since: the same
    // bytes. (Whether the copy or a new encoding wrote them, they must be these.)
    if (fields == previous_fields && roll != 15 && !(roll >= 16 && roll < 18) &&
        previous_added_nothing && !previous_sensitive) {
      EXPECT_EQ(out, previous) << block;
      ++repeated;
    }
    // A size the peer set is said at the start of the next block, repeat or not.
    if (roll == 15) {
      EXPECT_EQ(static_cast<unsigned char>(out[0]) & 0xe0, 0x20) << block;
    }
    // A field now sensitive is written as a literal never indexed, not as the last block was.
    if (roll >= 16 && roll < 18 && fields == previous_fields) {
      EXPECT_NE(out, previous) << block;
    }
    previous = out;
    previous_fields = fields;
    previous_added_nothing = encoder.table().added() == added_before && roll != 15;
    previous_sensitive = roll >= 16 && roll < 18;
  }
  EXPECT_GT(repeated, 500u);

  // A full table: an entry added by a block in between evicts one of the same size, so the
  // table holds as many entries as before, all at new places. The repeat is encoded again.
  Encoder full;
  OracleInflater peer;
  auto send = [&](const FieldList& fields) {
    std::vector<Field> ours;
    for (const auto& [n, v] : fields) ours.push_back({n, v});
    std::string out;
    full.encode(ours, out);
    auto back = peer.inflate(out);
    EXPECT_TRUE(back.has_value() && *back == fields);
  };
  for (int i = 0; i < 100; ++i) send({{"x-fill", fmt::format("{:04}", i)}});
  const FieldList response = {{"x-fill", "0098"}, {"x-fill", "0099"}};
  send(response);  // both in the table: nothing added, remembered
  const std::size_t count = full.table().count();
  send({{"x-fill", "0100"}});
  EXPECT_EQ(full.table().count(), count);
  send(response);
}

TEST(Hpack, BothDirectionsAgreeWithNghttp2OnRandomConnections) {
  std::mt19937 random(20261125);
  const std::vector<std::string> names = {
      ":method",  ":path",        ":status",    "content-type",  "server",
      "date",     "x-request-id", "set-cookie", "cache-control", "accept-encoding",
      "x-custom", "via",          "etag",       "user-agent"};
  auto random_text = [&](std::size_t max) {
    std::string s(random() % (max + 1), '\0');
    for (char& c : s)
      c = static_cast<char>(random() % 4 == 0 ? random() % 256 : 'a' + random() % 26);
    return s;
  };
  for (std::size_t table : {4096, 256, 0}) {
    // nghttp2 encodes, spindle decodes.
    OracleDeflater deflater(table);
    Decoder decoder;
    // spindle encodes, nghttp2 decodes.
    Encoder encoder;
    OracleInflater inflater;
    encoder.set_peer_max_table_size(4096);
    for (int block = 0; block < 400; ++block) {
      FieldList fields;
      int count = 1 + static_cast<int>(random() % 12);
      for (int i = 0; i < count; ++i) {
        // Repeats often, so that the dynamic tables are used and evicted.
        std::string name = random() % 5 == 0 ? random_text(20) : names[random() % names.size()];
        if (name.empty()) name = "n";
        std::string value = random() % 3 == 0 ? std::to_string(random() % 8) : random_text(300);
        fields.emplace_back(name, value);
      }
      Status status;
      EXPECT_EQ(decode(decoder, deflater.deflate(fields), &status), fields) << block;
      ASSERT_EQ(status, Status::kOk) << block;

      std::vector<Field> ours;
      for (const auto& [n, v] : fields) ours.push_back({n, v});
      std::string out;
      encoder.encode(ours, out);
      auto back = inflater.inflate(out);
      ASSERT_TRUE(back.has_value()) << block;
      EXPECT_EQ(*back, fields) << block;
      if (block % 97 == 96) encoder.set_peer_max_table_size(random() % 4097);
    }
  }
}

// The ring against the plainest model of RFC 7541 §4: a list, newest first, trimmed from the
// old end. Entries of every size wrap around the ring, grow it, are evicted one or many at a
// time, empty it (one too large), and are added from views into entries the same insertion
// evicts (as a decoder does with an indexed name).
// Each decoded field carries its name's token, however it was coded (static index, dynamic
// index, literal name), and says whether the name and value are known good: a static entry
// always, a dynamic one as it was found when added, a literal never (the caller checks); and
// whether its name alone is: a literal value under a table's name (a dynamic entry's only if
// that entry was found good).
TEST(Hpack, DecodedFieldsCarryTheirTokenAndWhetherTheyWereChecked) {
  Encoder encoder;
  std::string block;
  encoder.encode({{":method", "GET"},       // static, whole
                  {"content-type", "a/b"},  // static name, literal value, indexed
                  {"x-mine", "1"},          // literal name, indexed
                  {"x-bad", " 1"},          // indexed, not valid
                  {"authorization", "a"}},  // static name, never indexed
                 block);
  encoder.encode({{"content-type", "a/b"}, {"x-mine", "1"}, {"x-bad", " 1"}}, block);
  // Literal values without indexing (0000xxxx) under the names of the dynamic entries, the
  // newest first (62: x-bad, 63: x-mine), and under a static one (23: authorization).
  block += std::string(
      "\x0f\x2f\x01"
      "2"
      "\x0f\x30\x01"
      "2"
      "\x0f\x08\x01"
      "b",
      12);
  struct Seen {
    std::string name;
    const spindle::http::Token* token;
    bool checked;
    bool name_checked;
  };
  std::vector<Seen> seen;
  Decoder decoder;
  ASSERT_EQ(
      decoder.decode(
          bytes(block),
          [&](const Decoded& d) {
            seen.push_back({std::string(d.field.name), d.field.token, d.checked, d.name_checked});
          }),
      Status::kOk);
  namespace token = spindle::http::token;
  ASSERT_EQ(seen.size(), 11u);
  auto expect = [&](std::size_t i, std::string_view name, const spindle::http::Token* t,
                    bool checked, bool name_checked) {
    EXPECT_EQ(seen[i].name, name) << i;
    EXPECT_EQ(seen[i].token, t) << i;
    EXPECT_EQ(seen[i].checked, checked) << i;
    if (!checked) {
      EXPECT_EQ(seen[i].name_checked, name_checked) << i;
    }
  };
  expect(0, ":method", &token::kMethod, true, true);
  expect(1, "content-type", &token::kContentType, true, true);
  expect(2, "x-mine", nullptr, true, true);
  expect(3, "x-bad", nullptr, false, false);  // a literal name
  expect(4, "authorization", &token::kAuthorization, false, true);
  expect(5, "content-type", &token::kContentType, true, true);  // now by dynamic index
  expect(6, "x-mine", nullptr, true, true);
  expect(7, "x-bad", nullptr, false, false);
  expect(8, "x-bad", nullptr, false, false);  // the name of an entry found bad
  expect(9, "x-mine", nullptr, false, true);
  expect(10, "authorization", &token::kAuthorization, false, true);
}

// A decoder that keeps the Huffman-coded values it decoded (a client's: enable_value_memo)
// gives the same fields as one that does not, block after block, as values come back, are
// pushed out of the memo by newer ones and come back again; a value from the memo under a
// static name is known good (or not: one with a leading space stays unchecked).
TEST(Hpack, TheValueMemoChangesNothingButTheWork) {
  Encoder encoder;
  Decoder plain;
  Decoder memo;
  memo.enable_value_memo();
  OracleInflater oracle;
  // Values sent never indexed, so each comes as a Huffman-coded literal every time: three
  // that keep coming back under a static name (one not valid), twelve under a name of no
  // table that are pushed out before they come back (8 kept).
  const std::vector<std::string> served = {"nginx/1.22.1", "text/plain", " leading space"};
  std::vector<std::string> others;
  for (int i = 0; i < 12; ++i) others.push_back("another value, number " + std::to_string(i));
  struct Seen {
    std::string name, value;
    bool checked;
  };
  for (int round = 0; round < 40; ++round) {
    const std::string& mine = served[round % served.size()];
    const std::string& other = others[round % others.size()];
    std::string block;
    encoder.encode({{"server", mine, true}, {"x-other", other, true}}, block);
    auto decode = [&](Decoder& decoder) {
      std::vector<Seen> seen;
      EXPECT_EQ(
          decoder.decode(
              bytes(block),
              [&](const Decoded& d) {
                seen.push_back({std::string(d.field.name), std::string(d.field.value), d.checked});
              }),
          Status::kOk);
      return seen;
    };
    std::vector<Seen> a = decode(plain), b = decode(memo);
    ASSERT_EQ(a.size(), 2u);
    ASSERT_EQ(b.size(), 2u);
    auto expected = oracle.inflate(block);
    ASSERT_TRUE(expected.has_value());
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(b[i].name, a[i].name);
      EXPECT_EQ(b[i].value, a[i].value);
      EXPECT_EQ(b[i].name, (*expected)[i].first);
      EXPECT_EQ(b[i].value, (*expected)[i].second);
      EXPECT_FALSE(a[i].checked);  // a literal: the caller checks it
    }
    EXPECT_EQ(b[0].checked, mine.front() != ' ') << round;
    EXPECT_FALSE(b[1].checked);  // (a name of no table: the caller checks it)
  }
  // Each served value was decoded once; every other came back after eight newer ones.
  EXPECT_EQ(memo.value_memo_hits(), 40u - served.size());
  EXPECT_EQ(plain.value_memo_hits(), 0u);
}

// nginx, told a table size, answers with a size update to 0 and then sends every field
// "with incremental indexing": each empties the table instead of entering it. Those fields are
// delivered as nghttp2 reads them, a value from the memo under a static name counts as checked
// only if it is valid, a value never Huffman-coded or a name sent as a literal stays unchecked,
// and the table keeps nothing (nor grows) however many such fields come.
TEST(Hpack, FieldsIndexedIntoATableOfSizeZeroAreDeliveredAndCheckedAndKeepNothing) {
  Decoder plain;
  Decoder memo;
  memo.enable_value_memo();
  OracleInflater oracle;
  auto indexed_literal = [](std::size_t name_index, std::string_view name, std::string_view value,
                            bool huffman, std::string& out) {
    encode_integer(name_index, 6, 0x40, out);  // 01xxxxxx: with incremental indexing
    if (name_index == 0) {
      encode_integer(name.size(), 7, 0, out);
      out.append(name);
    }
    if (huffman) {
      encode_integer(huffman::encoded_size(value), 7, 0x80, out);
      huffman::encode(value, out);
    } else {
      encode_integer(value.size(), 7, 0, out);
      out.append(value);
    }
  };
  struct Seen {
    std::string name, value;
    bool checked;
  };
  for (int round = 0; round < 6; ++round) {
    std::string block;
    if (round == 0) block.push_back(0x20);                                     // size update to 0
    block.push_back(static_cast<char>(0x88));                                  // :status 200
    indexed_literal(54, "", "nginx", true, block);                             // server
    indexed_literal(33, "", round % 2 ? " bad" : "Sat, 28 Nov", true, block);  // date
    indexed_literal(31, "", "text/plain", false, block);                       // content-type, raw
    indexed_literal(0, "x-mine", "value", true, block);                        // a literal name
    auto decode = [&](Decoder& decoder) {
      std::vector<Seen> seen;
      EXPECT_EQ(
          decoder.decode(
              bytes(block),
              [&](const Decoded& d) {
                seen.push_back({std::string(d.field.name), std::string(d.field.value), d.checked});
              }),
          Status::kOk);
      return seen;
    };
    std::vector<Seen> a = decode(plain), b = decode(memo);
    auto expected = oracle.inflate(block);
    ASSERT_TRUE(expected.has_value());
    ASSERT_EQ(a.size(), 5u);
    ASSERT_EQ(b.size(), 5u);
    for (std::size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(a[i].name, (*expected)[i].first);
      EXPECT_EQ(a[i].value, (*expected)[i].second);
      EXPECT_EQ(b[i].name, (*expected)[i].first);
      EXPECT_EQ(b[i].value, (*expected)[i].second);
    }
    EXPECT_TRUE(b[0].checked);
    EXPECT_TRUE(b[1].checked) << round;                // nginx, from the memo
    EXPECT_EQ(b[2].checked, round % 2 == 0) << round;  // " bad" never counts as checked
    EXPECT_FALSE(b[3].checked);                        // not Huffman-coded: no memo
    EXPECT_FALSE(b[4].checked);                        // a literal name
    for (std::size_t i = 1; i < 5; ++i) EXPECT_FALSE(a[i].checked) << i;  // no memo
    EXPECT_EQ(plain.table().count(), 0u);
    EXPECT_EQ(memo.table().count(), 0u);
    EXPECT_EQ(memo.table().size(), 0u);
  }
  EXPECT_EQ(memo.value_memo_hits(), 6u * 3 - 4);  // nginx, x-mine's value, both dates once
}

// A field named by a dynamic entry and too large for the table empties the table, its own
// name's entry with it: the name delivered is still the entry's (and the oracle's).
TEST(Hpack, AFieldTooLargeForTheTableKeepsTheNameOfTheEntryItPushesOut) {
  for (bool memo_on : {false, true}) {
    Decoder decoder(100);
    if (memo_on) decoder.enable_value_memo();
    OracleInflater oracle;
    std::string first = "\x40";  // with incremental indexing, a literal name
    encode_integer(11, 7, 0, first);
    first += "x-long-name";
    encode_integer(1, 7, 0, first);
    first += "v";
    std::string resize = "\x3f\x45";  // size update to 100 for the oracle (as ours)
    ASSERT_EQ(decode(decoder, resize + first), (FieldList{{"x-long-name", "v"}}));
    ASSERT_TRUE(oracle.inflate(resize + first).has_value());
    ASSERT_EQ(decoder.table().count(), 1u);
    std::string value(80, 'z');
    std::string second;
    encode_integer(62, 6, 0x40, second);  // named by the entry, with incremental indexing
    encode_integer(huffman::encoded_size(value), 7, 0x80, second);
    huffman::encode(value, second);
    Status status;
    FieldList got = decode(decoder, second, &status);
    EXPECT_EQ(status, Status::kOk);
    EXPECT_EQ(got, (FieldList{{"x-long-name", value}})) << memo_on;
    EXPECT_EQ(oracle.inflate(second), got);
    EXPECT_EQ(decoder.table().count(), 0u);
  }
}

// The encoder finds a repeated field of a known name at once (the newest entry of its name),
// however many entries of that name the table holds: a date a second, say.
TEST(Hpack, RepeatedFieldsGoByIndexAmongManyOfTheirName) {
  Encoder encoder;
  OracleInflater inflater;
  for (int second = 0; second < 40; ++second) {
    std::string date = "Wed, 25 Nov 2026 10:00:" + std::to_string(10 + second) + " GMT";
    for (int response = 0; response < 3; ++response) {
      std::string out;
      encoder.encode({{":status", "200"}, {"date", date}, {"server", "spindle"}}, out);
      if (second > 0 && response > 0) {
        EXPECT_EQ(out.size(), 3u) << second;  // each field one byte: an index
      }
      auto back = inflater.inflate(out);
      ASSERT_TRUE(back.has_value());
      EXPECT_EQ(*back, (FieldList{{":status", "200"}, {"date", date}, {"server", "spindle"}}));
    }
  }
  EXPECT_GT(encoder.table().count(), 30u);  // the dates are all there
}

TEST(Hpack, TheDynamicTableRingAgreesWithAListModel) {
  std::mt19937 rng(7);
  for (std::size_t max_size : {64u, 300u, 4096u}) {
    DynamicTable table(max_size);
    std::vector<std::pair<std::string, std::string>> model;  // newest first
    std::size_t model_size = 0;
    auto trim = [&](std::size_t to) {
      while (model_size > to) {
        model_size -= model.back().first.size() + model.back().second.size() + 32;
        model.pop_back();
      }
    };
    for (int step = 0; step < 3000; ++step) {
      std::string name, value;
      std::size_t index = 0;
      if (table.count() != 0 && rng() % 3 == 0) {
        // Named after an entry, maybe the oldest (evicted by this very insertion).
        index = 62 + (rng() % 2 == 0 ? table.count() - 1 : rng() % table.count());
        name = std::string(table.get(index)->name());
      } else {
        name = "n" + std::to_string(step % 97);
      }
      value = std::string(rng() % (max_size / 2), static_cast<char>('a' + step % 26));
      if (rng() % 50 == 0) value.assign(max_size, 'z');  // larger than the table: empties it
      if (index != 0) {
        table.add(table.get(index)->name(), value);
      } else {
        table.add(name, value);
      }
      std::size_t entry = name.size() + value.size() + 32;
      if (entry > max_size) {
        trim(0);
      } else {
        trim(max_size - entry);
        model.insert(model.begin(), {name, value});
        model_size += entry;
      }
      if (rng() % 100 == 0) {
        std::size_t smaller = rng() % max_size;
        table.set_max_size(smaller);
        trim(smaller);
        table.set_max_size(max_size);
      }
      ASSERT_EQ(table.count(), model.size()) << step;
      ASSERT_EQ(table.size(), model_size) << step;
      for (std::size_t i = 0; i < model.size(); ++i) {
        const DynamicTable::Entry* e = table.get(62 + i);
        ASSERT_NE(e, nullptr);
        ASSERT_EQ(e->name(), model[i].first) << step << " " << i;
        ASSERT_EQ(e->value(), model[i].second) << step << " " << i;
      }
      EXPECT_EQ(table.get(62 + model.size()), nullptr);
      if (!model.empty()) {
        std::size_t name_only = 0;
        EXPECT_EQ(table.find(model.back().first, nullptr, model.back().second, name_only) >= 62,
                  true);
      }
    }
  }
}

// The static table is built from the token table's names (http/tokens.h) and RFC 7541's values:
// each of its 61 entries, referred to by index, decodes as nghttp2 decodes it; and the encoder
// refers to each name and each whole entry by the same index nghttp2 would use.
TEST(Hpack, TheStaticTableFromTheTokenTableIsRfc7541s) {
  for (unsigned index = 1; index <= 61; ++index) {
    std::string block(1, static_cast<char>(0x80 | index));
    OracleInflater oracle;
    auto theirs = oracle.inflate(block);
    ASSERT_TRUE(theirs.has_value()) << index;
    Decoder decoder;
    Status status = Status::kOk;
    FieldList ours = decode(decoder, block, &status);
    ASSERT_EQ(status, Status::kOk) << index;
    EXPECT_EQ(ours, *theirs) << index;
    // Encoded, the entry is its own index again (sensitive names never are: a literal,
    // never indexed, named by the same index).
    Encoder encoder;
    std::string out;
    encoder.encode({{(*theirs)[0].first, (*theirs)[0].second}}, out);
    const auto* token = spindle::http::find_token((*theirs)[0].first);
    ASSERT_NE(token, nullptr) << index;
    if ((token->flags & spindle::http::field_flag::kSensitive) != 0) {
      EXPECT_EQ(out,
                std::string({static_cast<char>(0x10 | 0x0f), static_cast<char>(index - 15), '\0'}))
          << index;
    } else {
      EXPECT_EQ(out, block) << index;
    }
  }
}
