#pragma once
// What the fuzz drivers check beyond sanitizers: views inside the input, and plain aborts
// (libFuzzer keeps the input that made one).
#include <cstdlib>
#include <string_view>

/// True if `part` is empty or lies inside `whole`.
inline bool inside(std::string_view part, std::string_view whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

/// Aborts (a finding) unless `ok`.
inline void check(bool ok) {
  if (!ok) std::abort();
}
