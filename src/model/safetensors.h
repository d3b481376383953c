// safetensors files and checkpoints (spec ecosystem.md §1.14).
//
// File layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
//   {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
//   ...}
// padded with spaces, then the data section; offsets are relative to byte 8 + N.
// A checkpoint is a directory holding either model.safetensors.index.json (whose "weight_map" maps
// each tensor name to a shard file) and the shards, or a single model.safetensors.
//
// Reading maps each file read-only and hands out views into the mapping; nothing is copied. A view
// is valid while its SafetensorsFile / Checkpoint lives. Data pointers are only as aligned as the
// writer made them: the Python writer orders tensors by alignment, ours keeps the order of add(),
// so read multi-byte elements with memcpy unless the offset is known to be aligned.
//
// Every failure is a dsuf::Error naming the file and, where there is one, the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsuf {

// The subset of safetensors dtypes this engine reads (model-spec §2.1 uses BF16, F32, I64, I8,
// F8_E4M3 and F8_E8M0). Sub-byte and complex dtypes are refused by name.
enum class DType : uint8_t {
  BF16,
  F16,
  F32,
  F64,
  I8,
  U8,
  I16,
  I32,
  I64,
  U16,
  U32,
  U64,
  BOOL,
  F8_E4M3,
  F8_E5M2,
  F8_E8M0,
};
inline constexpr DType kAllDTypes[] = {
    DType::BF16, DType::F16,     DType::F32,     DType::F64,     DType::I8,  DType::U8,
    DType::I16,  DType::I32,     DType::I64,     DType::U16,     DType::U32, DType::U64,
    DType::BOOL, DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0,
};

size_t dtype_size(DType dtype);
// The spelling used in safetensors headers ("BF16", "F8_E4M3", ...).
const char* dtype_name(DType dtype);
std::optional<DType> parse_dtype(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // empty for a 0-dim tensor (one element)
  const uint8_t* data;         // into the file's mapping; may be unaligned (see above)
  size_t nbytes;
  std::string file;  // the file the tensor lives in, as opened
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates the whole header: throws dsuf::Error on any inconsistency.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }
  size_t data_offset() const { return data_offset_; }  // 8 + header length
  const std::map<std::string, TensorInfo, std::less<>>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  size_t data_offset_ = 0;
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

class Checkpoint {
 public:
  static constexpr const char* kIndexName = "model.safetensors.index.json";
  static constexpr const char* kSingleName = "model.safetensors";

  // Opens every shard and checks the index against the shards' headers.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  const TensorInfo& get(std::string_view name) const;   // throws naming the tensor and the dir
  // Every tensor of every shard, by name.
  const std::map<std::string, const TensorInfo*, std::less<>>& tensors() const { return tensors_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Checkpoint() = default;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*, std::less<>> tensors_;
};

// ---- Writing (tiny checkpoints and tests; holds all tensor bytes in memory) ---------------------

struct TensorData {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // numel * dtype_size bytes, little-endian
};

class SafetensorsWriter {
 public:
  using Tensor = TensorData;
  // Throws if the name is taken or reserved, a dim is negative, or bytes has the wrong size.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void add(TensorData tensor);
  void set_metadata(std::string key, std::string value);
  // Header first (compact JSON, "__metadata__" first, tensors in the order added, padded with
  // spaces to a multiple of 8 bytes as the reference writer does), then the data in the same order.
  // Writes PATH.tmp.<pid> and renames it, so a failed write never leaves a plausible-looking file.
  void write(const std::string& path) const;

  const std::vector<TensorData>& tensors() const { return tensors_; }
  size_t data_bytes() const { return data_bytes_; }

 private:
  std::vector<TensorData> tensors_;
  std::map<std::string, std::string> metadata_;
  size_t data_bytes_ = 0;
};

// "model-00002-of-00048.safetensors", the Hugging Face shard naming.
std::string shard_file_name(int index, int num_shards);

// Writes DIR/model-000NN-of-000MM.safetensors and DIR/model.safetensors.index.json (with
// metadata.total_size and weight_map). Tensors keep their order and are cut into num_shards runs of
// roughly equal bytes, each run non-empty (so num_shards <= tensors.size()). Creates DIR if needed.
// `metadata` goes into every shard's header.
void write_sharded_checkpoint(const std::string& dir, std::vector<TensorData> tensors,
                              int num_shards,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace dsuf
