// Helper for safetensors_oracle.py, which checks our reader and writer against the Python
// safetensors package (the reference implementation):
//   safetensors_oracle dump PATH   PATH is a file or a checkpoint directory; prints its tensors
//                                  (dtype, shape, bytes in hex) and metadata as JSON.
//   safetensors_oracle write DIR   writes DIR/all.safetensors (every dtype), DIR/native.safetensors
//                                  (the dtypes numpy has) and a 3-shard checkpoint DIR/ckpt; prints
//                                  what it wrote (names, dtypes, shapes, pattern seeds) as JSON.
// Tensor k of `write` holds byte j = (131 j + 17 k + 7 + j / 256) mod 256 (BOOL: that mod 2), which
// the script recomputes on its own.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/safetensors.h"

namespace {

using dsuf::DType;
using nlohmann::ordered_json;

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

ordered_json describe(const dsuf::TensorInfo& t) {
  return {{"dtype", dsuf::dtype_name(t.dtype)},
          {"shape", t.shape},
          {"numel", t.numel()},
          {"hex", hex(t.data, t.nbytes)}};
}

int dump(const std::string& path) {
  ordered_json out = {{"tensors", ordered_json::object()}, {"metadata", ordered_json::object()}};
  if (std::filesystem::is_directory(path)) {
    auto ck = dsuf::Checkpoint::open(path);
    for (const auto& [name, info] : ck->tensors()) out["tensors"][name] = describe(*info);
    for (const auto& f : ck->files())
      for (const auto& [k, v] : f->metadata()) out["metadata"][k] = v;
  } else {
    auto f = dsuf::SafetensorsFile::open(path);
    for (const auto& [name, info] : f->tensors()) out["tensors"][name] = describe(info);
    for (const auto& [k, v] : f->metadata()) out["metadata"][k] = v;
    out["data_offset"] = f->data_offset();
  }
  std::cout << out.dump() << "\n";
  return 0;
}

std::vector<uint8_t> pattern(size_t n, int k, DType dtype) {
  std::vector<uint8_t> v(n);
  for (size_t j = 0; j < n; ++j) {
    v[j] = static_cast<uint8_t>(j * 131 + k * 17 + 7 + (j >> 8));
    if (dtype == DType::BOOL) v[j] &= 1;
  }
  return v;
}

int write(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {5}, {3, 7}, {2, 0, 3}, {2, 3, 67}};
  ordered_json manifest = {{"all", ordered_json::array()},
                           {"native", ordered_json::array()},
                           {"ckpt", ordered_json::array()}};
  dsuf::SafetensorsWriter all, native;
  std::vector<dsuf::TensorData> ckpt;
  int k = 0;
  for (DType dt : dsuf::kAllDTypes) {
    const bool numpy_has =
        dt != DType::BF16 && dt != DType::F8_E4M3 && dt != DType::F8_E5M2 && dt != DType::F8_E8M0;
    for (const auto& shape : shapes) {
      int64_t numel = 1;
      for (auto d : shape) numel *= d;
      dsuf::TensorData t{std::string("w.") + dsuf::dtype_name(dt) + "." + std::to_string(k), dt,
                         shape, pattern(static_cast<size_t>(numel) * dsuf::dtype_size(dt), k, dt)};
      ordered_json m = {
          {"name", t.name}, {"dtype", dsuf::dtype_name(dt)}, {"shape", shape}, {"k", k}};
      all.add(t);
      manifest["all"].push_back(m);
      if (numpy_has) {
        native.add(t);
        manifest["native"].push_back(m);
      }
      if (numel > 0) {
        ckpt.push_back(t);
        manifest["ckpt"].push_back(m);
      }
      ++k;
    }
  }
  all.set_metadata("writer", "dsuf");
  all.set_metadata("unicode", "DeepSeek-V4.1 ｜ 模型");
  all.write(dir + "/all.safetensors");
  native.write(dir + "/native.safetensors");
  dsuf::write_sharded_checkpoint(dir + "/ckpt", std::move(ckpt), 3, {{"format", "pt"}});
  std::cout << manifest.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s dump PATH | write DIR\n", argv[0]);
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "dump") return dump(argv[2]);
    if (cmd == "write") return write(argv[2]);
  } catch (const dsuf::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown command '%s'\n", cmd.c_str());
  return 2;
}
