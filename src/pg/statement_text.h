#pragma once
// What the client must know of a statement from its text before sending it (private to
// src/pg; pure: no I/O). Read once per unnamed statement sent, and once per prepared statement
// and connection: the first keyword, past blanks and comments, and for COPY its words.

#include <cstdint>
#include <string_view>

namespace spindle::pg {

enum class StatementKind : std::uint8_t {
  kPlain,              ///< nothing the client must do
  kCopyThroughClient,  ///< COPY ... FROM STDIN / TO STDOUT: data through the connection
  kDropsPrepared,      ///< DISCARD / DEALLOCATE: may drop the connection's prepared statements
  kOpensTransaction,   ///< BEGIN / START TRANSACTION: the session stays in a transaction block
  kChangesSettings,    ///< SET / RESET: may change a session setting the decoders rely on
};

/// The kind of `sql`. A COPY counts as through the client when STDIN or STDOUT is one of its
/// words outside literals, quoted names and comments (a column named stdin, unquoted, is
/// taken for one too).
StatementKind classify_statement(std::string_view sql);

}  // namespace spindle::pg
