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
#include <cstdint>
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

// One step of the decoder: from a state, by one nibble.
struct Step {
  std::uint16_t next;    ///< the state after the nibble
  std::uint16_t symbol;  ///< the symbol completed by it (kSymbols: none)
  bool accepting;        ///< the string may end here (the pending bits are EOS padding)
  bool fail;             ///< EOS was decoded: not allowed in a string
};

struct Tables {
  std::array<Code, kSymbols> codes{};
  std::vector<std::array<Step, 16>> steps;  // by state (0: the root)
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
  std::vector<int> ones(children.size(), -1);  // -1: not on the all-ones path
  ones[0] = 0;
  for (int node = 0, depth = 0; children[node][1] > 0; ++depth) {
    node = children[node][1];
    ones[node] = depth + 1;
  }
  t.steps.resize(children.size());
  for (std::size_t state = 0; state < children.size(); ++state) {
    for (int nibble = 0; nibble < 16; ++nibble) {
      Step step{0, kSymbols, false, false};
      int node = static_cast<int>(state);
      for (int b = 3; b >= 0; --b) {
        int next = children[node][(nibble >> b) & 1];
        if (next < 0) {
          int symbol = -1 - next;
          if (symbol == 256) step.fail = true;
          step.symbol = static_cast<std::uint16_t>(symbol);  // at most one per nibble (codes
          node = 0;                                          // are 5 bits or more)
        } else {
          node = next;
        }
      }
      step.next = static_cast<std::uint16_t>(node);
      step.accepting = ones[node] >= 0 && ones[node] <= 7;
      t.steps[state][nibble] = step;
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

void encode(std::string_view text, std::string& out) {
  const auto& codes = tables().codes;
  std::uint64_t pending = 0;  // bits not yet written, right-aligned
  int count = 0;
  for (unsigned char c : text) {
    pending = (pending << codes[c].length) | codes[c].bits;
    count += codes[c].length;
    while (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>(pending >> count));
    }
  }
  if (count > 0) {  // padded with the most significant bits of EOS (all ones)
    out.push_back(static_cast<char>((pending << (8 - count)) | (0xff >> count)));
  }
}

bool decode(std::span<const std::uint8_t> code, std::string& out) {
  const auto& steps = tables().steps;
  std::uint16_t state = 0;
  bool accepting = true;
  for (std::uint8_t byte : code) {
    for (int nibble : {byte >> 4, byte & 0xf}) {
      const Step& step = steps[state][nibble];
      if (step.fail) return false;
      if (step.symbol != kSymbols) out.push_back(static_cast<char>(step.symbol));
      state = step.next;
      accepting = step.accepting;
    }
  }
  return accepting;
}

}  // namespace spindle::h2::hpack::huffman
