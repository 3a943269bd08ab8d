// libFuzzer driver for the HTTP/2 server session: after the preface and an empty SETTINGS,
// the input goes to two sessions, whole to one and in pieces (of the first byte's size) to the
// other; each answers every complete request. They must write the same bytes, tell their
// handlers the same things, and agree on whether the connection goes on. Memory stays bounded:
// the output is checked against the session's limit.
#include <cstdint>
#include <string>

#include "fuzz_checks.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;

namespace {

class Recorder : public SessionHandler {
 public:
  ServerSession* session = nullptr;
  std::string log;
  void on_field(std::uint32_t id, std::string_view n, std::string_view v) override {
    log += "f" + std::to_string(id) + std::string(n) + ":" + std::string(v) + "\n";
  }
  void on_headers(std::uint32_t id, bool end_stream, bool trailers) override {
    log += "h" + std::to_string(id) + (end_stream ? "e" : "") + (trailers ? "t" : "") + "\n";
    if (end_stream) {
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

void feed(Run& r, std::span<const std::uint8_t> in, std::size_t piece) {
  SessionLimits limits;
  limits.max_output = 256 * 1024;
  ServerSession session(limits, r.handler);
  r.handler.session = &session;
  std::string start = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  write::settings(start, {});
  r.alive = session.receive({reinterpret_cast<const std::uint8_t*>(start.data()), start.size()});
  for (std::size_t at = 0; at < in.size() && r.alive; at += piece) {
    r.alive = session.receive(in.subspan(at, std::min(piece, in.size() - at)));
    check(session.output_size() <= limits.max_output + 64 * 1024);
    r.out += session.take_output();
  }
  r.out += session.take_output();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::span<const std::uint8_t> in(data + 1, size - 1);
  Run whole, pieces;
  feed(whole, in, in.size() + 1);
  feed(pieces, in, 1 + data[0] % 64);
  // Output is taken after every piece, so the bytes may be cut differently but not differ.
  check(whole.out == pieces.out);
  check(whole.handler.log == pieces.handler.log);
  check(whole.alive == pieces.alive);
  return 0;
}
