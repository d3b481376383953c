#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <random>
#include <thread>

#include "core/error.h"
#include "test_paths.h"
#include "text/engram_ids.h"
#include "text/utf8.h"

namespace dsuf::text {
namespace {

using testing::read_jsonl;

const Tokenizer& tok() {
  static const Tokenizer t(testing::tokenizer_json());
  return t;
}

TEST(Tokenizer, VocabShape) {
  EXPECT_EQ(tok().vocab_size(), 129280);
  EXPECT_EQ(tok().added_tokens().size(), 1283u);
  for (int32_t id = 0; id < tok().vocab_size(); ++id) ASSERT_TRUE(tok().has_id(id)) << id;
  EXPECT_FALSE(tok().has_id(129280));
  EXPECT_FALSE(tok().has_id(-1));
  EXPECT_EQ(tok().token_to_id("<think>"), 128821);
  EXPECT_EQ(tok().token_to_id("</think>"), 128822);
  EXPECT_EQ(tok().token_to_id("｜DSML｜"), 128825);
  EXPECT_EQ(tok().token_to_id("<｜System｜>"), 128799);
  EXPECT_EQ(tok().token_to_id("<｜deepseek_image｜>"), 129264);
  EXPECT_EQ(tok().token_to_id("Ġ"), 223);
  EXPECT_EQ(tok().id_to_token(201), "Ċ");
  EXPECT_FALSE(tok().token_to_id("no such token").has_value());
  int specials = 0;
  for (int32_t id = 0; id < tok().vocab_size(); ++id) specials += tok().is_special(id);
  EXPECT_EQ(specials, 14);
}

TEST(Tokenizer, GoldenVectors) {
  const auto vectors = read_jsonl(testing::shared_dir() / "vectors/tokenizer-vectors.jsonl");
  ASSERT_GE(vectors.size(), 20u);
  for (const auto& v : vectors) {
    const std::string text = v["text"];
    SCOPED_TRACE(text);
    EXPECT_EQ(tok().encode(text, true), v["ids_with_added_tokens"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok().encode(text, false), v["ids_plain_bpe"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok().decode(tok().encode(text, true), false), text);
    EXPECT_EQ(tok().decode(tok().encode(text, false), false), text);
  }
}

TEST(Tokenizer, PromptVectorsEncodeWithAddedTokens) {
  const auto vectors = read_jsonl(testing::shared_dir() / "vectors/prompt-vectors.jsonl");
  ASSERT_GE(vectors.size(), 5u);
  for (const auto& v : vectors) {
    SCOPED_TRACE(v["name"].get<std::string>());
    EXPECT_EQ(tok().encode(v["prompt"].get<std::string>(), true),
              v["ids"].get<std::vector<int32_t>>());
  }
}

TEST(Tokenizer, EveryAddedTokenMatchesItselfOnlyWhenAsked) {
  for (const auto& a : tok().added_tokens()) {
    ASSERT_EQ(tok().encode(a.content, true), std::vector<int32_t>{a.id}) << a.content;
    const auto plain = tok().encode(a.content, false);
    ASSERT_EQ(tok().decode(plain, false), a.content);
    for (int32_t id : plain) ASSERT_LT(id, 128000) << a.content;
  }
  EXPECT_EQ(tok().encode("<｜User｜>", false), (std::vector<int32_t>{30, 28217, 6756, 28217, 32}));
  EXPECT_EQ(tok().encode("<｜DSML｜ calls>", true), (std::vector<int32_t>{30, 128825, 10699, 32}));
}

TEST(Tokenizer, EveryVocabEntryEncodesToItself) {
  // Every multi-byte model token is reachable by its own merges; a broken pair table or rank
  // order shows up here first.
  size_t checked = 0;
  for (int32_t id = 3; id < 128000; ++id) {
    const std::string_view bytes = tok().token_bytes(id);
    if (utf8_valid_prefix(bytes) != bytes.size()) continue;  // fragments of a character
    const auto ids = tok().encode(bytes, false);
    // A vocab entry can span several pre-tokens (e.g. " 1"); only single-piece ones must map back.
    if (ids.size() == 1) {
      ASSERT_EQ(ids[0], id) << bytes;
    }
    ASSERT_EQ(tok().decode(ids, false), bytes);
    ++checked;
  }
  EXPECT_GT(checked, 120000u);
}

TEST(Tokenizer, LongPiecesRoundTrip) {
  // Pieces over 32 bytes take the heap BPE; the HF oracle test checks their ids, this checks
  // that nothing is lost or duplicated.
  std::string unit = "深度求索的模型很快";
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += unit;
  const auto ids = tok().encode(long_text, false);
  EXPECT_EQ(tok().decode(ids, false), long_text);
  // Whitespace runs go through the heap path too and must stay one "  ...  " token sequence.
  const std::string spaces(5000, ' ');
  const auto sp = tok().encode("a" + spaces + "b", false);
  EXPECT_EQ(tok().decode(sp, false), "a" + spaces + "b");
}

TEST(Tokenizer, SkipSpecialRemovesOnlySpecialTokens) {
  const std::vector<int32_t> ids = {0, 19923, 128821, 1, 2, 129264, 129271};
  EXPECT_EQ(tok().decode(ids, true), "Hello<think><｜deepseek_image｜>");
  EXPECT_EQ(tok().decode(ids, false),
            "<｜begin▁of▁sentence｜>Hello<think><｜end▁of▁sentence｜><｜▁pad▁｜>"
            "<｜deepseek_image｜><｜/polygon｜>");
  // Unknown ids are ignored, as HF does.
  const std::vector<int32_t> bad = {19923, 999999999, -5};
  EXPECT_EQ(tok().decode(bad, false), "Hello");
}

TEST(Tokenizer, RejectsInvalidUtf8) {
  EXPECT_THROW(tok().encode(std::string("ab\xC3", 3), false), Error);
  EXPECT_THROW(tok().encode(std::string("\xED\xA0\x80", 3), true), Error);  // a surrogate
  try {
    tok().encode("ok\xFF", false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte 2"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, RejectsBadFiles) {
  EXPECT_THROW(Tokenizer("/nonexistent/tokenizer.json"), Error);
  EXPECT_THROW(Tokenizer::from_json("{", "broken"), Error);
  EXPECT_THROW(Tokenizer::from_json("{}", "empty"), Error);
  const std::string no_pre = R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},
    "decoder":{"type":"ByteLevel"}})";
  EXPECT_THROW(Tokenizer::from_json(no_pre, "no-pre"), Error);
  const std::string bad_regex = R"({"pre_tokenizer":{"type":"Sequence","pretokenizers":[
    {"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated","invert":false},
    {"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]},
    "model":{"type":"BPE","vocab":{"a":0},"merges":[]},"decoder":{"type":"ByteLevel"}})";
  try {
    Tokenizer::from_json(bad_regex, "bad-regex");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad-regex"), std::string::npos);
  }
  const std::string bad_merge = R"({"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,
    "use_regex":false},"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]},
    "decoder":{"type":"ByteLevel"}})";
  EXPECT_THROW(Tokenizer::from_json(bad_merge, "bad-merge"), Error);
  const std::string dup_id = R"({"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,
    "use_regex":false},"model":{"type":"BPE","vocab":{"a":0,"b":0},"merges":[]},
    "decoder":{"type":"ByteLevel"}})";
  EXPECT_THROW(Tokenizer::from_json(dup_id, "dup-id"), Error);
  const std::string normalizer = R"({"normalizer":{"type":"NFC"},"pre_tokenizer":{
    "type":"ByteLevel","add_prefix_space":false,"use_regex":false},"model":{"type":"BPE",
    "vocab":{"a":0},"merges":[]},"decoder":{"type":"ByteLevel"}})";
  EXPECT_THROW(Tokenizer::from_json(normalizer, "normalizer"), Error);
}

TEST(Tokenizer, TinyHandWrittenFile) {
  // A minimal file exercises the loader without the big vocab: ids come from merges' ranks.
  const std::string j = R"({"pre_tokenizer":{"type":"Sequence","pretokenizers":[
    {"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Isolated","invert":false},
    {"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]},
    "model":{"type":"BPE","vocab":{"a":0,"b":1,"Ġ":2,"ab":3,"abab":4},"merges":["a b",["ab","ab"]]},
    "added_tokens":[{"id":5,"content":"<x>","special":true}],
    "decoder":{"type":"ByteLevel"}})";
  const Tokenizer t = Tokenizer::from_json(j, "tiny");
  EXPECT_EQ(t.encode("abab ab", false), (std::vector<int32_t>{4, 2, 3}));
  EXPECT_EQ(t.encode("ab<x>a", true), (std::vector<int32_t>{3, 5, 0}));
  // '<' and 'x' have no token: dropped like HF does without an unk token.
  EXPECT_EQ(t.encode("ab<x>a", false), (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{4, 2, 5}, true), "abab ");
}

TEST(StreamDecoder, NeverSplitsACharacterAndMatchesDecode) {
  std::mt19937 rng(7);
  const std::string text = "emoji 🦀🐦‍🔥 中文 é ẹ̀ Привет 😀😀 done";
  std::vector<int32_t> ids = tok().encode(text, false);
  // Add byte-fragment tokens that never complete, and an invalid lone continuation byte.
  ids.push_back(*tok().token_to_id("ð"));
  ids.push_back(19923);
  ids.push_back(*tok().token_to_id("Ģ"));  // byte 0x80: a lone continuation byte
  ids.push_back(*tok().token_to_id("ð"));
  StreamDecoder sd(tok());
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = sd.push(id);
    ASSERT_EQ(utf8_valid_prefix(piece), piece.size());
    joined += piece;
  }
  joined += sd.finish();
  EXPECT_EQ(joined, tok().decode(ids, false));
  EXPECT_EQ(sd.pending_bytes(), 0u);
}

TEST(StreamDecoder, HoldsIncompleteEmoji) {
  const auto ids = tok().encode("🦀", false);
  ASSERT_GT(ids.size(), 1u);  // the crab is split across byte tokens
  StreamDecoder sd(tok());
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(sd.push(ids[i]), "");
  EXPECT_EQ(sd.push(ids.back()), "🦀");
}

TEST(Utf8, LossyFollowsMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("a\xF0\x9F\x98"), "a\xEF\xBF\xBD");             // truncated tail: one
  EXPECT_EQ(utf8_lossy("\xE2\x28\xA1"), "\xEF\xBF\xBD(\xEF\xBF\xBD");  // bad second byte
  EXPECT_EQ(utf8_lossy("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");       // overlong: per byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: each byte
  EXPECT_EQ(utf8_lossy("ok"), "ok");
}

std::vector<int32_t> read_engram_table() {
  std::ifstream f(testing::source_dir() / "assets/tokenizer/engram-compressed-ids.txt");
  std::vector<int32_t> v;
  int32_t x;
  while (f >> x) v.push_back(x);
  return v;
}

TEST(Engram, ComputedTableEqualsShippedTable) {
  const auto expected = read_engram_table();
  ASSERT_EQ(expected.size(), 129280u);
  const auto got = engram_compressed_ids(tok());
  ASSERT_EQ(got.size(), expected.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != expected[i] && mismatches++ < 10) {
      ADD_FAILURE() << "token " << i << " (" << *tok().id_to_token(static_cast<int32_t>(i))
                    << "): computed " << got[i] << ", table " << expected[i];
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(*std::max_element(got.begin(), got.end()) + 1, 99092);
}

TEST(Engram, NormalizationRules) {
  EXPECT_EQ(engram_normalize(" The"), "the");
  EXPECT_EQ(engram_normalize("\n\n"), " ");         // whitespace-only keeps one space
  EXPECT_EQ(engram_normalize("Éa"), "ea");          // accents (marks) dropped
  EXPECT_EQ(engram_normalize("ＡＢ"), "ab");        // NFKC width folding
  EXPECT_EQ(engram_normalize("ΣΑΣ"), "σασ");        // no final sigma: per-character lowercase
  EXPECT_EQ(engram_normalize("\u2028"), "\u2028");  // strips to empty: falls back to the text
  EXPECT_EQ(engram_normalize("a \t b"), "a b");
}

}  // namespace
}  // namespace dsuf::text

namespace dsuf::text {
namespace {

TEST(Tokenizer, HugeRunsDoNotExhaustTheRegexStack) {
  // `\s+(?!\S)` backtracks over whitespace runs; a megabyte of them must still work.
  for (const std::string& unit : {std::string(" "), std::string("\n"), std::string("\u3000"),
                                  std::string("中"), std::string("a"), std::string("!")}) {
    std::string s;
    while (s.size() < (1u << 20)) s += unit;
    const auto ids = tok().encode(s + "x", false);
    ASSERT_EQ(tok().decode(ids, false), s + "x") << unit;
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back("thread " + std::to_string(i) + " 你好，世界 def f(x): return x**" +
                    std::to_string(i * 7919) + "\n\t🦀 <think>");
  }
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : texts) want.push_back(tok().encode(t, (t.size() & 1) != 0));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 200; ++rep) {
        const size_t i = static_cast<size_t>(rep * 4 + w) % texts.size();
        if (tok().encode(texts[i], (texts[i].size() & 1) != 0) != want[i]) ++mismatches;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace dsuf::text
