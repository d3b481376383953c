#include "cluster/hash_chain.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cstdio>
#include <memory>

#include "core/error.h"

namespace dsuf::cluster {

std::vector<ChainKey> chain_keys(std::span<const int32_t> tokens) {
  const size_t blocks = tokens.size() / kBlockTokens;
  std::vector<ChainKey> out(blocks);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  DSUF_CHECK(ctx != nullptr, "EVP_MD_CTX_new failed");
  ChainKey prev{};
  for (size_t b = 0; b < blocks; ++b) {
    EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
    EVP_DigestUpdate(ctx.get(), prev.data(), prev.size());
    // Token ids hashed as little-endian int32 (the only byte order this code runs on).
    EVP_DigestUpdate(ctx.get(), tokens.data() + b * kBlockTokens, kBlockTokens * sizeof(int32_t));
    unsigned len = 0;
    EVP_DigestFinal_ex(ctx.get(), out[b].data(), &len);
    prev = out[b];
  }
  return out;
}

std::string to_hex(const ChainKey& k) {
  static const char* d = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < k.size(); ++i) {
    s[2 * i] = d[k[i] >> 4];
    s[2 * i + 1] = d[k[i] & 15];
  }
  return s;
}

std::string checksum_hex(std::span<const std::string_view> parts) {
  XXH3_state_t* st = XXH3_createState();
  DSUF_CHECK(st != nullptr, "XXH3_createState failed");
  XXH3_128bits_reset(st);
  for (std::string_view p : parts) XXH3_128bits_update(st, p.data(), p.size());
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

}  // namespace dsuf::cluster
