#pragma once
/// The WebSocket opening handshake's proofs (RFC 6455 §4): the key a client sends and the
/// accept value a server must answer with. What a gateway checks before it joins a client to
/// an upstream that says it switched to WebSocket. No I/O.

#include <string>
#include <string_view>

namespace spindle::http {

/// A fresh Sec-WebSocket-Key: 16 random bytes, base64 (24 characters).
std::string websocket_key();

/// The Sec-WebSocket-Accept that proves a server read `key`: base64(SHA-1(key + the RFC's
/// GUID)).
std::string websocket_accept(std::string_view key);

}  // namespace spindle::http
