// libFuzzer driver for the HTTP/2 sessions, server or client by the first byte's high bit. A
// server gets the preface and an empty SETTINGS, then the input, and answers every complete
// request; a client opens three streams (one with a body), gets an empty SETTINGS, then the
// input (a hostile upstream). The input goes to two sessions, whole to one and in pieces (of
// the first byte's size) to the other: they must write the same bytes, tell their handlers the
// same things, and agree on whether the connection goes on. Memory stays bounded: the output
// is checked against the session's limit.
#include <cstdint>
#include <string>
#include <type_traits>

#include "fuzz_checks.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;

namespace {

class Recorder : public SessionHandler {
 public:
  Session* session = nullptr;
  bool server = true;
  std::string log;
  void on_field(std::uint32_t id, const spindle::http::Field& f) override {
    // Every field comes with its name's token (found once, however it was coded).
    if (f.token != spindle::http::find_token(f.name)) __builtin_trap();
    log += "f" + std::to_string(id) + std::string(f.name) + ":" + std::string(f.value) + "\n";
  }
  void on_headers(std::uint32_t id, bool end_stream, bool trailers) override {
    log += "h" + std::to_string(id) + (end_stream ? "e" : "") + (trailers ? "t" : "") + "\n";
    if (end_stream && server) {
      const hpack::Field head[] = {{":status", "200"}};
      session->submit_headers(id, head, false);
      session->submit_data(id, "ok", true);
    }
  }
  void on_data(std::uint32_t id, std::span<const std::uint8_t> d, bool end_stream) override {
    log +=
        "d" + std::to_string(id) + ":" + std::to_string(d.size()) + (end_stream ? "e" : "") + "\n";
    session->consumed(id, d.size());
  }
  void on_reset(std::uint32_t id, ErrorCode code) override {
    log += "r" + std::to_string(id) + ":" + std::to_string(static_cast<int>(code)) + "\n";
  }
  void on_window(std::uint32_t id) override { log += "w" + std::to_string(id) + "\n"; }
};

struct Run {
  Recorder handler;
  std::string out;
  bool alive = true;
};

template <typename Role>
void feed(Run& r, std::span<const std::uint8_t> in, std::size_t piece, bool on_receipt) {
  SessionLimits limits;
  limits.max_output = 256 * 1024;
  limits.connection_window_on_receipt = on_receipt;  // as the gateway's upstream client has it
  Role session(limits, r.handler);
  r.handler.session = &session;
  std::string start;
  if constexpr (std::is_same_v<Role, ClientSession>) {
    r.handler.server = false;
    const hpack::Field get[] = {
        {":method", "GET"}, {":scheme", "http"}, {":authority", "a"}, {":path", "/"}};
    const hpack::Field post[] = {
        {":method", "POST"}, {":scheme", "http"}, {":authority", "a"}, {":path", "/p"}};
    session.open(get, true);
    std::uint32_t with_body = session.open(post, false);
    session.open(get, true, true);
    session.submit_data(with_body, std::string(100000, 'b'), true);
  } else {
    start = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  }
  write::settings(start, {});
  r.alive = session.receive({reinterpret_cast<const std::uint8_t*>(start.data()), start.size()});
  for (std::size_t at = 0; at < in.size() && r.alive; at += piece) {
    r.alive = session.receive(in.subspan(at, std::min(piece, in.size() - at)));
    check(session.output_size() <= limits.max_output + 64 * 1024);
    r.out += session.take_output();
    // As a connection that parks between reads: whatever it gives back changes nothing seen.
    session.trim();
  }
  r.out += session.take_output();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::span<const std::uint8_t> in(data + 1, size - 1);
  Run whole, pieces;
  const bool on_receipt = (data[0] & 0x40) != 0;
  if ((data[0] & 0x80) != 0) {
    feed<ClientSession>(whole, in, in.size() + 1, on_receipt);
    feed<ClientSession>(pieces, in, 1 + data[0] % 64, on_receipt);
  } else {
    feed<ServerSession>(whole, in, in.size() + 1, on_receipt);
    feed<ServerSession>(pieces, in, 1 + data[0] % 64, on_receipt);
  }
  // Output is taken after every piece, so the bytes may be cut differently but not differ.
  check(whole.out == pieces.out);
  check(whole.handler.log == pieces.handler.log);
  check(whole.alive == pieces.alive);
  return 0;
}
