// An h2c (prior knowledge) server made of the pure HTTP/2 session (h2/session.h) and nothing of
// the nghttp2 driver: each connection's bytes go to a ServerSession, what it writes goes back.
// Every request is answered 200 with 4 KiB (its body read and given back to flow control). For
// the conformance suite (h2spec) against the session alone: tests/integration/test_h2_session.py.
//
//   h2_session_server PORT    prints {"event":"listening","address":"127.0.0.1:PORT"}
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/h2/session.h"
#include "spindle/net/stream.h"
#include "spindle/net/tcp_server.h"

using namespace spindle;

namespace {

class Answer : public h2::SessionHandler {
 public:
  h2::ServerSession* session = nullptr;
  std::map<std::uint32_t, std::string> pending;

  void on_field(std::uint32_t, const spindle::http::Field&) override {}
  void on_headers(std::uint32_t id, bool end_stream, bool) override {
    if (end_stream) respond(id);
  }
  void on_data(std::uint32_t id, std::span<const std::uint8_t> d, bool end_stream) override {
    session->consumed(id, d.size());
    if (end_stream) respond(id);
  }
  void on_reset(std::uint32_t id, h2::ErrorCode) override { pending.erase(id); }
  void on_window(std::uint32_t id) override {
    if (id == 0) {
      for (auto it = pending.begin(); it != pending.end();) push((it++)->first);
    } else if (pending.contains(id)) {
      push(id);
    }
  }
  void respond(std::uint32_t id) {
    const h2::hpack::Field head[] = {{":status", "200"}, {"content-type", "text/plain"}};
    session->submit_headers(id, head, false);
    pending[id] = std::string(4096, 'k');  // larger than the windows h2spec sets
    push(id);
  }
  void push(std::uint32_t id) {
    std::string& left = pending[id];
    left.erase(0, session->submit_data(id, left, true));
    if (left.empty()) pending.erase(id);
  }
};

}  // namespace

int main(int argc, char** argv) {
  int port = argc > 1 ? std::atoi(argv[1]) : 0;
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = TcpServer::start(
      runtime, Address::loopback_v4(static_cast<std::uint16_t>(port)), [](TcpStream stream) {
        Answer answer;
        h2::ServerSession session({}, answer);
        answer.session = &session;
        char buffer[16384];
        for (;;) {
          std::string out = session.take_output();
          if (!out.empty() && !stream.write_all(out)) return;
          if (session.closing() && session.open_streams() == 0) break;
          auto n = stream.read(buffer, Deadline::after(std::chrono::seconds(30)));
          if (!n || *n == 0) return;
          bool alive = session.receive(
              {reinterpret_cast<const std::uint8_t*>(buffer), static_cast<std::size_t>(*n)});
          if (!alive) {
            if (!stream.write_all(session.take_output())) return;
            break;
          }
        }
        // As the server's driver does: what the client still sends (a PING after its GOAWAY)
        // is read and dropped, so that closing does not reset the connection under the
        // answers just written.
        Stream(std::move(stream)).linger(Deadline::after(std::chrono::seconds(1)));
      });
  if (!server) {
    std::fprintf(stderr, "h2_session_server: %s\n", server.error().message().c_str());
    return 1;
  }
  std::printf("{\"event\":\"listening\",\"address\":\"%s\"}\n",
              (*server)->address().to_string().c_str());
  std::fflush(stdout);
  runtime.block_on([] { (void)this_fiber::sleep_for(std::chrono::hours(24)); });
}
