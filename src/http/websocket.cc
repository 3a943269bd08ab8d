#include "spindle/http/websocket.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <stdexcept>

namespace spindle::http {
namespace {

constexpr std::string_view kGuid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

std::string base64(const unsigned char* bytes, int size) {
  unsigned char out[64];  // 4 * ceil(20 / 3) + 1 at most here
  int n = EVP_EncodeBlock(out, bytes, size);
  return std::string(reinterpret_cast<char*>(out), static_cast<std::size_t>(n));
}

}  // namespace

std::string websocket_key() {
  unsigned char nonce[16];
  if (RAND_bytes(nonce, sizeof nonce) != 1) throw std::runtime_error("no random bytes for a key");
  return base64(nonce, sizeof nonce);
}

std::string websocket_accept(std::string_view key) {
  std::string text(key);
  text += kGuid;
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return base64(digest, sizeof digest);
}

}  // namespace spindle::http
