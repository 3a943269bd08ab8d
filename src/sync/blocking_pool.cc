#include "spindle/sync/blocking_pool.h"

#include <algorithm>

namespace spindle {

BlockingPool::BlockingPool(std::size_t threads) {
  for (std::size_t i = 0; i < std::max<std::size_t>(threads, 1); ++i) {
    threads_.emplace_back([this] { loop(); });
  }
}

BlockingPool::~BlockingPool() {
  {
    std::lock_guard guard(lock_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void BlockingPool::submit(std::function<void()> task) {
  {
    std::lock_guard guard(lock_);
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void BlockingPool::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock guard(lock_);
      wake_.wait(guard, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace spindle
