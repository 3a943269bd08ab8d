#include "spindle/h1/chunked.h"

#include <algorithm>

namespace spindle::http {
namespace {

using Kind = ChunkedDecoder::Step::Kind;

ChunkedDecoder::Step fail(int status, std::string_view reason) {
  return {Kind::kError, 0, {}, status, reason};
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Extensions and trailers: HTAB, SP, visible ASCII and obs-text; no other control character.
bool is_line_char(char c) {
  auto u = static_cast<unsigned char>(c);
  return u == '\t' || (u >= 0x20 && u != 0x7f);
}

enum class LineCheck { kOk, kBareCr, kBadChar };

// Checks the text of a line seen so far. `complete` says whether its CRLF has arrived; if not,
// a CR is allowed as the very last byte (the start of the CRLF still to come).
LineCheck check_line(std::string_view line, bool complete) {
  for (std::size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\r') {
      if (complete || i + 1 != line.size()) return LineCheck::kBareCr;
    } else if (!is_line_char(line[i])) {
      return LineCheck::kBadChar;
    }
  }
  return LineCheck::kOk;
}

}  // namespace

ChunkedDecoder::Step ChunkedDecoder::next(std::string_view input) {
  // Step over framing (size lines, CRLFs, trailers) until there is payload, an end or a need.
  std::size_t framing = 0;
  for (;;) {
    Step step = next_piece(input.substr(framing));
    if (step.kind == Kind::kNeedMore && step.consumed > 0) {
      framing += step.consumed;
      continue;
    }
    if (step.kind != Kind::kError) step.consumed += framing;
    return step;
  }
}

ChunkedDecoder::Step ChunkedDecoder::next_piece(std::string_view input) {
  switch (state_) {
    case State::kSize:
      return size_line(input);
    case State::kData: {
      if (input.empty()) return {Kind::kNeedMore, 0, {}, 0, {}};
      auto n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, input.size()));
      remaining_ -= n;
      if (remaining_ == 0) state_ = State::kDataEnd;
      return {Kind::kData, n, input.substr(0, n), 0, {}};
    }
    case State::kDataEnd:
      if (input.size() < 2) {
        if (!input.empty() && input[0] != '\r') return fail(400, "chunk data not followed by CRLF");
        return {Kind::kNeedMore, 0, {}, 0, {}};
      }
      if (input[0] != '\r' || input[1] != '\n') return fail(400, "chunk data not followed by CRLF");
      state_ = State::kSize;
      return {Kind::kNeedMore, 2, {}, 0, {}};
    case State::kTrailer:
      return trailer_line(input);
    case State::kDone:
      return {Kind::kDone, 0, {}, 0, {}};
  }
  return fail(400, "bad chunked state");
}

ChunkedDecoder::Step ChunkedDecoder::size_line(std::string_view input) {
  std::size_t eol = input.find("\r\n");
  std::string_view line = input.substr(0, eol);
  // Check what has arrived even before the line is complete, so junk fails fast.
  std::size_t digits = 0;
  std::uint64_t size = 0;
  while (digits < line.size() && hex_value(line[digits]) >= 0) {
    if (digits == 15) return fail(400, "chunk size too large");  // 16 hex digits could overflow
    size = size * 16 + static_cast<std::uint64_t>(hex_value(line[digits]));
    ++digits;
  }
  std::string_view rest = line.substr(digits);
  if (digits == 0 && !line.empty()) return fail(400, "invalid chunk size");
  // After the size: nothing, or extensions that start with ";" (whitespace allowed before it).
  std::size_t ws = 0;
  while (ws < rest.size() && (rest[ws] == ' ' || rest[ws] == '\t')) ++ws;
  if (ws < rest.size() && rest[ws] != ';' && !(ws == 0 && rest[ws] == '\r')) {
    return fail(400, "invalid chunk size");
  }
  if (ws > 0 && ws == rest.size() && eol != std::string_view::npos) {
    return fail(400, "whitespace after chunk size");
  }
  switch (check_line(rest, eol != std::string_view::npos)) {
    case LineCheck::kBareCr:
      return fail(400, "bare CR in chunk size line");
    case LineCheck::kBadChar:
      return fail(400, "invalid chunk extension");
    case LineCheck::kOk:
      break;
  }
  if (eol == std::string_view::npos) {
    if (input.size() > kMaxLine) return fail(400, "chunk size line too long");
    return {Kind::kNeedMore, 0, {}, 0, {}};
  }
  if (digits == 0) return fail(400, "missing chunk size");
  if (size > max_body_ - total_) return fail(413, "body too large");
  total_ += size;
  remaining_ = size;
  state_ = size == 0 ? State::kTrailer : State::kData;
  return {Kind::kNeedMore, eol + 2, {}, 0, {}};
}

ChunkedDecoder::Step ChunkedDecoder::trailer_line(std::string_view input) {
  std::size_t eol = input.find("\r\n");
  std::string_view line = input.substr(0, eol);
  switch (check_line(line, eol != std::string_view::npos)) {
    case LineCheck::kBareCr:
      return fail(400, "bare CR in trailer");
    case LineCheck::kBadChar:
      return fail(400, "invalid character in trailer");
    case LineCheck::kOk:
      break;
  }
  if (eol == std::string_view::npos) {
    if (input.size() > kMaxLine) return fail(400, "trailer line too long");
    return {Kind::kNeedMore, 0, {}, 0, {}};
  }
  trailer_bytes_ += eol + 2;
  if (trailer_bytes_ > kMaxTrailers) return fail(400, "trailers too large");
  if (eol == 0) {
    state_ = State::kDone;
    return {Kind::kDone, 2, {}, 0, {}};
  }
  if (line.front() == ' ' || line.front() == '\t') return fail(400, "obsolete line folding");
  if (line.find(':') == std::string_view::npos) return fail(400, "trailer line without colon");
  return {Kind::kNeedMore, eol + 2, {}, 0, {}};  // trailers are dropped
}

}  // namespace spindle::http
