#include "spindle/fiber/runtime.h"

#include <signal.h>

#include <algorithm>
#include <thread>

#include "stack_overflow.h"

namespace spindle {

Runtime::Runtime(RuntimeOptions options) : options_(options) {
  if (options_.workers == 0) {
    options_.workers = std::max(1u, std::thread::hardware_concurrency());
  }
  workers_.reserve(options_.workers);
  for (std::size_t i = 0; i < options_.workers; ++i) {
    workers_.push_back(std::unique_ptr<Worker>(new Worker(*this, i, options_)));
  }
}

Runtime::~Runtime() {
  stop();
  join();
}

void Runtime::start() {
  if (started_) return;
  started_ = true;
  if (options_.ignore_sigpipe) {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  }
  if (options_.report_stack_overflow) install_stack_overflow_handler();
  for (auto& worker : workers_) worker->start();
}

void Runtime::stop() {
  for (auto& worker : workers_) worker->request_stop();
}

void Runtime::cancel_fibers() {
  for (auto& worker : workers_) {
    Worker* w = worker.get();
    w->post([w] { w->cancel_all(); });
  }
}

void Runtime::join() {
  assert(Worker::current() == nullptr && "Runtime::join from a worker thread");
  if (!started_ || joined_) return;
  for (auto& worker : workers_) worker->join();
  joined_ = true;
}

}  // namespace spindle
