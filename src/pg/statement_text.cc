#include "statement_text.h"

#include <string>

namespace spindle::pg {
namespace {

constexpr std::size_t kEnd = std::string_view::npos;

bool blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// A character of an unquoted word: PostgreSQL's identifier characters (bytes of multibyte
// letters included) and $, which continues a word but does not start one.
bool word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || static_cast<unsigned char>(c) >= 0x80;
}

// The offset past the blanks and comments (-- to the line's end, which the server's scanner
// puts at \r as well as \n; /* */, nested) at `at`.
std::size_t skip_blank(std::string_view s, std::size_t at) {
  while (at < s.size()) {
    if (blank(s[at])) {
      ++at;
    } else if (s.compare(at, 2, "--") == 0) {
      at = s.find_first_of("\r\n", at);
      if (at == kEnd) return s.size();
    } else if (s.compare(at, 2, "/*") == 0) {
      int depth = 0;
      while (at < s.size()) {
        if (s.compare(at, 2, "/*") == 0) {
          ++depth;
          at += 2;
        } else if (s.compare(at, 2, "*/") == 0) {
          at += 2;
          if (--depth == 0) break;
        } else {
          ++at;
        }
      }
    } else {
      break;
    }
  }
  return std::min(at, s.size());
}

// The offset past a literal or quoted name opening at `at` with `quote` (' or "): a doubled
// quote stands for itself; in an E'' string a backslash escapes the next character.
std::size_t skip_quoted(std::string_view s, std::size_t at, char quote, bool backslashes) {
  for (++at; at < s.size(); ++at) {
    if (backslashes && s[at] == '\\') {
      ++at;
    } else if (s[at] == quote) {
      if (at + 1 < s.size() && s[at + 1] == quote) {
        ++at;
      } else {
        return at + 1;
      }
    }
  }
  return s.size();
}

// The length of the dollar quote's tag opening at `at` ($$ or $tag$), or 0 if none opens there
// ($1, a parameter, is none).
std::size_t dollar_tag(std::string_view s, std::size_t at) {
  std::size_t end = at + 1;
  if (end < s.size() && s[end] >= '0' && s[end] <= '9') return 0;
  while (end < s.size() && s[end] != '$' && word_char(s[end])) ++end;
  return end < s.size() && s[end] == '$' ? end - at + 1 : 0;
}

bool same_word(std::string_view word, std::string_view lower) {
  if (word.size() != lower.size()) return false;
  for (std::size_t i = 0; i < word.size(); ++i) {
    char c = word[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != lower[i]) return false;
  }
  return true;
}

// The word at `at` (empty if none starts there).
std::string_view word_at(std::string_view s, std::size_t at) {
  std::size_t end = at;
  while (end < s.size() && word_char(s[end]) && !(end == at && s[end] == '$')) ++end;
  return s.substr(at, end - at);
}

// True if STDIN or STDOUT is a word of `s` from `at` on, outside literals and comments.
bool names_client_stream(std::string_view s, std::size_t at) {
  while ((at = skip_blank(s, at)) < s.size()) {
    char c = s[at];
    if (c == '\'' || c == '"') {
      at = skip_quoted(s, at, c, false);
    } else if (c == '$') {
      std::size_t tag = dollar_tag(s, at);
      if (tag == 0) {
        ++at;
        continue;
      }
      std::size_t close = s.find(s.substr(at, tag), at + tag);
      at = close == kEnd ? s.size() : close + tag;
    } else if (std::string_view word = word_at(s, at); !word.empty()) {
      at += word.size();
      if (same_word(word, "stdin") || same_word(word, "stdout")) return true;
      // E'...' (and e'...'): backslash escapes inside.
      if (same_word(word, "e") && at < s.size() && s[at] == '\'') {
        at = skip_quoted(s, at, '\'', true);
      }
    } else {
      ++at;
    }
  }
  return false;
}

// DISCARD ALL drops the prepared statements (and resets the settings); DISCARD PLANS, TEMP,
// SEQUENCES neither.
StatementKind discard_kind(std::string_view s, std::size_t at) {
  at = skip_blank(s, at);
  return same_word(word_at(s, at), "all") ? StatementKind::kDropsPrepared : StatementKind::kPlain;
}

bool spindle_name(std::string_view name) {
  constexpr std::string_view kPrefix = "spindle_";
  return name.size() >= kPrefix.size() && same_word(name.substr(0, kPrefix.size()), kPrefix);
}

// DEALLOCATE [PREPARE] ALL, or one of the client's names (spindle_...), drops the client's
// statements; DEALLOCATE of the application's own name leaves them be.
StatementKind deallocate_kind(std::string_view s, std::size_t at) {
  at = skip_blank(s, at);
  std::string_view word = word_at(s, at);
  if (same_word(word, "prepare")) {
    at = skip_blank(s, at + word.size());
    word = word_at(s, at);
  }
  if (word.empty() && at < s.size() && s[at] == '"') {
    word = s.substr(at + 1, skip_quoted(s, at, '"', false) - at - 1);
    if (word.starts_with("spindle_")) return StatementKind::kDropsPrepared;
    return StatementKind::kPlain;
  }
  if (word.empty() || same_word(word, "all") || spindle_name(word)) {
    return StatementKind::kDropsPrepared;  // (what the client cannot read counts as dropping)
  }
  return StatementKind::kPlain;
}

}  // namespace

StatementKind classify_statement(std::string_view sql) {
  std::size_t at = skip_blank(sql, 0);
  std::string_view first = word_at(sql, at);
  if (same_word(first, "copy")) {
    return names_client_stream(sql, at + first.size()) ? StatementKind::kCopyThroughClient
                                                       : StatementKind::kPlain;
  }
  if (same_word(first, "discard")) return discard_kind(sql, at + first.size());
  if (same_word(first, "deallocate")) return deallocate_kind(sql, at + first.size());
  if (same_word(first, "set") || same_word(first, "reset")) return StatementKind::kChangesSettings;
  // START is START TRANSACTION (the only statement it begins); the extended protocol takes one
  // statement, so no other spelling opens a transaction block from outside one.
  if (same_word(first, "begin") || same_word(first, "start")) {
    return StatementKind::kOpensTransaction;
  }
  return StatementKind::kPlain;
}

}  // namespace spindle::pg
