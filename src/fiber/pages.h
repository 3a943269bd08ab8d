#pragma once
// Memory mapped by the page (private to src/fiber): fiber stacks and slab blocks.

#include <unistd.h>

#include <cstddef>

namespace spindle::detail {

/// The system's page size.
inline std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

/// `n` rounded up to whole pages.
inline std::size_t round_to_pages(std::size_t n) {
  const std::size_t page = page_size();
  return (n + page - 1) / page * page;
}

}  // namespace spindle::detail
