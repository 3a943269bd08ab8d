// HttpServer: accepting connections and keeping them between requests — active (a fiber runs
// the HTTP/1 or HTTP/2 driver) <-> idle (nothing runs; the reactor wakes it) -> closed.
#include "spindle/server/server.h"

#include "response_head.h"
#include "server_internal.h"
#include "spindle/base/log.h"
#include "spindle/fiber/spawn.h"
#include "spindle/sync/wait_group.h"

namespace spindle::http {
namespace {

using detail::ConnectionPtr;
using detail::ConnectionState;
using detail::WorkerState;

// The answer to a connection the server cannot take (too many open, or no fiber for it).
constexpr std::string_view kOverloaded =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 24\r\n"
    "Connection: close\r\n\r\n503 Service Unavailable\n";

void unlink_idle(ConnectionState* state) {
  WorkerState& worker = *state->worker;
  if (state->prev_idle) {
    state->prev_idle->next_idle = state->next_idle;
  } else {
    worker.idle_head = state->next_idle;
  }
  if (state->next_idle) state->next_idle->prev_idle = state->prev_idle;
  state->prev_idle = state->next_idle = nullptr;
  state->idle = false;
}

void run_connection(ConnectionPtr state, bool h2 = false, bool batched = false);
void run_ready_connections(const std::shared_ptr<HttpServer::Shared>& shared, WorkerState& worker);
void refuse_ready_connections(WorkerState& worker);

// Starts a fiber that serves woken connections until none is left. It holds the server's
// shared state: the connections it finds may all have closed by the time it runs. False if it
// could not start (no stack): the worker logged why.
bool spawn_runner(const std::shared_ptr<HttpServer::Shared>& shared, WorkerState& worker) {
  ++worker.runners_starting;
  auto runner = spawn([shared, &worker] { run_ready_connections(shared, worker); },
                      SpawnOptions{.stack_size = shared->options.tcp.stack_size});
  if (!runner.finished()) return true;  // a fiber that could not start has finished already
  --worker.runners_starting;
  try {
    runner.join();
  } catch (...) {
    // The worker logged why.
  }
  return false;
}

// An idle connection joins the worker's ready list, which a fiber serves (one is started if
// none is on its way).
void make_ready(ConnectionState* state) {
  unlink_idle(state);
  WorkerState& worker = *state->worker;
  if (worker.ready_tail) {
    worker.ready_tail->next_idle = state;
  } else {
    worker.ready_head = state;
  }
  worker.ready_tail = state;
  if (worker.runners_starting != 0 || spawn_runner(state->shared, worker)) return;
  // No fiber for them (no memory for a stack): the connections waiting get a 503 rather than
  // wait for ever, once the reactor is done with this batch of events.
  Worker::current()->post([shared = state->shared, &worker] { refuse_ready_connections(worker); });
}

// The reactor saw bytes (or a hang-up) on an idle connection.
void on_idle_readable(IoSlot& slot) { make_ready(static_cast<ConnectionState*>(slot.owner)); }

// Answers every connection on the ready list 503 (HTTP/2: GOAWAY), best effort, without
// waiting, and closes it.
void refuse_ready_connections(WorkerState& worker) {
  std::size_t refused = 0;
  while (ConnectionPtr state{worker.ready_head}) {
    worker.ready_head = state->next_idle;
    if (!worker.ready_head) worker.ready_tail = nullptr;
    state->next_idle = nullptr;
    // Outside a fiber these calls never wait: each does what the socket allows now. The
    // request is read first, so that the close sends a FIN after the answer, not a reset.
    char sink[512];
    for (int i = 0; i < 16; ++i) {
      auto n = state->stream.read(sink, Deadline::never());
      if (!n || *n == 0) break;
    }
    if (state->http2) {
      detail::refuse_http2(*state);
    } else if (!state->unsent.empty()) {
      // Woken to write the rest of an answer (write_unsent): a 503 now would land inside that
      // answer's body. The rest goes as far as the socket takes it; the close then cuts it.
      (void)state->stream.write_all(state->unsent, Deadline::never());
    } else {
      (void)state->stream.write_all(kOverloaded, Deadline::never());
    }
    ++refused;
  }
  if (refused > 0) {
    log_warn(
        "worker {}: {} idle connection(s) refused (503, or GOAWAY on HTTP/2): no fiber could start",
        Worker::current()->index(), refused);
  }
}

// Writes the responses a runner's batch left unsent, without waiting: one the socket does not
// take whole now (or at all: an error) stays with its connection, which is woken to write the
// rest itself, waiting for the socket or failing as any activation does.
void write_unsent(WorkerState& worker) {
  for (ConnectionState* state : worker.unsent) {
    std::string& out = state->unsent;
    const std::size_t written = state->stream.tcp()->write_now(out);
    if (written == out.size()) {
      worker.buffers->recycle_output(std::move(out));
    } else {
      out.erase(0, written);
      detail::wake_idle(*state);
    }
  }
  worker.unsent.clear();
}

// What a runner's suspend hook needs: the batch's unsent responses, and a second runner.
struct Standby {
  const std::shared_ptr<HttpServer::Shared>& shared;
  WorkerState& worker;
};

// Armed on a runner for each connection it serves: should that connection block (a slow
// handler, a full socket), the batch's responses so far go out first, and a second runner
// starts for the connections still waiting on the list.
void before_block(void* arg) {
  auto& standby = *static_cast<Standby*>(arg);
  write_unsent(standby.worker);
  if (standby.worker.ready_head && standby.worker.runners_starting == 0) {
    (void)spawn_runner(standby.shared, standby.worker);
  }
}

// Connections read ahead of their activations at a time: what a batch holds in read buffers
// at once is bounded, whatever a poll finds.
constexpr int kReadAhead = 16;

// Serves the ready connections one after another on the calling fiber. A fiber per woken
// connection would cost a spawn and two switches per keep-alive request; one fiber serves a
// whole batch of them instead, and a second starts only if the connection in hand blocks
// (spindle::detail::on_next_suspend): no connection waits behind another, and a batch that never
// blocks costs one fiber. (If the second cannot start, this one still serves them all, in
// turn.)
//
// Each step of a keep-alive request is done for the whole batch in a row, not request by
// request: up to kReadAhead requests are read, then answered, then the answers written
// (write_unsent), so that the code and tables of each step stay in the caches from one request
// to the next instead of being evicted by the kernel's work in between. The answers wait for the
// batch's end only as long as nothing blocks: before this fiber parks, they go out
// (before_block).
void run_ready_connections(const std::shared_ptr<HttpServer::Shared>& shared, WorkerState& worker) {
  --worker.runners_starting;
  Standby standby{shared, worker};
  while (worker.ready_head) {
    if (!worker.ready_head->read_ahead_tried) {
      int n = 0;
      for (ConnectionState* s = worker.ready_head; s && n < kReadAhead; s = s->next_idle, ++n) {
        if (!s->read_ahead_tried) detail::read_ahead(*s);
      }
    }
    ConnectionPtr state{worker.ready_head};
    worker.ready_head = state->next_idle;
    if (!worker.ready_head) worker.ready_tail = nullptr;
    state->next_idle = nullptr;
    spindle::detail::on_next_suspend(&before_block, &standby);
    run_connection(std::move(state), false, true);
  }
  spindle::detail::on_next_suspend(nullptr, nullptr);
  write_unsent(worker);
}

// The keep-alive timer fired: closes the connection if it has been idle for the whole
// timeout; otherwise (it was busy meanwhile) the timer goes back for the rest of the time. An
// HTTP/2 connection runs once more, to say GOAWAY.
void on_idle_timeout(Timer& timer) {
  auto* state = static_cast<ConnectionState*>(timer.owner);
  auto timeout = state->shared->options.keepalive_timeout;
  auto now = Clock::now();
  if (!state->idle || now - state->idle_since < timeout) {
    timer.when = state->idle ? state->idle_since + timeout : now + timeout;
    Worker::current()->timers().push(&timer);
    return;
  }
  state->stream.cancel_on_readable();
  if (state->http2) {
    state->idle_expired = true;
    make_ready(state);
    return;
  }
  unlink_idle(state);
  ConnectionPtr closing(state);
}

// The connection waits in the reactor: the worker's idle list holds it until bytes arrive
// (on_idle_readable), the keep-alive timer fires or the server drains.
void go_idle(ConnectionPtr owned) {
  ConnectionState* state = owned.release();
  WorkerState& worker = *state->worker;
  state->next_idle = worker.idle_head;
  if (worker.idle_head) worker.idle_head->prev_idle = state;
  worker.idle_head = state;
  state->idle = true;
  state->idle_since = coarse_now();  // a tick early at most: the timeout is seconds
  if (!state->idle_timer.queued()) {
    state->idle_timer.when = state->idle_since + state->shared->options.keepalive_timeout;
    state->idle_timer.on_fire = &on_idle_timeout;
    state->idle_timer.owner = state;
    Worker::current()->timers().push(&state->idle_timer);
  }
  state->stream.on_readable(&on_idle_readable, state);
}

// One activation, on the calling fiber (`h2`: a new connection whose TLS handshake chose
// HTTP/2; `batched`: one of a runner's batch). Whatever the driver throws ends this connection
// only: `state` closes it on the way out.
void run_connection(ConnectionPtr state, bool h2, bool batched) {
  state->read_ahead_tried = false;  // for its next time on the ready list
  if (state->stream.tls() != nullptr) state->worker->tls_buffers->activate(*state);
  auto outcome = detail::Activation::kClose;
  try {
    outcome =
        h2 || state->http2 ? detail::serve_http2(*state) : detail::serve_http1(*state, batched);
  } catch (const std::exception& e) {
    log_error("connection from {} failed: {}", state->remote_text(), e.what());
  } catch (...) {
    log_error("connection from {} failed: an exception of unknown type", state->remote_text());
  }
  if (outcome == detail::Activation::kIdle) go_idle(std::move(state));
}

// Closes every idle HTTP/1 connection of the calling worker (draining). The HTTP/2 ones run
// again to say GOAWAY (shut_down_http2).
void close_idle_connections(WorkerState& worker) {
  ConnectionState* state = worker.idle_head;
  while (state != nullptr) {
    ConnectionState* next = state->next_idle;
    if (!state->http2) {
      state->stream.cancel_on_readable();
      unlink_idle(state);
      ConnectionPtr closing(state);
    }
    state = next;
  }
}

}  // namespace

detail::ConnectionState::ConnectionState(Stream s, std::shared_ptr<HttpServer::Shared> sh,
                                         WorkerState& w)
    : stream(std::move(s)), shared(std::move(sh)), worker(&w) {
  // (Counted in worker->open since its accept: serve_accepted.)
  shared->active.add();
  if (stream.tls() != nullptr) {
    if (!worker->tls_buffers) {
      worker->tls_buffers = std::make_shared<TlsBuffers>();
      Worker::current()->keep_trimmed(worker->tls_buffers);
    }
    worker->tls_buffers->add(*this);
  }
}

detail::ConnectionState::~ConnectionState() {
  http2.reset();  // before the socket it writes to
  Worker::current()->timers().erase(&idle_timer);
  if (read_ahead != nullptr)
    worker->buffers->reads(read_buffer_size(shared->options)).give(read_ahead);
  // TLS ends with close_notify: a client whose connection just stops takes it for a truncation
  // and forgets the session, so its next connection would pay for a full handshake.
  if (TlsStream* tls = stream.tls()) {
    (void)tls->shutdown(TcpStream::Shutdown::kWrite);
    worker->tls_buffers->remove(*this);
  }
  --worker->open;
  Worker::current()->note_released(sizeof(ConnectionState));
  shared->active.done();  // the socket closes right after, with the members
}

void detail::TlsBuffers::add(ConnectionState& state) {
  state.next_tls = head_;
  if (head_ != nullptr) head_->prev_tls = &state;
  head_ = &state;
  state.tls_buffers_held = true;
  ++holding_;
}

void detail::TlsBuffers::remove(ConnectionState& state) {
  if (state.prev_tls != nullptr) {
    state.prev_tls->next_tls = state.next_tls;
  } else {
    head_ = state.next_tls;
  }
  if (state.next_tls != nullptr) state.next_tls->prev_tls = state.prev_tls;
  state.prev_tls = state.next_tls = nullptr;
  if (std::exchange(state.tls_buffers_held, false)) --holding_;
}

void detail::TlsBuffers::activate(ConnectionState& state) {
  if (!std::exchange(state.tls_buffers_held, true)) ++holding_;
}

std::size_t detail::TlsBuffers::trim() {
  constexpr std::size_t kBuffers = 34 * 1024;  // a read and a write buffer, about
  std::size_t released = 0;
  for (ConnectionState* state = head_; state != nullptr; state = state->next_tls) {
    if (!state->tls_buffers_held) continue;
    TlsStream& tls = *state->stream.tls();
    if (std::exchange(state->tls_io_seen, tls.io_count()) != tls.io_count()) continue;  // busy
    if (!tls.release_buffers()) continue;  // a record half read or written: the next trim
    state->tls_buffers_held = false;
    --holding_;
    ++released;
  }
  // Counted as other layers' frees are: a malloc_trim for them only once the worker is quiet
  // (connections going quiet one by one while others are busy leave blocks they will reuse).
  Worker::current()->note_released(released * kBuffers);
  return 0;
}

void detail::wake_idle(ConnectionState& state) {
  if (!state.idle) return;  // running, or on the ready list already
  state.stream.cancel_on_readable();
  make_ready(&state);
}

const std::string& detail::ConnectionState::remote_text() {
  if (remote.empty()) remote = client_address_text(stream.peer_address());
  return remote;
}

const RequestContext& detail::ConnectionState::request_context(int major_version) {
  if (!facts) {
    // Once per connection: it outlives this activation.
    auto made = std::make_unique<Facts>();
    RequestContext& context = made->context;
    context.remote = remote_text();
    if (auto peer = stream.peer_address()) {
      made->peer = *peer;
      context.peer = &*made->peer;
    }
    if (auto local = stream.local_address()) {
      made->local = *local;
      context.local = &*made->local;
    }
    if (TlsStream* tls = stream.tls()) {
      context.tls = true;
      context.server_name = tls->server_name();
      context.alpn = tls->alpn();
    }
    facts = std::move(made);
  }
  facts->context.major_version = major_version;
  facts->context.started = coarse_now();
  return facts->context;
}

namespace {

// The router's response, or the error a handler's exception stands for. Each return is a
// prvalue, built where the caller wants it (a response is a few KiB: a move shows).
Response handle_guarded(const Router& router, Request& request) {
  try {
    return router.handle(request);
  } catch (const HttpError& e) {
    return Response::error(e.status(), e.what());
  } catch (const std::exception& e) {
    log_error("handler for {} {} threw: {}", request.method(), request.target(), e.what());
  } catch (...) {
    log_error("handler for {} {} threw an exception of unknown type", request.method(),
              request.target());
  }
  return Response::error(500);
}

}  // namespace

Response detail::call_router(const Router& router, Request& request) {
  Response response = handle_guarded(router, request);
  refuse_unsendable(response, request.method(), request.target());
  return response;
}

namespace {

// What every connection of one configuration of the server reads.
std::shared_ptr<HttpServer::Shared> make_shared_state(Runtime& runtime, Router router,
                                                      ServerOptions options) {
  auto shared = std::make_shared<HttpServer::Shared>();
  shared->router = std::move(router);
  shared->options = std::move(options);
  if (!shared->options.server_name.empty()) {
    shared->server_line = "Server: " + shared->options.server_name + "\r\n";
  }
  shared->runtime = &runtime;
  shared->workers = std::vector<WorkerState>(runtime.size());
  // The first read of a connection then finds its request: no empty read, no idle round trip.
  auto defer = std::chrono::ceil<std::chrono::seconds>(shared->options.header_timeout).count();
  shared->options.tcp.listen.defer_accept_seconds = static_cast<int>(std::max<long>(1, defer));
  return shared;
}

// Serves one accepted connection with the configuration in force on the calling worker.
void serve_accepted(const std::shared_ptr<HttpServer::Shared>& shared, TcpStream tcp) {
  WorkerState& worker = shared->workers[Worker::current()->index()];
  const ServerOptions& options = shared->options;
  if (worker.open >= options.max_connections_per_worker) {
    // A TLS client would not understand a plain answer: it is just closed.
    if (!options.tls) (void)tcp.write_all(kOverloaded, Deadline::after(std::chrono::seconds(1)));
    return;
  }
  // Counted from its accept, as nginx's worker_connections and haproxy's maxconn count: a
  // connection in its TLS handshake holds a socket and OpenSSL's state as one served does.
  // The count passes to the connection (its destructor uncounts it).
  struct Place {
    std::size_t* open;
    ~Place() {
      if (open != nullptr) --*open;
    }
  } place{&++worker.open};
  Stream stream;
  bool h2 = false;
  if (options.tls) {
    auto tls =
        TlsStream::accept(std::move(tcp), options.tls, Deadline::after(options.handshake_timeout));
    if (!tls) return;  // a bad or stalled handshake: closed, nothing to answer
    // HTTP/2 as ALPN chose it; with `only`, also for a client that sent no ALPN (HTTP/2 by
    // prior knowledge over TLS, as haproxy's `proto h2` and Envoy's HTTP2 codec do): such a
    // connection is never answered in HTTP/1.1 (a request that is not HTTP/2's preface ends
    // it unanswered, as in cleartext).
    h2 = options.http2 && (tls->alpn() == "h2" || (options.http2_only && tls->alpn().empty()));
    stream = Stream(std::move(*tls));
  } else {
    stream = Stream(std::move(tcp));
  }
  auto state = std::make_unique<ConnectionState>(std::move(stream), shared, worker);
  place.open = nullptr;
  run_connection(std::move(state), h2);
}

// Tells the connections of `shared` to end: HTTP/1 ones answer their next (or current)
// request with Connection: close, HTTP/2 ones get GOAWAY. With `close_idle`, HTTP/1 ones idle
// now are closed at once (each on its own worker), which a client that is sending a request
// on one at that instant sees as an error: only a shutdown does that.
void start_draining(const std::shared_ptr<HttpServer::Shared>& shared, bool close_idle) {
  if (close_idle) shared->closing_idle.store(true, std::memory_order_release);
  shared->draining.store(true, std::memory_order_release);
  for (std::size_t i = 0; i < shared->runtime->size(); ++i) {
    shared->runtime->worker(i).post([shared, i, close_idle] {
      if (close_idle) close_idle_connections(shared->workers[i]);
      detail::shut_down_http2(shared->workers[i]);
    });
  }
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::start(Runtime& runtime, const Address& address,
                                                      Router router, ServerOptions options,
                                                      std::vector<UniqueFd> inherited) {
  auto server = open(runtime, address, std::move(router), std::move(options), std::move(inherited));
  if (server) (*server)->accept_connections();
  return server;
}

Result<std::unique_ptr<HttpServer>> HttpServer::open(Runtime& runtime, const Address& address,
                                                     Router router, ServerOptions options,
                                                     std::vector<UniqueFd> inherited) {
  auto shared = make_shared_state(runtime, std::move(router), std::move(options));
  auto in_force = std::make_shared<InForce>();
  in_force->per_worker.assign(runtime.size(), shared);
  auto tcp = TcpServer::open(
      runtime, address,
      [in_force](TcpStream tcp) {
        serve_accepted(in_force->per_worker[Worker::current()->index()], std::move(tcp));
      },
      shared->options.tcp, std::move(inherited));
  if (!tcp) return fail(tcp.error());
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->shared_ = std::move(shared);
  server->in_force_ = std::move(in_force);
  server->tcp_ = std::move(*tcp);
  return server;
}

void HttpServer::reconfigure(Router router, ServerOptions options) {
  Runtime& runtime = *shared_->runtime;
  // The listening socket's own settings stay those it was opened with.
  options.tcp = shared_->options.tcp;
  auto shared = make_shared_state(runtime, std::move(router), std::move(options));
  WaitGroup switched;
  for (std::size_t i = 0; i < runtime.size(); ++i) {
    switched.add();
    runtime.worker(i).post([in_force = in_force_, shared, i, &switched] {
      in_force->per_worker[i] = shared;
      switched.done();
    });
  }
  (void)switched.wait();
  // Configurations whose connections have all ended are forgotten.
  std::erase_if(retired_, [](const auto& old) { return old->active.count() == 0; });
  start_draining(shared_, /*close_idle=*/false);
  retired_.push_back(std::move(shared_));
  shared_ = std::move(shared);
}

void HttpServer::stop() {
  if (tcp_) tcp_->stop();
}

bool HttpServer::drain(Deadline deadline, std::chrono::milliseconds gentle) {
  stop();
  if (gentle.count() > 0) {
    // First without closing idle connections under their clients: each closes after its next
    // response (which says so), or when the gentle time is over.
    start_draining(shared_, /*close_idle=*/false);
    for (auto& old : retired_) start_draining(old, /*close_idle=*/false);
    Deadline gentle_end = earliest(deadline, Deadline::after(gentle));
    bool done = !shared_->active.wait(gentle_end);
    for (auto& old : retired_) done = !old->active.wait(gentle_end) && done;
    if (done) return true;
  }
  start_draining(shared_, /*close_idle=*/true);
  for (auto& old : retired_) start_draining(old, /*close_idle=*/true);
  bool clean = !shared_->active.wait(deadline);
  for (auto& old : retired_) clean = !old->active.wait(deadline) && clean;
  return clean;
}

std::size_t HttpServer::connections() const {
  std::size_t n = shared_->active.count();
  for (const auto& old : retired_) n += old->active.count();
  return n;
}

HttpServer::~HttpServer() { stop(); }

}  // namespace spindle::http
