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
  std::unique_ptr<char[]> data = std::move(free_.back());
  free_.pop_back();
  return Buffer(this, std::move(data));
}

void BufferPool::give(std::unique_ptr<char[]> data) {
  if (free_.size() < max_cached_) free_.push_back(std::move(data));
}

void BufferPool::trim(std::size_t keep) {
  if (free_.size() > keep) free_.resize(keep);
}

BufferPool::Buffer take_buffer() {
  if (Worker* worker = Worker::current()) return worker->buffers().take();
  return BufferPool::Buffer(nullptr, std::unique_ptr<char[]>(new char[BufferPool::kBufferSize]));
}

}  // namespace spindle
