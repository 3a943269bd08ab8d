// The fiber Redis client: commands written by the calling fiber (pipelined: whoever finds no
// write in progress writes everything queued), replies read by one reader fiber per connection
// and handed to the callers in order.

#include "spindle/proxy/redis.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include <atomic>
#include <deque>

#include "spindle/base/log.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/worker.h"
#include "spindle/net/tcp_stream.h"
#include "spindle/sync/event.h"

namespace spindle::proxy {
namespace {

// Calls waiting on one connection beyond which a new call fails at once (Redis is not
// answering; more would only queue).
constexpr std::size_t kMaxPending = 4096;
// What one reply may announce: elements over all its arrays, and bytes held unparsed. Every
// reply spindle asks for is a few elements and bytes; hiredis allocates an array's slots when
// its header arrives (`*2147483647\r\n`: 16 GiB, walked again to free it).
constexpr std::size_t kMaxReplyElements = 1024;
constexpr std::size_t kMaxReplyBytes = 1 << 20;

// The process's error replies by kind: few (each starts a back-off), from any worker.
std::array<std::atomic<std::uint64_t>, kRedisErrorLabels.size()> error_replies_by_kind{};

}  // namespace

RedisErrorKind redis_error_kind(std::string_view text) {
  std::string_view code = text.substr(0, text.find(' '));
  for (std::size_t i = 0; i + 1 < kRedisErrorLabels.size(); ++i) {
    if (code == kRedisErrorLabels[i]) return static_cast<RedisErrorKind>(i);
  }
  return RedisErrorKind::kOther;
}

std::uint64_t redis_error_replies(RedisErrorKind kind) {
  return error_replies_by_kind[static_cast<std::size_t>(kind)].load(std::memory_order_relaxed);
}

// The reply being read: elements its arrays announced so far (the reader's privdata). (Not in
// the anonymous namespace: a member of RedisClient::Connection.)
struct RedisReplyBudget {
  std::size_t elements = 0;
  bool exceeded = false;
};

namespace {

void* (*default_create_array)(const redisReadTask*, int) = nullptr;

// hiredis's own array, unless the reply would announce more than kMaxReplyElements in all;
// then no object, which fails the reader ("Out of memory") before anything is allocated.
void* bounded_create_array(const redisReadTask* task, int elements) {
  auto* budget = static_cast<RedisReplyBudget*>(task->privdata);
  if (static_cast<std::size_t>(elements) > kMaxReplyElements - budget->elements) {
    budget->exceeded = true;
    return nullptr;
  }
  budget->elements += static_cast<std::size_t>(elements);
  return default_create_array(task, elements);
}

// hiredis's reply functions with arrays bounded.
redisReplyObjectFunctions* bounded_functions() {
  static redisReplyObjectFunctions functions = [] {
    redisReader* probe = redisReaderCreate();
    redisReplyObjectFunctions f = *probe->fn;
    redisReaderFree(probe);
    default_create_array = f.createArray;
    f.createArray = bounded_create_array;
    return f;
  }();
  return &functions;
}

RedisReply convert(const redisReply& r) {
  RedisReply out;
  switch (r.type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.text.assign(r.str, r.len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.text.assign(r.str, r.len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.text.assign(r.str, r.len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r.integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r.elements);
      for (std::size_t i = 0; i < r.elements; ++i) out.elements.push_back(convert(*r.element[i]));
      break;
    default:
      out.type = RedisReply::Type::kNil;
      break;
  }
  return out;
}

}  // namespace

std::string redis_command(std::span<const std::string_view> args) {
  std::string out = fmt::format("*{}\r\n", args.size());
  for (std::string_view arg : args) {
    fmt::format_to(std::back_inserter(out), "${}\r\n", arg.size());
    out.append(arg);
    out += "\r\n";
  }
  return out;
}

struct RedisClient::Connection {
  struct Pending {
    Result<RedisReply> result = fail(std::errc::connection_reset);
    Event done;
    /// AUTH or SELECT: an error reply breaks the connection.
    bool handshake = false;
  };

  Connection(TcpStream s, Worker* w) : stream(std::move(s)), worker(w) {
    reader->privdata = &budget;  // (hiredis 0.14's redisReaderSetPrivdata casts it to int)
  }
  ~Connection() { redisReaderFree(reader); }

  /// Marks the connection broken (once) and fails every call still waiting with `ec`.
  void break_with(std::error_code ec) {
    if (!broken) {
      broken = true;
      broken_at = Clock::now();
      (void)stream.shutdown(TcpStream::Shutdown::kBoth);
    }
    while (!pending.empty()) {
      pending.front()->result = std::unexpected(ec);
      pending.front()->done.set();
      pending.pop_front();
    }
  }

  /// Writes what is queued, unless another fiber is at it already.
  void flush(Deadline deadline) {
    if (writing) return;
    writing = true;
    while (!out.empty() && !broken) {
      std::string chunk;
      chunk.swap(out);
      if (auto written = stream.write_all(chunk, deadline); !written) break_with(written.error());
    }
    writing = false;
  }

  /// The reader fiber's body: replies to the callers, in order, until the connection breaks.
  void read_replies() {
    std::vector<char> buffer(16 * 1024);
    while (!broken) {
      auto n = stream.read(buffer, Deadline::never());
      if (!n || *n == 0) {
        if (!broken)
          log_warn("redis {}: connection lost ({})", peer, n ? "closed" : n.error().message());
        break_with(n ? make_error(std::errc::connection_reset) : n.error());
        break;
      }
      if (redisReaderFeed(reader, buffer.data(), *n) != REDIS_OK) {
        break_with(make_error(std::errc::protocol_error));
        break;
      }
      for (;;) {
        void* raw = nullptr;
        if (redisReaderGetReply(reader, &raw) != REDIS_OK) {
          if (budget.exceeded) {
            log_warn("redis {}: a reply announcing more than {} elements: connection dropped", peer,
                     kMaxReplyElements);
          } else {
            log_warn("redis {}: unreadable reply: {}", peer, reader->errstr);
          }
          break_with(make_error(std::errc::protocol_error));
          break;
        }
        if (raw == nullptr) {
          if (reader->len - reader->pos > kMaxReplyBytes) {
            log_warn("redis {}: a reply larger than {} bytes: connection dropped", peer,
                     kMaxReplyBytes);
            break_with(make_error(std::errc::protocol_error));
          }
          break;
        }
        budget = RedisReplyBudget();
        auto* reply = static_cast<redisReply*>(raw);
        RedisReply converted = convert(*reply);
        freeReplyObject(reply);
        if (pending.empty()) {
          log_warn("redis {}: a reply nobody asked for", peer);
          break_with(make_error(std::errc::protocol_error));
          break;
        }
        auto call = std::move(pending.front());
        pending.pop_front();
        if (call->handshake && converted.type == RedisReply::Type::kError) {
          log_warn("redis {}: {}", peer, converted.text);
          call->result = fail(std::errc::protocol_error);
          call->done.set();
          break_with(make_error(std::errc::protocol_error));
          break;
        }
        call->result = std::move(converted);
        call->done.set();
      }
    }
  }

  TcpStream stream;
  /// The worker whose reactor the socket is registered with: it must be closed there.
  Worker* worker;
  std::string peer;
  redisReader* reader = redisReaderCreateWithFunctions(bounded_functions());
  /// What the reply being read has announced.
  RedisReplyBudget budget;
  std::deque<std::shared_ptr<Pending>> pending;
  /// Encoded commands not written yet.
  std::string out;
  bool writing = false;
  bool broken = false;
  Clock::time_point broken_at{};
};

RedisClient::RedisClient(RedisConfig config, std::optional<Address> address)
    : config_(std::move(config)), address_(std::move(address)) {}

RedisClient::~RedisClient() {
  if (!connection_) return;
  // The socket belongs to its worker's reactor: shut it (which ends the reader fiber) and let
  // the last reference go there.
  Worker* worker = connection_->worker;
  worker->post([connection = std::move(connection_)] {
    connection->break_with(make_error(std::errc::operation_canceled));
  });
}

Result<std::shared_ptr<RedisClient::Connection>> RedisClient::open(Deadline deadline) {
  ++connects_;
  // A name discovery has not answered yet: refused, as an unreachable Redis is (fail_open).
  if (!address_) return fail(std::errc::connection_refused);
  auto stream = TcpStream::connect(*address_, deadline);
  if (!stream) return std::unexpected(stream.error());
  (void)stream->set_nodelay(true);
  auto connection = std::make_shared<Connection>(std::move(*stream), Worker::current());
  connection->peer = config_.address();
  auto handshake = [&](std::initializer_list<std::string_view> args) {
    auto call = std::make_shared<Connection::Pending>();
    call->handshake = true;
    connection->pending.push_back(call);
    connection->out += redis_command(std::span(args.begin(), args.size()));
  };
  if (!config_.password.empty()) handshake({"AUTH", config_.password});
  std::string database = std::to_string(config_.database);
  if (config_.database != 0) handshake({"SELECT", database});
  spawn([connection] { connection->read_replies(); }).detach();
  return connection;
}

void RedisClient::drop(const std::shared_ptr<Connection>& connection) {
  connection->break_with(make_error(std::errc::connection_reset));
  if (connection_ == connection) connection_.reset();
  retry_at_ = Clock::now() + config_.backoff;
}

Result<RedisReply> RedisClient::call(std::span<const std::string_view> args, Deadline deadline) {
  deadline = earliest(deadline, Deadline::after(config_.timeout));
  // After an error reply, the connection is kept but left alone for the back-off.
  if (connection_ && Clock::now() < retry_at_) return fail(std::errc::connection_refused);
  if (connection_ && connection_->broken) {
    retry_at_ = connection_->broken_at + config_.backoff;
    connection_.reset();
  }
  if (!connection_ && connecting_) {
    // Another fiber is connecting: wait for its outcome.
    std::shared_ptr<Event> connecting = connecting_;
    if (std::error_code ec = connecting->wait(deadline); ec) return std::unexpected(ec);
    if (!connection_) return fail(std::errc::connection_refused);
  }
  if (!connection_) {
    if (Clock::now() < retry_at_) return fail(std::errc::connection_refused);
    auto connecting = connecting_ = std::make_shared<Event>();
    auto opened = open(deadline);
    connecting_.reset();
    if (opened) {
      connection_ = std::move(*opened);
    } else {
      retry_at_ = Clock::now() + config_.backoff;
      log_warn("redis {}: cannot connect ({}); next try in {} ms", config_.address(),
               opened.error().message(), config_.backoff.count());
    }
    connecting->set();
    if (!opened) return std::unexpected(opened.error());
  }
  std::shared_ptr<Connection> connection = connection_;
  if (connection->pending.size() >= kMaxPending) return fail(std::errc::timed_out);
  auto call = std::make_shared<Connection::Pending>();
  connection->pending.push_back(call);
  connection->out += redis_command(args);
  connection->flush(deadline);
  if (std::error_code ec = call->done.wait(deadline); ec) {
    // Redis is slow or gone: the replies still due would come too late for anyone; drop the
    // connection so the next calls do not queue behind them.
    if (!connection->broken) {
      log_warn("redis {}: no reply in time ({}); reconnecting in {} ms", config_.address(),
               ec.message(), config_.backoff.count());
    }
    drop(connection);
    return std::unexpected(ec);
  }
  if (call->result && call->result->type == RedisReply::Type::kError) refused(call->result->text);
  return std::move(call->result);
}

void RedisClient::refused(std::string_view error) {
  ++error_replies_;
  error_replies_by_kind[static_cast<std::size_t>(redis_error_kind(error))].fetch_add(
      1, std::memory_order_relaxed);
  auto now = Clock::now();
  // Replies pipelined before the back-off began may all be errors: one line per back-off.
  if (now >= retry_at_) {
    log_warn("redis {}: {}; next try in {} ms", config_.address(), error, config_.backoff.count());
  }
  retry_at_ = now + config_.backoff;
}

RedisClients::RedisClients(RedisConfig config, std::optional<Address> address, std::size_t workers)
    : config_(std::move(config)), address_(std::move(address)), clients_(workers) {}

RedisClient& RedisClients::current() {
  auto& slot = clients_.at(Worker::current()->index());
  if (!slot) slot = std::make_unique<RedisClient>(config_, address_);
  return *slot;
}

}  // namespace spindle::proxy
