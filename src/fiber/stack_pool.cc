#include "spindle/fiber/stack_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <system_error>

#include "pages.h"
#include "spindle/base/error.h"

#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#else
#define VALGRIND_STACK_REGISTER(start, end) 0u
#define VALGRIND_STACK_DEREGISTER(id) ((void)(id))
#endif

namespace spindle {
namespace {

using detail::page_size;
using detail::round_to_pages;

Stack map_stack(std::size_t size) {
  const std::size_t guard = StackPool::guard_size();
  void* region = ::mmap(nullptr, size + guard, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (region == MAP_FAILED) throw std::system_error(last_errno(), "fiber stack: mmap");
  if (::mprotect(region, guard, PROT_NONE) != 0) {
    auto ec = last_errno();
    ::munmap(region, size + guard);
    // ENOMEM here is the mapping count: the guard page splits the region in two.
    throw std::system_error(ec, "fiber stack: guard page (vm.max_map_count?)");
  }
  char* base = static_cast<char*>(region) + guard;
  // Tells valgrind this range is a stack, so a switch onto it is not taken for a huge frame.
  unsigned id = VALGRIND_STACK_REGISTER(base, base + size);
  return Stack{base, size, id};
}

void unmap_stack(Stack stack) {
  const std::size_t guard = StackPool::guard_size();
  VALGRIND_STACK_DEREGISTER(stack.valgrind_id);
  ::munmap(static_cast<char*>(stack.base) - guard, stack.size + guard);
}

}  // namespace

std::size_t StackPool::guard_size() { return page_size(); }

StackPool::StackPool(std::size_t stack_size, std::size_t max_cached)
    : stack_size_(round_to_pages(stack_size)), free_(kFloor, max_cached) {}

StackPool::~StackPool() {
  free_.clear([](Stack s) { unmap_stack(s); });
}

Stack StackPool::allocate(std::size_t size) {
  if (fail_next_ > 0) {
    --fail_next_;
    throw std::system_error(std::make_error_code(std::errc::not_enough_memory),
                            "fiber stack: mmap (injected failure)");
  }
  size = size == 0 ? stack_size_ : round_to_pages(size);
  if (size == stack_size_ && !free_.empty()) return free_.take();
  return map_stack(size);
}

void StackPool::deallocate(Stack stack) {
  if (stack.size != stack_size_ || !free_.give(std::move(stack))) unmap_stack(stack);
}

std::size_t StackPool::trim() {
  return free_.trim([](Stack s) { unmap_stack(s); }) * (stack_size_ + guard_size());
}

}  // namespace spindle
