// safetensors reading and writing: round trips for every dtype and odd shapes, sharded checkpoints,
// and one test per way a file or checkpoint can be broken, each checking what the message says.
#include "model/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace dsuf {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  if (n > 0) v[0] |= 1;  // never all zero: a reader returning zeroed memory must not pass
  return v;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

TensorData random_tensor(std::string name, DType dtype, std::vector<int64_t> shape, uint32_t seed) {
  auto bytes = random_bytes(static_cast<size_t>(numel_of(shape)) * dtype_size(dtype), seed);
  return {std::move(name), dtype, std::move(shape), std::move(bytes)};
}

// memcmp with an empty vector's data() (null) would be undefined even for 0 bytes.
bool same_bytes(const uint8_t* p, const std::vector<uint8_t>& want) {
  return want.empty() || std::memcmp(p, want.data(), want.size()) == 0;
}

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A file with the given header text (no padding added) and data section; header_len overrides the
// length field when set.
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes,
               std::optional<uint64_t> header_len = std::nullopt) {
  std::vector<uint8_t> out(8);
  uint64_t n = header_len.value_or(header.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  auto data = random_bytes(data_bytes, 7);
  out.insert(out.end(), data.begin(), data.end());
  write_file(p, out);
}

// Runs f, which must throw dsuf::Error, and returns the message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-dsuf exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

::testing::AssertionResult contains(const std::string& msg, const std::string& sub) {
  if (msg.find(sub) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected \"" << sub << "\" in message: " << msg;
}
#define EXPECT_HAS(msg, sub) EXPECT_TRUE(contains(msg, sub))

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "dsuf_safetensors_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string open_error(const std::string& name) const {
    return error_of([&] { SafetensorsFile::open(path(name)); });
  }
  fs::path dir_;
};

// ---- dtypes ------------------------------------------------------------------------------------

TEST(SafetensorsDTypeTest, NamesSizesAndParsing) {
  const std::pair<const char*, size_t> expected[] = {
      {"BF16", 2}, {"F16", 2},     {"F32", 4},     {"F64", 8},     {"I8", 1},  {"U8", 1},
      {"I16", 2},  {"I32", 4},     {"I64", 8},     {"U16", 2},     {"U32", 4}, {"U64", 8},
      {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
  };
  ASSERT_EQ(std::size(expected), std::size(kAllDTypes));
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    EXPECT_STREQ(dtype_name(kAllDTypes[i]), expected[i].first);
    EXPECT_EQ(dtype_size(kAllDTypes[i]), expected[i].second);
    EXPECT_EQ(parse_dtype(expected[i].first), kAllDTypes[i]);
  }
  for (const char* bad : {"", "bf16", "F8_E4M3FN", "float8_e4m3fn", "F4", "C64", "F32 "})
    EXPECT_EQ(parse_dtype(bad), std::nullopt) << bad;
}

// ---- round trips -------------------------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripEveryDtypeAndOddShapes) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {3, 0, 5}, {1}, {7}, {3, 5}, {2, 3, 5}, {1, 1, 1, 1}, {13, 17}, {1, 257}};
  SafetensorsWriter w;
  std::vector<TensorData> want;
  uint32_t seed = 1;
  for (DType dt : kAllDTypes) {
    for (const auto& shape : shapes) {
      std::string name = std::string("t.") + dtype_name(dt) + "." + std::to_string(want.size());
      want.push_back(random_tensor(name, dt, shape, seed++));
      w.add(want.back());
    }
  }
  w.set_metadata("format", "pt");
  w.set_metadata("note", "ünïcödé \"quoted\"");
  w.write(path("all.safetensors"));
  for (const auto& e : fs::directory_iterator(path("")))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();

  auto f = SafetensorsFile::open(path("all.safetensors"));
  EXPECT_EQ(f->data_offset() % 8, 0u) << "header must be padded to a multiple of 8";
  EXPECT_EQ(f->file_size(), f->data_offset() + w.data_bytes());
  ASSERT_EQ(f->tensors().size(), want.size());
  EXPECT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "ünïcödé \"quoted\"");
  const uint8_t* prev_end = nullptr;
  for (const auto& t : want) {
    const TensorInfo* got = f->find(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    EXPECT_EQ(got->name, t.name);
    EXPECT_EQ(got->dtype, t.dtype) << t.name;
    EXPECT_EQ(got->shape, t.shape) << t.name;
    EXPECT_EQ(got->numel(), numel_of(t.shape)) << t.name;
    EXPECT_EQ(got->nbytes, t.bytes.size()) << t.name;
    EXPECT_EQ(got->file, path("all.safetensors"));
    ASSERT_TRUE(same_bytes(got->data, t.bytes)) << t.name;
    // Laid out in the order added, back to back.
    if (prev_end) {
      EXPECT_EQ(got->data, prev_end) << t.name;
    }
    prev_end = got->data + got->nbytes;
  }
  EXPECT_EQ(f->find("absent"), nullptr);
  EXPECT_EQ(f->tensors().at("t.BF16.0").numel(), 1);  // 0-dim
  EXPECT_EQ(f->tensors().at("t.BF16.2").numel(), 0);  // empty
}

TEST_F(SafetensorsTest, HeaderMatchesTheReferenceWriterLayout) {
  SafetensorsWriter w;
  w.add("b", DType::F32, {2}, random_bytes(8, 1));
  w.add("a", DType::U8, {3}, random_bytes(3, 2));
  w.set_metadata("k", "v");
  w.write(path("x.safetensors"));
  auto bytes = read_file(path("x.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + n);
  std::string json =
      R"({"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})";
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(header.substr(0, json.size()), json);
  EXPECT_EQ(header.find_first_not_of(' ', json.size()), std::string::npos) << "padding is spaces";
  EXPECT_EQ(bytes.size(), 8 + n + 11);
}

TEST_F(SafetensorsTest, EmptyFileWithOnlyMetadata) {
  SafetensorsWriter w;
  w.set_metadata("only", "metadata");
  w.write(path("empty.safetensors"));
  auto f = SafetensorsFile::open(path("empty.safetensors"));
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->metadata().at("only"), "metadata");
}

TEST_F(SafetensorsTest, ShardedCheckpointRoundTrip) {
  std::vector<TensorData> tensors;
  const size_t sizes[] = {1000, 10, 4000, 0, 333, 2000, 7, 1, 5000, 64};
  for (size_t i = 0; i < std::size(sizes); ++i)
    tensors.push_back(random_tensor("layers." + std::to_string(i) + ".w", DType::U8,
                                    {static_cast<int64_t>(sizes[i])}, 100 + i));
  tensors.push_back(random_tensor("scalar", DType::F32, {}, 99));
  const auto want = tensors;
  const std::string ck_dir = path("ckpt");
  write_sharded_checkpoint(ck_dir, tensors, 3, {{"format", "pt"}});

  for (const char* f : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                        "model-00003-of-00003.safetensors", "model.safetensors.index.json"})
    EXPECT_TRUE(fs::exists(fs::path(ck_dir) / f)) << f;
  EXPECT_FALSE(fs::exists(fs::path(ck_dir) / "model-00004-of-00003.safetensors"));
  auto index_text = read_file(fs::path(ck_dir) / "model.safetensors.index.json");
  std::string index(index_text.begin(), index_text.end());
  size_t total = 0;
  for (const auto& t : want) total += t.bytes.size();
  EXPECT_HAS(index, "\"total_size\": " + std::to_string(total));
  EXPECT_HAS(index, "\"weight_map\"");

  auto ck = Checkpoint::open(ck_dir);
  EXPECT_EQ(ck->dir(), ck_dir);
  ASSERT_EQ(ck->files().size(), 3u);
  ASSERT_EQ(ck->tensors().size(), want.size());
  std::vector<std::string> file_order;
  for (const auto& t : want) {
    const TensorInfo& got = ck->get(t.name);
    EXPECT_EQ(got.dtype, t.dtype);
    EXPECT_EQ(got.shape, t.shape);
    ASSERT_EQ(got.nbytes, t.bytes.size());
    EXPECT_TRUE(same_bytes(got.data, t.bytes)) << t.name;
    EXPECT_EQ(ck->find(t.name), &got);
    if (file_order.empty() || file_order.back() != got.file) file_order.push_back(got.file);
    EXPECT_EQ(ck->files()[0]->metadata().at("format"), "pt");
  }
  // Tensors keep their order across shards: each shard is one run, shards in order.
  ASSERT_EQ(file_order.size(), 3u);
  for (int s = 0; s < 3; ++s)
    EXPECT_EQ(fs::path(file_order[s]).filename(), shard_file_name(s + 1, 3));
  // Split by bytes: no shard holds more than half of the 12 415 bytes here.
  for (const auto& f : ck->files()) EXPECT_LT(f->file_size(), total / 2) << f->path();
}

TEST_F(SafetensorsTest, ShardedWithAsManyShardsAsTensors) {
  std::vector<TensorData> tensors;
  tensors.push_back(random_tensor("big", DType::F32, {1000}, 1));
  tensors.push_back(random_tensor("small1", DType::I8, {1}, 2));
  tensors.push_back(random_tensor("small2", DType::I8, {1}, 3));
  write_sharded_checkpoint(path("ck"), tensors, 3);
  auto ck = Checkpoint::open(path("ck"));
  ASSERT_EQ(ck->files().size(), 3u);
  for (const auto& f : ck->files()) EXPECT_EQ(f->tensors().size(), 1u) << f->path();
}

TEST_F(SafetensorsTest, SingleFileCheckpoint) {
  SafetensorsWriter w;
  auto t = random_tensor("embed.weight", DType::BF16, {4, 6}, 5);
  w.add(t);
  fs::create_directories(path("single"));
  w.write(path("single/model.safetensors"));
  auto ck = Checkpoint::open(path("single"));
  ASSERT_EQ(ck->tensors().size(), 1u);
  const TensorInfo& got = ck->get("embed.weight");
  EXPECT_TRUE(same_bytes(got.data, t.bytes));
}

// ---- writer misuse -----------------------------------------------------------------------------

TEST_F(SafetensorsTest, WriterRefusesInconsistentTensors) {
  SafetensorsWriter w;
  w.add("a", DType::F32, {2}, random_bytes(8, 1));
  EXPECT_HAS(error_of([&] { w.add("a", DType::F32, {2}, random_bytes(8, 1)); }), "added twice");
  EXPECT_HAS(error_of([&] {
               w.add("b", DType::F32, {2, 3}, random_bytes(20, 1));
             }),
             "needs 24 bytes, got 20");
  EXPECT_HAS(error_of([&] { w.add("c", DType::F32, {-1}, {}); }), "invalid shape [-1]");
  EXPECT_HAS(error_of([&] { w.add("__metadata__", DType::U8, {}, {1}); }), "not a tensor name");
  std::vector<TensorData> two = {random_tensor("x", DType::U8, {1}, 1)};
  EXPECT_HAS(error_of([&] { write_sharded_checkpoint(path("ck"), two, 2); }),
             "2 shards for 1 tensors");
  std::vector<TensorData> dup = {random_tensor("x", DType::U8, {1}, 1),
                                 random_tensor("x", DType::U8, {1}, 2)};
  EXPECT_HAS(error_of([&] { write_sharded_checkpoint(path("ck"), dup, 2); }), "given twice");
}

// ---- broken files ------------------------------------------------------------------------------

class SafetensorsBrokenFileTest : public SafetensorsTest {
 protected:
  // A valid two-tensor file to cut or corrupt.
  void write_valid(const std::string& name) {
    SafetensorsWriter w;
    w.add("a", DType::F32, {4, 4}, random_bytes(64, 1));
    w.add("b", DType::BF16, {3}, random_bytes(6, 2));
    w.write(path(name));
  }
};

TEST_F(SafetensorsBrokenFileTest, MissingFile) {
  auto msg = open_error("nope.safetensors");
  EXPECT_HAS(msg, path("nope.safetensors"));
  EXPECT_HAS(msg, "cannot open");
}

TEST_F(SafetensorsBrokenFileTest, DirectoryIsNotAFile) {
  fs::create_directories(path("d.safetensors"));
  EXPECT_HAS(open_error("d.safetensors"), "not a regular file");
}

TEST_F(SafetensorsBrokenFileTest, TruncatedInTheLengthField) {
  write_file(path("t.safetensors"), {1, 2, 3});
  auto msg = open_error("t.safetensors");
  EXPECT_HAS(msg, path("t.safetensors"));
  EXPECT_HAS(msg, "3 bytes, too short");
  write_file(path("e.safetensors"), {});
  EXPECT_HAS(open_error("e.safetensors"), "0 bytes, too short");
}

TEST_F(SafetensorsBrokenFileTest, TruncatedInTheHeader) {
  write_valid("t.safetensors");
  auto bytes = read_file(path("t.safetensors"));
  bytes.resize(8 + 20);
  write_file(path("t.safetensors"), bytes);
  auto msg = open_error("t.safetensors");
  EXPECT_HAS(msg, path("t.safetensors"));
  EXPECT_HAS(msg, "exceeds the 20 bytes after the length field");
  EXPECT_HAS(msg, "truncated");
}

TEST_F(SafetensorsBrokenFileTest, TruncatedInTheData) {
  write_valid("t.safetensors");
  auto bytes = read_file(path("t.safetensors"));
  bytes.resize(bytes.size() - 3);
  write_file(path("t.safetensors"), bytes);
  auto msg = open_error("t.safetensors");
  EXPECT_HAS(msg, path("t.safetensors"));
  EXPECT_HAS(msg, "tensor 'b'");
  EXPECT_HAS(msg, "data_offsets [64, 70] extend past the 67-byte data section");
  EXPECT_HAS(msg, "truncated");
}

TEST_F(SafetensorsBrokenFileTest, HeaderLengthLargerThanFile) {
  write_raw(path("h.safetensors"), "{}", 0, uint64_t{1} << 40);
  EXPECT_HAS(open_error("h.safetensors"), "header length 1099511627776 exceeds the 2 bytes");
  write_raw(path("max.safetensors"), "{}", 0, ~uint64_t{0});
  EXPECT_HAS(open_error("max.safetensors"), "header length 18446744073709551615 exceeds");
}

TEST_F(SafetensorsBrokenFileTest, HeaderLengthAboveTheReferenceLimit) {
  // A sparse file: 100 MB + 1 of header length is within the file but not a sane header.
  write_raw(path("big.safetensors"), "{}", 0, 100'000'001);
  fs::resize_file(path("big.safetensors"), 8 + 100'000'001);
  EXPECT_HAS(open_error("big.safetensors"), "larger than the 100000000-byte limit");
}

TEST_F(SafetensorsBrokenFileTest, NonJsonHeader) {
  write_raw(path("j.safetensors"), "{\"a\": {\"dtype\": \"F32\",", 0);
  auto msg = open_error("j.safetensors");
  EXPECT_HAS(msg, path("j.safetensors"));
  EXPECT_HAS(msg, "not valid JSON");
  write_raw(path("z.safetensors"), "", 0);
  EXPECT_HAS(open_error("z.safetensors"), "not valid JSON");
  write_raw(path("nul.safetensors"), std::string("{}\0\0", 4), 0);
  EXPECT_HAS(open_error("nul.safetensors"), "not valid JSON");
  write_raw(path("c.safetensors"), "{} // comment", 0);
  EXPECT_HAS(open_error("c.safetensors"), "not valid JSON");
}

TEST_F(SafetensorsBrokenFileTest, HeaderNotUtf8) {
  write_raw(path("u.safetensors"),
            "{\"a\xff\xfe\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1);
  EXPECT_HAS(open_error("u.safetensors"), "not valid JSON");
}

TEST_F(SafetensorsBrokenFileTest, NonObjectHeader) {
  write_raw(path("arr.safetensors"), "[1, 2, 3]", 0);
  auto msg = open_error("arr.safetensors");
  EXPECT_HAS(msg, path("arr.safetensors"));
  EXPECT_HAS(msg, "header is a JSON array, not an object");
  write_raw(path("num.safetensors"), "42      ", 0);
  EXPECT_HAS(open_error("num.safetensors"), "header is a JSON number, not an object");
}

TEST_F(SafetensorsBrokenFileTest, BadDtype) {
  write_raw(path("d.safetensors"),
            R"({"layers.0.w": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 2]}})", 2);
  auto msg = open_error("d.safetensors");
  EXPECT_HAS(msg, path("d.safetensors"));
  EXPECT_HAS(msg, "tensor 'layers.0.w'");
  EXPECT_HAS(msg, "unknown dtype 'Q4_K'");
  write_raw(path("c.safetensors"),
            R"({"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  EXPECT_HAS(open_error("c.safetensors"), "unsupported dtype 'C64'");
  write_raw(path("n.safetensors"), R"({"x": {"dtype": 5, "shape": [1], "data_offsets": [0, 1]}})",
            1);
  EXPECT_HAS(open_error("n.safetensors"), "dtype is 5, expected a string");
}

TEST_F(SafetensorsBrokenFileTest, MalformedEntries) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"x": 3})", "entry is 3, expected an object"},
      {R"({"x": {"dtype": "U8", "shape": [1]}})", "lacks data_offsets"},
      {R"({"x": {"dtype": "U8", "data_offsets": [0, 1]}})", "lacks shape"},
      {R"({"x": {"shape": [1], "data_offsets": [0, 1]}})", "lacks dtype"},
      {R"({"x": {"dtype": "U8", "shape": 1, "data_offsets": [0, 1]}})", "expected an array"},
      {R"({"x": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}})", "not a non-negative"},
      {R"({"x": {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]}})", "not a non-negative"},
      {R"({"x": {"dtype": "U8", "shape": ["1"], "data_offsets": [0, 1]}})", "not a non-negative"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", "expected [begin, end]"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})",
       "expected [begin, end]"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", "expected [begin, end]"},
      {R"({"x": {"dtype": "U8", "shape": [0], "data_offsets": [1, 0]}})", "begin > end"},
      {R"({"x": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 1]}})",
       "overflows"},
      {R"({"x": {"dtype": "F64", "shape": [1152921504606846976, 2], "data_offsets": [0, 1]}})",
       "overflows"},
      {R"({"x": {"dtype": "U8", "shape": [99999999999999999999], "data_offsets": [0, 1]}})",
       "not a non-negative"},
      {R"({"__metadata__": {"k": 1}})", "__metadata__['k'] is 1, expected a string"},
      {R"({"__metadata__": ["k"]})", R"(__metadata__ is ["k"], expected an object)"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
           "x": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
       "key 'x' appears more than once"},
  };
  int i = 0;
  for (const auto& [header, want] : cases) {
    // Built with += : GCC 12 warns falsely (-Wrestrict) on "literal" + std::string here.
    std::string name = "m";
    name += std::to_string(i++) + ".safetensors";
    write_raw(path(name), header, 2);
    auto msg = open_error(name);
    EXPECT_HAS(msg, path(name));
    EXPECT_HAS(msg, want) << "header: " << header;
  }
}

TEST_F(SafetensorsBrokenFileTest, ShapeOffsetMismatch) {
  write_raw(path("s.safetensors"),
            R"({"attn.wq": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24);
  auto msg = open_error("s.safetensors");
  EXPECT_HAS(msg, path("s.safetensors"));
  EXPECT_HAS(msg, "tensor 'attn.wq'");
  EXPECT_HAS(msg, "shape [2, 3] F32 needs 24 bytes but data_offsets [0, 20] span 20");
}

TEST_F(SafetensorsBrokenFileTest, OffsetsOutOfBounds) {
  write_raw(path("o.safetensors"),
            R"({"w": {"dtype": "U8", "shape": [10], "data_offsets": [1000, 1010]}})", 24);
  auto msg = open_error("o.safetensors");
  EXPECT_HAS(msg, "tensor 'w'");
  EXPECT_HAS(msg, "data_offsets [1000, 1010] extend past the 24-byte data section");
  // Offsets that would wrap around if added carelessly.
  write_raw(path("wrap.safetensors"),
            R"({"w": {"dtype": "U8", "shape": [0],
                "data_offsets": [18446744073709551615, 18446744073709551615]}})",
            4);
  EXPECT_HAS(open_error("wrap.safetensors"), "extend past the 4-byte data section");
}

TEST_F(SafetensorsBrokenFileTest, OverlappingTensors) {
  write_raw(path("ov.safetensors"),
            R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
            24);
  auto msg = open_error("ov.safetensors");
  EXPECT_HAS(msg, path("ov.safetensors"));
  EXPECT_HAS(msg, "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
  // The same range twice is an overlap; an empty tensor inside another's range is not.
  write_raw(path("same.safetensors"),
            R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
            4);
  EXPECT_HAS(open_error("same.safetensors"), "overlap");
  write_raw(path("empty_inside.safetensors"),
            R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]}})",
            4);
  EXPECT_NO_THROW(SafetensorsFile::open(path("empty_inside.safetensors")));
}

// Hostile input: random byte flips and cuts of a valid file must give a dsuf::Error or a file whose
// every tensor lies inside the mapping; never a crash or another exception (run it under ASan).
TEST_F(SafetensorsBrokenFileTest, RandomCorruptionNeverCrashes) {
  SafetensorsWriter w;
  w.add("a", DType::F32, {3, 4}, random_bytes(48, 1));
  w.add("b", DType::BF16, {5}, random_bytes(10, 2));
  w.add("c", DType::I64, {}, random_bytes(8, 3));
  w.set_metadata("k", "v");
  w.write(path("v.safetensors"));
  const auto good = read_file(path("v.safetensors"));
  std::mt19937 rng(42);
  const char kJsonChars[] = "0123456789[]{},:\" -";
  int opened = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    auto bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      // Mostly the length field and the header, where the parsing is.
      size_t at = rng() % 3 ? rng() % std::min<size_t>(bytes.size(), 120) : rng() % bytes.size();
      bytes[at] = rng() % 2 ? static_cast<uint8_t>(rng())
                            : static_cast<uint8_t>(kJsonChars[rng() % (sizeof kJsonChars - 1)]);
    }
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    // A new name each time: ext4 flushes a file rewritten through truncation when it is closed.
    const std::string name = path("f" + std::to_string(iter) + ".safetensors");
    write_file(name, bytes);
    try {
      auto f = SafetensorsFile::open(name);
      ++opened;
      unsigned sum = 0;
      for (const auto& [name, t] : f->tensors()) {
        ASSERT_LE(t.nbytes, f->file_size() - f->data_offset());
        for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
      }
      (void)sum;
    } catch (const Error&) {
    }
    fs::remove(name);
  }
  EXPECT_GT(opened, 0);  // some flips land in the data or in digits that stay consistent
}

TEST_F(SafetensorsBrokenFileTest, UnknownEntryKeysAreIgnoredLikeTheReference) {
  write_raw(path("k.safetensors"),
            R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "extra": 1}})", 2);
  auto f = SafetensorsFile::open(path("k.safetensors"));
  EXPECT_EQ(f->tensors().at("a").nbytes, 2u);
}

// ---- broken checkpoints ------------------------------------------------------------------------

class SafetensorsBrokenCheckpointTest : public SafetensorsTest {
 protected:
  std::string write_ckpt() {
    std::vector<TensorData> tensors;
    for (int i = 0; i < 6; ++i)
      tensors.push_back(
          random_tensor("layers." + std::to_string(i) + ".w", DType::BF16, {8, 8}, i));
    write_sharded_checkpoint(path("ck"), tensors, 3);
    return path("ck");
  }
  std::string open_error(const std::string& dir) const {
    return error_of([&] { Checkpoint::open(dir); });
  }
  void write_index(const std::string& text) {
    std::ofstream(fs::path(path("ck")) / Checkpoint::kIndexName, std::ios::trunc) << text;
  }
};

TEST_F(SafetensorsBrokenCheckpointTest, MissingShard) {
  auto dir = write_ckpt();
  fs::remove(fs::path(dir) / "model-00002-of-00003.safetensors");
  auto msg = open_error(dir);
  EXPECT_HAS(msg, "checkpoint '" + dir + "'");
  EXPECT_HAS(msg, "shard 'model-00002-of-00003.safetensors' (holding 2 tensors of the index");
  EXPECT_HAS(msg, "cannot open: No such file or directory");
}

TEST_F(SafetensorsBrokenCheckpointTest, TruncatedShard) {
  auto dir = write_ckpt();
  fs::path shard = fs::path(dir) / "model-00003-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1);
  auto msg = open_error(dir);
  EXPECT_HAS(msg, "shard 'model-00003-of-00003.safetensors'");
  EXPECT_HAS(msg, "tensor 'layers.5.w'");
  EXPECT_HAS(msg, "truncated");
}

TEST_F(SafetensorsBrokenCheckpointTest, IndexNamesTensorAbsentFromItsShard) {
  auto dir = write_ckpt();
  write_index(R"({"weight_map": {"layers.0.w": "model-00001-of-00003.safetensors",
    "layers.1.w": "model-00001-of-00003.safetensors",
    "layers.2.w": "model-00002-of-00003.safetensors",
    "layers.3.w": "model-00002-of-00003.safetensors",
    "layers.4.w": "model-00003-of-00003.safetensors",
    "layers.5.w": "model-00003-of-00003.safetensors",
    "layers.6.w": "model-00003-of-00003.safetensors"}})");
  auto msg = open_error(dir);
  EXPECT_HAS(msg, "checkpoint '" + dir + "'");
  EXPECT_HAS(msg,
             "puts tensor 'layers.6.w' in shard 'model-00003-of-00003.safetensors', which has no "
             "such tensor");
}

TEST_F(SafetensorsBrokenCheckpointTest, IndexPutsTensorInTheWrongShard) {
  auto dir = write_ckpt();
  write_index(R"({"weight_map": {"layers.0.w": "model-00002-of-00003.safetensors",
    "layers.1.w": "model-00001-of-00003.safetensors",
    "layers.2.w": "model-00002-of-00003.safetensors",
    "layers.3.w": "model-00002-of-00003.safetensors",
    "layers.4.w": "model-00003-of-00003.safetensors",
    "layers.5.w": "model-00003-of-00003.safetensors"}})");
  EXPECT_HAS(open_error(dir),
             "shard 'model-00001-of-00003.safetensors' holds tensor 'layers.0.w', which "
             "model.safetensors.index.json puts in 'model-00002-of-00003.safetensors'");
}

TEST_F(SafetensorsBrokenCheckpointTest, ShardHoldsTensorTheIndexDoesNotList) {
  auto dir = write_ckpt();
  write_index(R"({"weight_map": {"layers.0.w": "model-00001-of-00003.safetensors",
    "layers.2.w": "model-00002-of-00003.safetensors",
    "layers.3.w": "model-00002-of-00003.safetensors",
    "layers.4.w": "model-00003-of-00003.safetensors",
    "layers.5.w": "model-00003-of-00003.safetensors"}})");
  EXPECT_HAS(open_error(dir),
             "shard 'model-00001-of-00003.safetensors' holds tensor 'layers.1.w', which "
             "model.safetensors.index.json does not list");
}

TEST_F(SafetensorsBrokenCheckpointTest, BadIndex) {
  auto dir = write_ckpt();
  const std::pair<const char*, const char*> cases[] = {
      {"{\"weight_map\": ", "not valid JSON"},
      {"[]", "is a JSON array, expected an object"},
      {R"({"metadata": {}})", "has no \"weight_map\" object"},
      {R"({"weight_map": []})", "has no \"weight_map\" object"},
      {R"({"weight_map": {}})", "weight_map is empty"},
      {R"({"weight_map": {"a": 3}})", "weight_map['a'] is 3, expected a shard file name"},
      {R"({"weight_map": {"a": "../x.safetensors"}})", "is not a file name in the directory"},
      {R"({"weight_map": {"a": "/etc/passwd"}})", "is not a file name in the directory"},
      {R"({"weight_map": {"a": ".."}})", "is not a file name in the directory"},
  };
  for (const auto& [text, want] : cases) {
    write_index(text);
    auto msg = open_error(dir);
    EXPECT_HAS(msg, Checkpoint::kIndexName);
    EXPECT_HAS(msg, want) << "index: " << text;
  }
}

TEST_F(SafetensorsBrokenCheckpointTest, MissingIndexAndSingleFile) {
  fs::create_directories(path("empty"));
  auto msg = open_error(path("empty"));
  EXPECT_HAS(msg, "checkpoint '" + path("empty") + "'");
  EXPECT_HAS(msg, "has neither model.safetensors.index.json nor model.safetensors");
  auto msg2 = open_error(path("does-not-exist"));
  EXPECT_HAS(msg2, "checkpoint '" + path("does-not-exist") + "': not a directory");
}

TEST_F(SafetensorsBrokenCheckpointTest, TensorThatDoesNotExist) {
  auto ck = Checkpoint::open(write_ckpt());
  EXPECT_EQ(ck->find("layers.99.w"), nullptr);
  auto msg = error_of([&] { ck->get("layers.99.w"); });
  EXPECT_HAS(msg, "checkpoint '" + path("ck") + "': no tensor 'layers.99.w'");
}

}  // namespace
}  // namespace dsuf
