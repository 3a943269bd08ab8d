#include "spindle/net/resolver.h"

#include <netdb.h>

#include "spindle/sync/event.h"

namespace spindle {
namespace {

class ResolverCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "getaddrinfo"; }
  std::string message(int value) const override { return ::gai_strerror(value); }
};

std::error_code gai_error(int code) {
  if (code == EAI_SYSTEM) return last_errno();
  return {code, resolver_category()};
}

Result<std::vector<Address>> lookup(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list); rc != 0) {
    return fail(gai_error(rc));
  }
  std::vector<Address> addresses;
  for (addrinfo* ai = list; ai; ai = ai->ai_next) {
    if (auto a = Address::from_sockaddr(ai->ai_addr, ai->ai_addrlen)) addresses.push_back(*a);
  }
  ::freeaddrinfo(list);
  if (addresses.empty()) return fail(gai_error(EAI_NONAME));
  return addresses;
}

}  // namespace

const std::error_category& resolver_category() {
  static const ResolverCategory category;
  return category;
}

/// One lookup, shared by the asker and the helper (the asker may give up first).
struct Resolver::Lookup {
  std::string host;
  std::uint16_t port;
  Result<std::vector<Address>> result = fail(std::errc::operation_canceled);
  Event done;
};

Resolver::Resolver(std::size_t threads, LookupFunction lookup)
    : lookup_(lookup ? std::move(lookup) : LookupFunction(&spindle::lookup)) {
  for (std::size_t i = 0; i < std::max<std::size_t>(threads, 1); ++i) {
    threads_.emplace_back([this] { serve(); });
  }
}

Resolver::~Resolver() {
  std::deque<std::shared_ptr<Lookup>> abandoned;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    abandoned.swap(queue_);
  }
  work_.notify_all();
  for (auto& lookup : abandoned) lookup->done.set();
  for (auto& thread : threads_) thread.join();
}

void Resolver::serve() {
  for (;;) {
    std::shared_ptr<Lookup> lookup;
    {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      lookup = std::move(queue_.front());
      queue_.pop_front();
    }
    lookup->result = lookup_(lookup->host, lookup->port);
    lookup->done.set();
  }
}

Result<std::vector<Address>> Resolver::resolve(std::string_view host, std::uint16_t port,
                                               Deadline deadline) {
  if (auto numeric = Address::from_host_port(host, port)) return std::vector<Address>{*numeric};
  if (host.empty()) return fail(gai_error(EAI_NONAME));
  // Too late already: do not start a lookup nobody will wait for.
  if (deadline.expired()) return fail(std::errc::timed_out);
  auto request = std::make_shared<Lookup>();
  request->host = std::string(host);
  request->port = port;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return fail(std::errc::operation_canceled);
    queue_.push_back(request);
  }
  work_.notify_one();
  if (auto ec = request->done.wait(deadline)) return fail(ec);
  return request->result;
}

}  // namespace spindle
