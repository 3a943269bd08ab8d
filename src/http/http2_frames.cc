#include "http2_frames.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "spindle/fiber/block_cache.h"

namespace spindle::http::detail {
namespace {

// nghttp2 frees without a size: each block starts with its own (kHeader keeps alignment).
constexpr std::size_t kHeader = 16;

std::size_t usable_size(void* ptr) {
  std::size_t total;
  std::memcpy(&total, static_cast<char*>(ptr) - kHeader, sizeof total);
  return total - kHeader;
}

void* block_malloc(std::size_t size, void* /*user*/) {
  try {
    std::size_t total = size + kHeader;
    char* block = static_cast<char*>(take_block(total));
    std::memcpy(block, &total, sizeof total);
    return block + kHeader;
  } catch (const std::bad_alloc&) {
    return nullptr;  // nghttp2 reports NGHTTP2_ERR_NOMEM
  }
}

void block_free(void* ptr, void* /*user*/) {
  if (ptr == nullptr) return;
  give_block(static_cast<char*>(ptr) - kHeader, usable_size(ptr) + kHeader);
}

void* block_calloc(std::size_t count, std::size_t size, void* user) {
  if (size != 0 && count > SIZE_MAX / size) return nullptr;
  void* ptr = block_malloc(count * size, user);
  if (ptr != nullptr) std::memset(ptr, 0, count * size);
  return ptr;
}

void* block_realloc(void* ptr, std::size_t size, void* user) {
  if (ptr == nullptr) return block_malloc(size, user);
  if (size == 0) {
    block_free(ptr, user);
    return nullptr;
  }
  void* moved = block_malloc(size, user);
  if (moved == nullptr) return nullptr;  // the old block stays, as realloc leaves it
  std::memcpy(moved, ptr, std::min(size, usable_size(ptr)));
  block_free(ptr, user);
  return moved;
}

nghttp2_mem block_memory_functions{nullptr, &block_malloc, &block_free, &block_calloc,
                                   &block_realloc};

}  // namespace

nghttp2_mem* block_memory() { return &block_memory_functions; }

void submit_trailers(nghttp2_session* session, std::int32_t id, const HeaderMap& trailers,
                     std::uint32_t* flags) {
  if (trailers.empty()) return;
  std::vector<nghttp2_nv> nv;
  nv.reserve(trailers.size());
  for (const Field& f : trailers) {
    nv.push_back({reinterpret_cast<std::uint8_t*>(const_cast<char*>(f.name.data())),
                  reinterpret_cast<std::uint8_t*>(const_cast<char*>(f.value.data())), f.name.size(),
                  f.value.size(), NGHTTP2_NV_FLAG_NONE});
  }
  if (nghttp2_submit_trailer(session, id, nv.data(), nv.size()) == 0) {
    *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
  }
}

FramesSent send_frames(nghttp2_session* session, Stream& stream, std::string& out,
                       Deadline deadline) {
  constexpr std::size_t kGather = 64 * 1024;
  bool failed = false;
  for (;;) {
    const std::uint8_t* data = nullptr;
    ssize_t n = nghttp2_session_mem_send(session, &data);
    if (n < 0) {
      failed = true;
      break;
    }
    if (n == 0) break;
    out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
    if (out.size() >= kGather) break;
  }
  if (out.empty()) return failed ? FramesSent::kFailed : FramesSent::kNothing;
  bool written = stream.write_all(out, deadline).has_value();
  out.clear();
  return written && !failed ? FramesSent::kSent : FramesSent::kFailed;
}

}  // namespace spindle::http::detail
