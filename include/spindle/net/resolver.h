#pragma once
/// Resolver: host name lookups that never block a worker. getaddrinfo runs on the resolver's
/// helper threads; the asking fiber parks until the answer or its deadline.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "spindle/base/error.h"
#include "spindle/io/deadline.h"
#include "spindle/net/address.h"

namespace spindle {

/// The category of getaddrinfo's EAI_* errors ("getaddrinfo"), with gai_strerror messages.
const std::error_category& resolver_category();

/// Resolves host names on helper threads. Thread-safe; share one per process or per runtime.
class Resolver {
 public:
  /// How a helper looks a name up: getaddrinfo unless a test gives another (one that is slow,
  /// say, to show that a worker keeps running meanwhile).
  using LookupFunction =
      std::function<Result<std::vector<Address>>(const std::string& host, std::uint16_t port)>;

  /// Starts `threads` helper threads (at least 1).
  explicit Resolver(std::size_t threads = 2, LookupFunction lookup = {});
  /// Stops the helpers; lookups still queued fail with std::errc::operation_canceled. Waits for
  /// lookups in progress (getaddrinfo cannot be interrupted).
  ~Resolver();
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  /// The addresses of `host` (a name, or a numeric IPv4/IPv6 literal answered at once) with
  /// `port`, IPv4 and IPv6, in getaddrinfo's order. From a fiber it parks; from a plain thread it
  /// sleeps. Fails with a resolver_category() error (no such host, ...), std::errc::timed_out
  /// or std::errc::operation_canceled; an abandoned lookup finishes harmlessly in the background.
  [[nodiscard]] Result<std::vector<Address>> resolve(std::string_view host, std::uint16_t port,
                                                     Deadline deadline = Deadline::never());

 private:
  struct Lookup;

  /// A helper thread's body.
  void serve();

  /// getaddrinfo, or a test's stand-in.
  LookupFunction lookup_;
  /// Guards queue_ and stopping_.
  std::mutex mutex_;
  /// Signals queued work to the helpers.
  std::condition_variable work_;
  /// Lookups waiting for a helper.
  std::deque<std::shared_ptr<Lookup>> queue_;
  /// Set by the destructor.
  bool stopping_ = false;
  /// The helper threads.
  std::vector<std::thread> threads_;
};

}  // namespace spindle
