// HPACK's Huffman code (RFC 7541 Appendix B). The Appendix's code is canonical: codes are given
// in order of length, and within one length in order of symbol, each the previous plus one
// (shifted left when the length grows). So the code lengths below are the whole table; the codes
// are made from them once. Checked by the tests: the Appendix C examples, and every symbol
// through nghttp2's decoder.
//
// Decoding reads 4 bits at a time through a table of states (the inner nodes of the code's
// tree): for each state and nibble, the next state, the symbol completed (if one was) and
// whether the bits so far may end the string (they are a prefix of EOS, all ones, at most 7).
#include <algorithm>
#include <array>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <vector>

#include "spindle/h2/hpack.h"

namespace spindle::h2::hpack::huffman {
namespace {

constexpr int kSymbols = 257;  // 256 bytes and EOS

// Code lengths in bits, by symbol (RFC 7541 Appendix B); EOS last.
constexpr std::array<std::uint8_t, kSymbols> kLengths = {
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,  //   0
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,  //  16
    6,  10, 10, 12, 13, 6,  8,  11, 10, 10, 8,  11, 8,  6,  6,  6,   //  32 ' '
    5,  5,  5,  6,  6,  6,  6,  6,  6,  6,  7,  8,  15, 6,  12, 10,  //  48 '0'
    13, 6,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,   //  64 '@'
    7,  7,  7,  7,  7,  7,  7,  7,  8,  7,  8,  13, 19, 13, 14, 6,   //  80 'P'
    15, 5,  6,  5,  6,  5,  6,  6,  6,  5,  7,  7,  6,  6,  6,  5,   //  96 '`'
    6,  7,  6,  5,  5,  6,  7,  7,  7,  7,  7,  15, 11, 14, 13, 28,  // 112 'p'
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,  // 128
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,  // 144
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,  // 160
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,  // 176
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,  // 192
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,  // 208
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,  // 224
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,  // 240
    30,                                                              // EOS
};

struct Code {
  std::uint32_t bits;  ///< right-aligned
  std::uint8_t length;
};

// One step of the decoder, from a state by one nibble, packed in 32 bits: the state after the
// nibble (bits 0-7), the byte completed by it (8-15) if bit 16 is set (at most one: codes are 5
// bits or more), and bit 24 if it decoded EOS, which a string must not hold. (The tree has
// 256 inner nodes: a state fits a byte.)
constexpr int kStepSymbol = 8;
constexpr std::uint32_t kStepEmit = 1u << 16;
constexpr std::uint32_t kStepEos = 1u << 24;

struct Tables {
  std::array<Code, kSymbols> codes{};
  std::vector<std::uint32_t> steps;  // by state * 16 + nibble (state 0: the root)
  std::vector<bool> accepting;       // by state: a string may end there (the pending bits
                                     // are EOS padding: all ones, at most 7)
};

Tables make_tables() {
  Tables t;
  // Canonical codes: by length, then symbol.
  std::array<int, kSymbols> order{};
  for (int i = 0; i < kSymbols; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [](int a, int b) { return kLengths[a] < kLengths[b]; });
  std::uint32_t code = 0;
  std::uint8_t length = kLengths[order[0]];
  for (int i = 0; i < kSymbols; ++i) {
    int symbol = order[i];
    if (i > 0) {
      ++code;
      code <<= kLengths[symbol] - length;
      length = kLengths[symbol];
    }
    t.codes[symbol] = {code, length};
  }
  // The tree: node 0 the root; children[node][bit] > 0 an inner node, < 0 a leaf (-1 - symbol).
  std::vector<std::array<int, 2>> children(1, {0, 0});
  for (int symbol = 0; symbol < kSymbols; ++symbol) {
    int node = 0;
    for (int b = t.codes[symbol].length - 1; b >= 0; --b) {
      int bit = (t.codes[symbol].bits >> b) & 1;
      if (b == 0) {
        children[node][bit] = -1 - symbol;
      } else {
        if (children[node][bit] == 0) {
          children[node][bit] = static_cast<int>(children.size());
          children.push_back({0, 0});
        }
        node = children[node][bit];
      }
    }
  }
  // Each inner node is a state; its depth of all-one bits tells whether it can end a string.
  assert(children.size() <= 256);
  std::vector<int> ones(children.size(), -1);  // -1: not on the all-ones path
  ones[0] = 0;
  for (int node = 0, depth = 0; children[node][1] > 0; ++depth) {
    node = children[node][1];
    ones[node] = depth + 1;
  }
  t.steps.resize(children.size() * 16);
  t.accepting.resize(children.size());
  for (std::size_t state = 0; state < children.size(); ++state) {
    t.accepting[state] = ones[state] >= 0 && ones[state] <= 7;
    for (int nibble = 0; nibble < 16; ++nibble) {
      std::uint32_t step = 0;
      int node = static_cast<int>(state);
      for (int b = 3; b >= 0; --b) {
        int next = children[node][(nibble >> b) & 1];
        if (next < 0) {
          int symbol = -1 - next;
          step |= symbol == 256 ? kStepEos : static_cast<std::uint32_t>(symbol) << kStepSymbol;
          step |= kStepEmit;
          node = 0;
        } else {
          node = next;
        }
      }
      t.steps[state * 16 + nibble] = step | static_cast<std::uint32_t>(node);
    }
  }
  return t;
}

const Tables& tables() {
  static const Tables t = make_tables();
  return t;
}

}  // namespace

std::size_t encoded_size(std::string_view text) {
  const auto& codes = tables().codes;
  std::size_t bits = 0;
  for (unsigned char c : text) bits += codes[c].length;
  return (bits + 7) / 8;
}

namespace {
// Writes the code of `text` at `out`, or stops at `limit` (returns nullptr) once it would
// reach it. Codes gather right-aligned in a 64-bit word; each time 32 bits are whole they are
// written at once (a code is at most 30 bits: the word always holds what is not written yet).
template <bool kLimited>
char* encode_until(std::string_view text, char* out, const char* limit) {
  if (kLimited && text.empty()) return nullptr;  // nothing is shorter than nothing
  const auto& codes = tables().codes;
  std::uint64_t bits = 0;
  int count = 0;
  for (unsigned char c : text) {
    const Code code = codes[c];
    bits = (bits << code.length) | code.bits;
    count += code.length;
    if (count >= 32) {
      count -= 32;
      if (kLimited && limit - out <= 4) return nullptr;
      const std::uint32_t word = __builtin_bswap32(static_cast<std::uint32_t>(bits >> count));
      std::memcpy(out, &word, 4);
      out += 4;
    }
  }
  // The rest, padded with the most significant bits of EOS (all ones).
  if (count > 0) {
    const int pad = (8 - count % 8) % 8;
    bits = (bits << pad) | ((1u << pad) - 1);
    count += pad;
    if (kLimited && limit - out <= count / 8) return nullptr;
    for (; count > 0; count -= 8) *out++ = static_cast<char>(bits >> (count - 8));
  }
  return out;
}
}  // namespace

char* encode(std::string_view text, char* out) { return encode_until<false>(text, out, nullptr); }

char* encode_if_shorter(std::string_view text, char* out) {
  return encode_until<true>(text, out, out + text.size());
}

void encode(std::string_view text, std::string& out) {
  const std::size_t start = out.size();
  const std::size_t size = encoded_size(text);
  // (The size returned is the end written: g++ 12 may pass the grown capacity as n.)
  out.resize_and_overwrite(start + size, [&](char* p, std::size_t) {
    return static_cast<std::size_t>(encode(text, p + start) - p);
  });
}

bool decode(std::span<const std::uint8_t> code, std::string& out) {
  const Tables& t = tables();
  const std::uint32_t* steps = t.steps.data();
  const std::size_t start = out.size();
  std::uint32_t state = 0;
  std::uint32_t seen = 0;  // the steps' flags, or-ed: EOS anywhere fails the string
  // At most one symbol per 5 bits (the shortest code): written in place, then cut to size.
  out.resize_and_overwrite(start + code.size() * 8 / 5 + 1, [&](char* p, std::size_t) {
    char* to = p + start;
    for (std::uint8_t byte : code) {
      const std::uint32_t high = steps[state * 16 + (byte >> 4)];
      *to = static_cast<char>(high >> kStepSymbol);
      to += (high >> 16) & 1;
      const std::uint32_t low = steps[(high & 0xff) * 16 + (byte & 0xf)];
      *to = static_cast<char>(low >> kStepSymbol);
      to += (low >> 16) & 1;
      state = low & 0xff;
      seen |= high | low;
    }
    return static_cast<std::size_t>(to - p);
  });
  if ((seen & kStepEos) != 0) {
    out.resize(start);
    return false;
  }
  return t.accepting[state];
}

}  // namespace spindle::h2::hpack::huffman
