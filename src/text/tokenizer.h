// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (the DeepSeek-V3/V4/V4.1
// family): Split pre-tokenizers run with PCRE2, rank-ordered BPE merges, added tokens, ByteLevel
// decoding. Output ids equal HF `tokenizers`' for the same file (see docs/text.md for the checks).
//
// Thread safety: every const method may be called from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsuf::text {

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;     // removed by decode(skip_special=true)
  bool normalized;  // HF matches these after normalization (a no-op for this family)
};

class Tokenizer {
 public:
  // Loads and validates a tokenizer.json; throws dsuf::Error naming the file and the problem,
  // including for features of HF tokenizers this family does not use (normalizers, byte fallback).
  explicit Tokenizer(const std::filesystem::path& path);
  // Same, from the file's contents; `origin` names the input in error messages.
  static Tokenizer from_json(std::string_view json_text, std::string_view origin);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `text` must be valid UTF-8 (else dsuf::Error). With match_added_tokens, spellings of added
  // tokens in the text become their ids (HF's encode); without, the whole text is plain BPE, which
  // is how user and tool text must be encoded. No BOS/EOS is ever added.
  std::vector<int32_t> encode(std::string_view text, bool match_added_tokens) const;
  // Appends to `out` instead of returning a new vector.
  void encode_into(std::string_view text, bool match_added_tokens, std::vector<int32_t>& out) const;

  // HF decode: ids outside the vocabulary are ignored, invalid UTF-8 becomes U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;

  // The raw bytes one id stands for (empty for an unknown id). Concatenating them for a sequence
  // and decoding lossily gives decode(ids, false).
  std::string_view token_bytes(int32_t id) const;

  // Highest id + 1 (129,280 for V4.1); ids without an entry (none in V4.1) are unknown.
  int32_t vocab_size() const;
  // Whether `id` has an entry.
  bool has_id(int32_t id) const;
  // The token's spelling as HF shows it: the byte-level string for model vocab ("Ġthe"), the
  // content for added tokens. nullopt for an unknown id.
  std::optional<std::string> id_to_token(int32_t id) const;
  // Inverse of id_to_token: added-token content first, then model vocab. nullopt if absent.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns generated ids into text as they arrive without ever splitting a UTF-8 character: bytes of
// an incomplete character are held until it completes. Invalid bytes become U+FFFD as soon as they
// are known to be invalid, so the concatenated output always equals tokenizer.decode(all, false).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {}
  // Returns the text that became complete with this id (often empty).
  std::string push(int32_t id);
  // Flushes held bytes (a truncated character becomes U+FFFD).
  std::string finish();
  // Bytes held back waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace dsuf::text
