// Engram's compressed token ids (DeepSeek's CompressedTokenizer / V4.1 build_compressed_token_map):
// tokens whose decoded text normalizes to the same key share one compressed id.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace dsuf::text {

// The compressed id of every token id 0..vocab_size()-1, numbered in order of first appearance
// while scanning token ids upwards (99,092 classes for V4.1). Unknown ids get -1.
std::vector<int32_t> engram_compressed_ids(const Tokenizer& tokenizer);

// The normalization Engram applies to a token's decoded text: NFKC, NFD, drop every mark
// (Mn/Mc/Me), per-character full lowercase, collapse [ \t\r\n]+ to one space, a lone space stays a
// space, trim White_Space; an empty result falls back to `text`. Exposed for tests.
std::string engram_normalize(std::string_view text);

}  // namespace dsuf::text
