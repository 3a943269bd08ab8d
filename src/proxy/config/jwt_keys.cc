// JWKS keys made into OpenSSL keys once, at configuration time; a signature checked with EVP
// (HMAC compared in constant time; an ES256 signature, r||s in JWS, turned into the DER form
// OpenSSL verifies).

#include "spindle/proxy/jwt_keys.h"

#include <fmt/format.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "spindle/base/base64.h"

namespace spindle::proxy {
namespace {

using Json = nlohmann::json;

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

struct BnFree {
  void operator()(BIGNUM* b) const { BN_free(b); }
};
using Bignum = std::unique_ptr<BIGNUM, BnFree>;

// The text of member `name` of key `index`, base64url-decoded; throws if absent or malformed.
std::string key_bytes(const Json& key, std::string_view name, std::size_t index) {
  auto it = key.find(name);
  if (it == key.end() || !it->is_string()) {
    throw std::runtime_error(fmt::format("keys[{}].{}: required (base64url)", index, name));
  }
  auto bytes = base64url_decode(it->get<std::string>(), Base64Mode::kStrict);
  if (!bytes || bytes->empty()) {
    throw std::runtime_error(fmt::format("keys[{}].{}: not base64url", index, name));
  }
  return *bytes;
}

Bignum bignum(const std::string& bytes) {
  return Bignum(BN_bin2bn(reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()), nullptr));
}

// An OpenSSL public key from parameters built by `add`.
template <typename Add>
Pkey public_key(const char* type, Add add, std::size_t index) {
  OSSL_PARAM_BLD* build = OSSL_PARAM_BLD_new();
  add(build);
  OSSL_PARAM* params = OSSL_PARAM_BLD_to_param(build);
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr);
  EVP_PKEY* key = nullptr;
  bool ok = params != nullptr && ctx != nullptr && EVP_PKEY_fromdata_init(ctx) == 1 &&
            EVP_PKEY_fromdata(ctx, &key, EVP_PKEY_PUBLIC_KEY, params) == 1;
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  OSSL_PARAM_BLD_free(build);
  Pkey out(key);
  if (ok) {
    // The point must be on the curve (an invalid-curve point would leak nothing here, since
    // only verification is done, but a key that is not one is a mistake worth saying).
    EVP_PKEY_CTX* check = EVP_PKEY_CTX_new_from_pkey(nullptr, key, nullptr);
    ok = check != nullptr && EVP_PKEY_public_check(check) == 1;
    EVP_PKEY_CTX_free(check);
  }
  if (!ok)
    throw std::runtime_error(fmt::format("keys[{}]: not a valid {} public key", index, type));
  return out;
}

// True if `signature` is `key`'s SHA-256 signature of `data` (DER for ECDSA).
bool verify_signature(EVP_PKEY* key, std::string_view data, const unsigned char* signature,
                      std::size_t length) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok = ctx != nullptr && EVP_DigestVerifyInit(ctx, nullptr, EVP_sha256(), nullptr, key) == 1 &&
            EVP_DigestVerify(ctx, signature, length,
                             reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

// JWS's ES256 signature (r and s, 32 bytes each) as DER, or "" if it is not 64 bytes.
std::string ecdsa_der(std::string_view raw) {
  if (raw.size() != 64) return {};
  ECDSA_SIG* sig = ECDSA_SIG_new();
  BIGNUM* r = BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()), 32, nullptr);
  BIGNUM* s = BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()) + 32, 32, nullptr);
  ECDSA_SIG_set0(sig, r, s);
  unsigned char* der = nullptr;
  int length = i2d_ECDSA_SIG(sig, &der);
  std::string out;
  if (length > 0) out.assign(reinterpret_cast<char*>(der), static_cast<std::size_t>(length));
  OPENSSL_free(der);
  ECDSA_SIG_free(sig);
  return out;
}

}  // namespace

struct JwtKeys::Key {
  enum class Type { kHmac, kRsa, kEc } type = Type::kHmac;
  std::string kid;
  /// The algorithm the key is for (HS256, RS256, ES256).
  std::string alg;
  std::string secret;
  Pkey pkey;
};

JwtKeys::~JwtKeys() = default;

std::shared_ptr<const JwtKeys> JwtKeys::parse(std::string_view text) {
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw std::runtime_error("not JSON");
  if (!doc.is_object() || !doc.contains("keys") || !doc["keys"].is_array()) {
    throw std::runtime_error("expected a JWKS document: {\"keys\": [...]}");
  }
  std::shared_ptr<JwtKeys> keys(new JwtKeys());
  const Json& list = doc["keys"];
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Json& k = list[i];
    if (!k.is_object()) throw std::runtime_error(fmt::format("keys[{}]: expected an object", i));
    auto text_of = [&](const char* name) {
      auto it = k.find(name);
      if (it == k.end()) return std::string();
      if (!it->is_string())
        throw std::runtime_error(fmt::format("keys[{}].{}: not a string", i, name));
      return it->get<std::string>();
    };
    auto key = std::make_unique<Key>();
    key->kid = text_of("kid");
    std::string use = text_of("use");
    if (!use.empty() && use != "sig") {
      throw std::runtime_error(
          fmt::format("keys[{}].use: '{}' (only sig keys check tokens)", i, use));
    }
    std::string kty = text_of("kty");
    if (kty == "oct") {
      key->type = Key::Type::kHmac;
      key->alg = "HS256";
      key->secret = key_bytes(k, "k", i);
      if (key->secret.size() < 32) {
        throw std::runtime_error(
            fmt::format("keys[{}].k: an HS256 key needs at least 32 bytes", i));
      }
    } else if (kty == "RSA") {
      key->type = Key::Type::kRsa;
      key->alg = "RS256";
      Bignum n = bignum(key_bytes(k, "n", i));
      Bignum e = bignum(key_bytes(k, "e", i));
      if (BN_num_bits(n.get()) < 2048) {
        throw std::runtime_error(fmt::format("keys[{}].n: an RSA key needs at least 2048 bits", i));
      }
      key->pkey = public_key(
          "RSA",
          [&](OSSL_PARAM_BLD* b) {
            OSSL_PARAM_BLD_push_BN(b, OSSL_PKEY_PARAM_RSA_N, n.get());
            OSSL_PARAM_BLD_push_BN(b, OSSL_PKEY_PARAM_RSA_E, e.get());
          },
          i);
    } else if (kty == "EC") {
      key->type = Key::Type::kEc;
      key->alg = "ES256";
      if (text_of("crv") != "P-256") {
        throw std::runtime_error(fmt::format("keys[{}].crv: only P-256 (ES256)", i));
      }
      std::string x = key_bytes(k, "x", i), y = key_bytes(k, "y", i);
      if (x.size() != 32 || y.size() != 32) {
        throw std::runtime_error(fmt::format("keys[{}]: x and y must be 32 bytes each", i));
      }
      std::string point = "\x04" + x + y;
      key->pkey = public_key(
          "EC",
          [&](OSSL_PARAM_BLD* b) {
            OSSL_PARAM_BLD_push_utf8_string(b, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0);
            OSSL_PARAM_BLD_push_octet_string(b, OSSL_PKEY_PARAM_PUB_KEY, point.data(),
                                             point.size());
          },
          i);
    } else {
      throw std::runtime_error(fmt::format("keys[{}].kty: '{}' (expected oct, RSA or EC)", i, kty));
    }
    std::string alg = text_of("alg");
    if (!alg.empty() && alg != key->alg) {
      throw std::runtime_error(fmt::format("keys[{}].alg: '{}' does not fit a {} key (expected {})",
                                           i, alg, kty, key->alg));
    }
    keys->keys_.push_back(std::move(key));
  }
  if (keys->keys_.empty()) throw std::runtime_error("no keys");
  return keys;
}

JwtKeys::Signature JwtKeys::check(std::string_view signed_part, std::string_view signature,
                                  std::string_view alg, std::string_view kid) const {
  std::string der;
  if (alg == "ES256") der = ecdsa_der(signature);
  bool known_kid = kid.empty();
  for (const auto& key : keys_) {
    if (!kid.empty() && key->kid != kid) continue;
    known_kid = true;
    if (key->alg != alg) continue;
    bool verified = false;
    if (key->type == Key::Type::kHmac) {
      unsigned char mac[EVP_MAX_MD_SIZE];
      unsigned length = 0;
      HMAC(EVP_sha256(), key->secret.data(), static_cast<int>(key->secret.size()),
           reinterpret_cast<const unsigned char*>(signed_part.data()), signed_part.size(), mac,
           &length);
      verified = signature.size() == length && CRYPTO_memcmp(mac, signature.data(), length) == 0;
    } else if (key->type == Key::Type::kRsa) {
      verified = verify_signature(key->pkey.get(), signed_part,
                                  reinterpret_cast<const unsigned char*>(signature.data()),
                                  signature.size());
    } else {
      verified = !der.empty() &&
                 verify_signature(key->pkey.get(), signed_part,
                                  reinterpret_cast<const unsigned char*>(der.data()), der.size());
    }
    if (verified) return Signature::kVerified;
  }
  return known_kid ? Signature::kBad : Signature::kUnknownKid;
}

}  // namespace spindle::proxy
