#pragma once
// Between log.cc and log_output.cc (private to src/base): the error log's state is freed at
// exit after the writers that read it stop, so that a run ends with nothing in use.

namespace spindle::detail {

/// Registers, once, the exit handler that closes standard output and standard error (their
/// writers write what waits, by finish_by's deadline, and stop), frees them, then frees the
/// error log's per-place table (free_log_places). Lines logged after it go straight to
/// standard error.
void close_logs_at_exit();

/// The exit handler began: the error log makes no writer any more (log.cc).
void mark_logs_closing();
/// Frees the error log's per-place table; the limit is off from then on (log.cc).
void free_log_places();

}  // namespace spindle::detail
