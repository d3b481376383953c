// dsuf checkpoint commands: make-tiny, inspect.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "model/inventory.h"
#include "model/tiny.h"
#include "model/weights.h"

namespace dsuf::tools {

int cmd_make_tiny(int argc, char** argv) {
  TinyOptions opt;
  opt.tokenizer_dir = std::string(DSUF_SOURCE_DIR) + "/assets/tokenizer";
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(a, " needs a value");
      return argv[++i];
    };
    if (a == "--out") opt.out_dir = value();
    else if (a == "--seed") opt.seed = std::stoull(value());
    else if (a == "--shards") opt.num_shards = std::stoi(value());
    else if (a == "--tokenizer-dir") opt.tokenizer_dir = value();
    else if (a == "--variant") opt.variant = value();
    else fail("unknown argument ", a, " (usage: dsuf make-tiny --out DIR [--seed N] [--shards N] [--variant tiny|tiny-long|real-dims] [--tokenizer-dir DIR])");
  }
  write_tiny_checkpoint(opt);
  std::printf("wrote %s (seed %llu)\n", opt.out_dir.c_str(), static_cast<unsigned long long>(opt.seed));
  return 0;
}

int cmd_inspect(int argc, char** argv) {
  std::string dir;
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ckpt") && i + 1 < argc) dir = argv[++i];
    else fail("unknown argument ", argv[i], " (usage: dsuf inspect --ckpt DIR)");
  }
  if (dir.empty()) fail("--ckpt DIR is required");
  auto m = load_model(dir);
  std::map<std::string, std::pair<size_t, size_t>> by_dtype;  // count, bytes
  size_t total = 0;
  for (const auto& [name, info] : m->checkpoint->tensors()) {
    auto& e = by_dtype[dtype_name(info->dtype)];
    ++e.first;
    e.second += info->nbytes;
    total += info->nbytes;
  }
  const TextConfig& t = m->config.text;
  std::printf("%s: %zu tensors in %zu files, %zu bytes; all %zu expected tensors present with the right dtype and shape\n",
              dir.c_str(), m->checkpoint->tensors().size(), m->checkpoint->files().size(), total,
              expected_tensors(m->config).size());
  for (const auto& [dt, e] : by_dtype) std::printf("  %-8s %7zu tensors %14zu bytes\n", dt.c_str(), e.first, e.second);
  std::printf("layers: %d (hidden %lld, %d heads x %d), experts %d top-%d, window %d\n", t.num_hidden_layers,
              static_cast<long long>(t.hidden_size), t.num_attention_heads, t.head_dim, t.n_routed_experts,
              t.num_experts_per_tok, t.sliding_window);
  for (const LayerPlan& lp : m->config.layers)
    std::printf("  layer %2d ratio %d kv_source %2d index_source %2d%s%s%s%s%s\n", lp.layer, lp.ratio, lp.kv_source,
                lp.index_source, lp.owns_compressor ? " compressor" : "", lp.runs_indexer ? " indexer" : "",
                lp.candidate_source ? " candidate-source" : "", lp.candidate_constrained ? " candidate-constrained" : "",
                lp.engram_slot >= 0 ? " engram" : "");
  if (!m->unknown_tensors.empty())
    std::printf("warning: %zu tensors not in the inventory, e.g. %s\n", m->unknown_tensors.size(),
                m->unknown_tensors[0].c_str());
  return 0;
}

}  // namespace dsuf::tools
