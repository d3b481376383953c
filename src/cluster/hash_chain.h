// Prefix keys: key_i = SHA-256(key_{i-1} ‖ token ids of block i), one per full block of
// kBlockTokens tokens (the vLLM/Dynamo scheme). Keys cross replicas and live in Redis, so they use
// a collision-resistant hash: a crafted collision must not hand one client another's cache. A
// key only nominates a candidate; the stored token ids decide, so a hit is always verified.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsuf::cluster {

inline constexpr int64_t kBlockTokens = 16;

using ChainKey = std::array<uint8_t, 32>;

// Keys of every full block of `tokens`: result[i] covers tokens[0, (i+1)·kBlockTokens).
std::vector<ChainKey> chain_keys(std::span<const int32_t> tokens);
std::string to_hex(const ChainKey& k);

// XXH3-128 over the concatenated byte ranges, as 32 hex digits (transfer checksums: fast; the
// hash chain, not this, guards against crafted inputs).
std::string checksum_hex(std::span<const std::string_view> parts);

}  // namespace dsuf::cluster
