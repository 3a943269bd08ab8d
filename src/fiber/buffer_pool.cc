#include "spindle/fiber/buffer_pool.h"

#include "spindle/fiber/worker.h"

namespace spindle {

void BufferPool::Buffer::release() {
  if (pool_ != nullptr && data_) pool_->give(std::move(data_));
  pool_ = nullptr;
  data_.reset();
}

BufferPool::Buffer BufferPool::take() {
  if (free_.empty()) {
    // Not value-initialised: a buffer is written before it is read.
    return Buffer(this, std::unique_ptr<char[]>(new char[kBufferSize]));
  }
  return Buffer(this, free_.take());
}

void BufferPool::give(std::unique_ptr<char[]> data) {
  (void)free_.give(std::move(data));  // freed when it goes out of scope if not kept
}

std::size_t BufferPool::trim() {
  return free_.trim([](std::unique_ptr<char[]>) {}) * kBufferSize;
}

BufferPool::Buffer take_buffer() {
  if (Worker* worker = Worker::current()) return worker->buffers().take();
  return BufferPool::Buffer(nullptr, std::unique_ptr<char[]>(new char[BufferPool::kBufferSize]));
}

}  // namespace spindle
