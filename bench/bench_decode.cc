// bench_decode: batch-B decode steps of the real DeepSeek-V4.1-Flash text model (all 40 layers with
// their real roles and dimensions, embedding and head) on one GPU, with synthetic weights drawn on
// the device and synthetic (random, valid) KV state at the requested context. Prints the median
// step time, the bytes the step must read counted from the shapes, the device's copy bandwidth
// measured in the same run, and their ratio (% of the bandwidth bound).
//
// --gpus 0,1,...: tensor parallel over those GPUs (docs/tp.md). The bytes are then per rank (its
// slices of the split weights, its share of the experts, the replicated parts and the whole KV),
// the bound is the busiest rank's bytes over device 0's measured copy bandwidth, and collectives
// are not in the bound.
//
// Reductions, stated in the output: fewer routed experts per layer (--experts; the 6 a token picks
// are read whatever the total, so batch-1 bytes do not change; larger batches touch more distinct
// experts, counted for uniform routing), smaller Engram tables (--engram-vocab; a token still reads
// 24 rows per Engram layer), Engram compressed ids synthetic (t mod 99092).
// --sample runs the head as the engine does: tokens sampled on the device, no logits copied.
// --prefill N,... times a prefill instead: one sequence from empty, --chunk tokens a forward
// (default 512), per-chunk and total wall time, tokens/s.
//
// Before anything is drawn it prints the memory plan of every context (per GPU: weights, KV pools,
// workspace against the GPU's free memory) and refuses, naming the numbers, when a context cannot
// hold even the smallest batch; --plan prints the plan and stops (no GPU needed: free memory is then
// unknown and nothing is refused, unless --free-gib G says how much each GPU has). Setup progress
// (Engram tables, each rank's weights, in seconds) goes to stderr.
// --timeline PREFIX: after each batch's timed steps, 3 more steps under CUPTI (bench/kernel_timeline.h):
// every kernel's and copy's GPU timestamps, the middle step's span split into the kernels' shares and
// the gaps in which nothing runs (table), the middle layer's chain of kernels (start, duration,
// stream), all records to PREFIX-<context>-<batch>.csv.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <map>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "backend/cuda/check.h"
#include "kernel_timeline.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/parse.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/tp_partition.h"

namespace {

using nlohmann::json;

bool is_prime(int64_t n) {
  if (n < 2) return false;
  for (int64_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

// The released V4.1-Flash config (model-spec §1.2) with the bench's reductions.
json real_config(int experts, int64_t engram_vocab) {
  json j = dsuf::real_v41_config_json();
  json& t = j["text_config"];
  t["n_routed_experts"] = experts;
  t["engram_vocab_size"] = engram_vocab;
  // Table sizes by the official prime rule (model-spec §3b.4), for the reduced vocabulary.
  std::vector<int64_t> used, sizes;
  for (int layer = 0; layer < 2; ++layer) {
    int64_t total = 0;
    for (int n = 2; n <= 4; ++n) {
      int64_t p = engram_vocab - 1;
      for (int h = 0; h < 8; ++h) {
        do ++p;
        while (!is_prime(p) || std::find(used.begin(), used.end(), p) != used.end());
        used.push_back(p);
        total += p;
      }
    }
    sizes.push_back(total);
  }
  t["engram_num_embeddings"] = sizes;
  return j;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Device copy bandwidth (bytes read + written per second), median of 7 copies of 4 GiB.
double copy_bandwidth() {
  const size_t n = size_t(4) << 30;
  void *a, *b;
  DSUF_CUDA(cudaMalloc(&a, n));
  DSUF_CUDA(cudaMalloc(&b, n));
  DSUF_CUDA(cudaMemset(a, 1, n));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  std::vector<double> bw;
  for (int i = 0; i < 8; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i > 0) bw.push_back(2.0 * n / (ms * 1e-3));
  }
  cudaFree(a), cudaFree(b);
  return median(bw);
}

// Bytes a step must read, by component (the same parts CudaBackend::component_ms() times).
struct Bytes {
  double attention = 0, indexer = 0, moe = 0, experts = 0, mhc = 0, engram = 0, head = 0, embed = 0;
  double kv_attention = 0, kv_indexer = 0, engram_host = 0;
  double dense() const { return attention + indexer + moe + mhc + engram; }
  double kv() const { return kv_attention + kv_indexer; }
  double device() const { return dense() + experts + head + embed + kv(); }
  // Per component name of component_ms(): device bytes of that part.
  double of(const std::string& c) const {
    if (c == "embedding") return embed;
    if (c == "engram") return engram;
    if (c == "mhc+norms") return mhc;
    if (c == "attention") return attention + kv_attention;
    if (c == "indexer+compressor") return indexer + kv_indexer;
    if (c == "moe") return moe + experts;
    if (c == "head+sampling") return head;
    return 0;
  }
};

// Bytes one rank reads per step (world 1: the whole model's step).
Bytes count_bytes(const dsuf::ModelConfig& cfg, int B, int64_t ctx, const dsuf::TpPartition& part) {
  const dsuf::TextConfig& t = cfg.text;
  Bytes b;
  double expert_bytes = 0;
  for (const dsuf::TensorSpec& ts : dsuf::expected_tensors(cfg)) {
    double n = double(dsuf::dtype_size(ts.dtype));
    for (int64_t d : ts.shape) n *= double(d);
    const std::string& s = ts.name;
    if (s.find(".ffn.experts.") == std::string::npos) {  // experts: counted below, by share
      const dsuf::TensorSlice sl = dsuf::tensor_slice(part, s, ts.shape);
      if (!sl.present) continue;
      if (sl.sliced) n = n / double(ts.shape[0]) * double(sl.rows.size());
    }
    if (s.rfind("layers.", 0) != 0 && s != "head.weight" && s != "norm.weight" && s != "embed.weight") continue;
    if (s == "embed.weight") continue;
    auto has = [&](const char* part) { return s.find(part) != std::string::npos; };
    if (s == "head.weight" || s == "norm.weight") b.head += n;
    else if (has(".engram.embed.")) continue;
    else if (has(".ffn.experts.")) {
      if (s.rfind("layers.0.ffn.experts.0.", 0) == 0) expert_bytes += n;
    } else if (has(".engram.")) b.engram += n;
    else if (has(".attn.compressor.") || has(".attn.indexer.")) b.indexer += n;
    else if (has(".hc_") || has("_norm.")) b.mhc += n;  // mixes, and the norms fused with the collapse
    else if (has(".ffn.")) b.moe += n;
    else b.attention += n;
  }
  const double E = t.n_routed_experts, k = t.num_experts_per_tok;
  const double distinct = E * (1.0 - std::pow(1.0 - k / E, B));
  b.experts = t.num_hidden_layers * distinct * expert_bytes / part.world;
  b.embed = double(B) * t.hidden_size * 2;
  const dsuf::KvLayout L = dsuf::KvLayout::from_config(cfg);
  double kv_a = double(t.num_hidden_layers) * t.sliding_window * L.window_entry_bytes, kv_i = 0;
  for (const dsuf::LayerPlan& lp : cfg.layers) {
    if (lp.ratio == 0) continue;
    const double vis = double(ctx / lp.ratio);
    kv_a += std::min<double>(t.index_topk, vis) * L.ckv_entry_bytes;
    if (lp.runs_indexer) {
      const double scored = lp.candidate_constrained
                                ? std::min<double>(double(t.candidate_topk_blocks) * t.candidate_block_size, vis)
                                : vis;
      kv_i += scored * L.ikey_entry_bytes;
    }
  }
  b.kv_attention = B * kv_a, b.kv_indexer = B * kv_i;
  b.engram_host = double(B) * t.engram_layer_ids.size() * 24 * (t.engram_head_dim + t.engram_head_dim / 32);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int experts = 96, steps = 50, device = 0, warmup = 3;
    std::vector<int> gpus;
    bool sample = false;      // --sample: the engine's path (tokens sampled on the device, no logits copied)
    bool components = false;  // --components: per-part GPU time (a step without graphs) against its bytes
    bool plan_only = false;   // --plan: print the memory plan and stop
    double free_gib = 0;      // --free-gib G (with --plan): assume G GiB free on every GPU instead of asking them
    int64_t engram_vocab = 1000000;
    std::vector<int64_t> contexts = {8192, 131072, 1048576 - 64}, batches = {1, 4, 16, 64};
    std::vector<int64_t> prefill;  // --prefill N,...: time a prefill of N tokens instead of decode steps
    int chunk = 0;                 // --chunk: prefill chunk rows (default 512; decode steps use 64)
    std::string timeline;          // --timeline PREFIX: CUPTI timeline of 3 steps per batch
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto v = [&] { return i + 1 < argc ? std::string(argv[++i]) : (dsuf::fail(a, " needs a value"), std::string()); };
      if (a == "--experts") experts = std::stoi(v());
      else if (a == "--steps") steps = std::stoi(v());
      else if (a == "--warmup") warmup = std::stoi(v());
      else if (a == "--device") device = std::stoi(v());
      else if (a == "--gpus")
        for (int64_t g : dsuf::parse_int_list(v(), "--gpus", 0, 1024)) gpus.push_back(int(g));
      else if (a == "--engram-vocab") engram_vocab = std::stoll(v());
      else if (a == "--contexts") contexts = dsuf::parse_int_list(v(), "--contexts", 1, int64_t(1) << 20);
      else if (a == "--batches") batches = dsuf::parse_int_list(v(), "--batches", 1, 4096);
      else if (a == "--sample") sample = true;
      else if (a == "--components") components = true;
      else if (a == "--plan") plan_only = true;
      else if (a == "--free-gib") free_gib = std::stod(v());
      else if (a == "--prefill") prefill = dsuf::parse_int_list(v(), "--prefill", 1, int64_t(1) << 20);
      else if (a == "--chunk") chunk = std::stoi(v());
      else if (a == "--timeline") timeline = v();
      else dsuf::fail("unknown argument ", a);
    }
    if (!timeline.empty() && !dsuf::bench::TimelineCapture::available())
      dsuf::fail("--timeline: this build has no CUPTI");
    if (!prefill.empty()) contexts = prefill, batches = {1};  // the plan and the pools for one sequence
    const int max_chunk = chunk > 0 ? chunk : prefill.empty() ? 64 : 512;
    if (gpus.empty()) gpus = {device};
    device = gpus[0];
    const int world = int(gpus.size());
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it comes, also into a log file
    const json cj = real_config(experts, engram_vocab);
    const dsuf::ModelConfig cfg = dsuf::parse_model_config(cj, "bench config");
    const int64_t max_pos = cfg.text.max_position_embeddings;
    for (int64_t ctx : contexts)
      if (ctx + steps + warmup + 5 + 1 > max_pos)
        dsuf::fail("--contexts ", ctx, ": ", steps + warmup + 6, " decode steps would pass max_position_embeddings ",
                   max_pos, " (use at most ", max_pos - steps - warmup - 6, ")");
    // Room for the steps the run decodes, within the model's positions.
    auto max_ctx_of = [&](int64_t ctx) { return std::min(ctx + steps + warmup + 16, max_pos); };
    auto options = [&](int64_t ctx, int64_t B) {
      return dsuf::CudaOptions{.device = device, .max_context = max_ctx_of(ctx), .max_chunk = max_chunk, .numerics = {},
                               .max_batch = int(B), .devices = gpus, .progress = true};
    };

    // The memory plan, before anything is allocated: per context, the largest of --batches whose
    // pools fit next to the weights on every GPU (1 GiB margin: NCCL's buffers, CUDA graphs, the
    // allocator's rounding of the per-sequence pools).
    const size_t margin = size_t(1) << 30;
    int count = 0;
    if (free_gib > 0 && !plan_only) dsuf::fail("--free-gib goes with --plan");
    const bool assume = free_gib > 0;
    const bool have_gpu = assume || (cudaGetDeviceCount(&count) == cudaSuccess && count > 0);
    if (!have_gpu && !plan_only) dsuf::fail("no CUDA device is available (--plan prints the memory plan without one)");
    std::vector<size_t> free_b(world, size_t(free_gib * double(1ull << 30)));
    for (int r = 0; r < world && have_gpu && !assume; ++r) {
      if (gpus[r] >= count) dsuf::fail("--gpus: GPU ", gpus[r], " does not exist (", count, " visible)");
      size_t total_b = 0;
      DSUF_CUDA(cudaSetDevice(gpus[r]));
      DSUF_CUDA(cudaMemGetInfo(&free_b[r], &total_b));
    }
    auto gib = [](double b) { return b / double(1ull << 30); };
    std::map<int64_t, int64_t> max_b_of;  // per context
    std::string refused;
    for (int64_t ctx : contexts) {
      int64_t max_b = 0;
      for (int64_t B : batches) {
        bool fits = true;
        for (int r = 0; r < world && have_gpu; ++r)
          fits = fits && dsuf::plan_cuda_memory(cfg, options(ctx, B), r).total() + margin <= free_b[r];
        if (fits) max_b = std::max(max_b, B);
      }
      max_b_of[ctx] = max_b;
      const int64_t shown = max_b ? max_b : *std::min_element(batches.begin(), batches.end());
      for (int r = 0; r < world; ++r) {
        const dsuf::CudaMemoryPlan p = dsuf::plan_cuda_memory(cfg, options(ctx, shown), r);
        char line[400];
        std::snprintf(line, sizeof line,
                      "plan: context %lld, batch %lld, rank %d (GPU %d): weights %.2f GiB + KV pools %.2f GiB"
                      " + workspace %.2f GiB = %.2f GiB (+ %.1f GiB margin)",
                      static_cast<long long>(ctx), static_cast<long long>(shown), r, gpus[r], gib(p.weights),
                      gib(p.sequences), gib(p.workspace), gib(p.total()), gib(margin));
        std::string l = line;
        if (have_gpu) {
          std::snprintf(line, sizeof line, " of %.2f GiB free%s: %s", gib(free_b[r]), assume ? " (--free-gib)" : "",
                        p.total() + margin <= free_b[r] ? "fits" : "DOES NOT FIT");
          l += line;
          if (!max_b && refused.empty()) refused = l;
        }
        std::printf("%s\n", l.c_str());
      }
    }
    std::printf("plan: Engram tables %.2f GiB in pinned host memory (shared by the GPUs)\n",
                gib(dsuf::plan_cuda_memory(cfg, options(contexts[0], 1), 0).host_pinned));
    if (!refused.empty())
      dsuf::fail("the plan does not fit (", refused, "): use fewer --experts, more --gpus, smaller --batches, or drop"
                 " that context from --contexts");
    if (plan_only) return 0;

    DSUF_CUDA(cudaSetDevice(device));
    const double bw = copy_bandwidth();
    std::printf("device copy bandwidth (read+write): %.0f GB/s, measured in this run\n", bw / 1e9);
    std::printf("model: V4.1-Flash text, 40 layers, real dimensions; %d routed experts per layer (the real model has 384:"
                " a token reads its 6 either way), Engram tables from vocab %lld (a token reads 24 rows per layer either"
                " way), synthetic weights and KV\n",
                experts, static_cast<long long>(engram_vocab));
    // The one dense tensor whose size follows the expert count: the router's BF16 gate.
    if (const int real = dsuf::real_v41_config_json()["text_config"]["n_routed_experts"].get<int>(); experts < real)
      std::printf("router: its gate has %d rows here, %d in the real model (%.1f MB a step more to read there, not"
                  " counted; its routing scans %.0f× more scores)\n",
                  experts, real,
                  double(real - experts) * double(cfg.text.hidden_size) * 2 * cfg.text.num_hidden_layers / 1e6,
                  double(real) / experts);
    const char* fp4 = std::getenv("DSUF_FP4");
    std::printf("routed experts' FP4 kernel: %s\n",
                fp4 ? fp4 : "tiles (k_fp4_imma over weights re-laid at load)");
    std::printf("head: %s\n", sample ? "tokens sampled on the device (T 0.7, top_p 0.9), no logits copied (--sample)"
                                     : "FP32 logits copied to the host (--sample: the engine's device sampling)");
    std::vector<dsuf::TpPartition> parts;
    for (int r = 0; r < world; ++r) parts.push_back(dsuf::TpPartition::make(cfg.text, world, r));
    if (world > 1)
      std::printf("tensor parallel over %d GPUs, routed experts %s (DSUF_TP_EXPERTS): bytes are the busiest rank's,"
                  " the bound is those bytes over GPU %d's copy bandwidth\n", world,
                  parts[0].width_experts() ? "split by width" : "whole, round robin", device);
    std::vector<int32_t> cids(cfg.text.vocab_size);
    for (size_t i = 0; i < cids.size(); ++i) cids[i] = int32_t(i % 99092);
    if (!prefill.empty()) {
      // Prefill: one sequence from empty, max_chunk tokens a forward (the last row's logits each, so
      // each forward ends on the host), fresh token ids; wall time per chunk and in all.
      std::printf("%9s %7s %7s %11s %10s %14s %13s\n", "tokens", "chunk", "chunks", "total s", "tok/s",
                  "first chunk ms", "last chunk ms");
      for (int64_t n : prefill) {
        dsuf::CudaBackend be(cfg, cids, options(n, 1), 1234);
        dsuf::SequenceState seq = be.new_sequence();
        std::vector<int32_t> toks(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) toks[size_t(i)] = int32_t((i * 7919 + 11) % 120000) + 3;
        std::vector<float> logits;
        std::vector<double> per;
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t p = 0; p < n; p += max_chunk) {
          const int64_t m = std::min<int64_t>(max_chunk, n - p);
          dsuf::ForwardItem it{.state = &seq, .tokens = {toks.data() + p, size_t(m)},
                               .want = dsuf::ForwardItem::Logits::kLast, .logits = &logits};
          const auto c0 = std::chrono::steady_clock::now();
          be.forward({&it, 1});
          per.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count());
          std::fprintf(stderr, "prefill: %lld of %lld tokens, chunk %.1f ms\n", static_cast<long long>(p + m),
                       static_cast<long long>(n), per.back());
        }
        const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("%9lld %7d %7zu %11.2f %10.1f %14.1f %13.1f\n", static_cast<long long>(n), max_chunk, per.size(),
                    total, double(n) / total, per.front(), per.back());
      }
      return 0;
    }
    std::printf("%9s %5s %10s %10s %9s %9s %9s %8s %10s\n", "context", "batch", "step ms", "gpu ms", "GB read",
                "bound ms", "% bound", "tok/s", "engram MB");
    for (int64_t ctx : contexts) {
      const int64_t max_b = max_b_of.at(ctx);  // the plan above: at least the smallest batch fits
      const auto t_setup = std::chrono::steady_clock::now();
      dsuf::CudaBackend be(cfg, cids, options(ctx, max_b), 1234);
      std::fprintf(stderr, "setup: context %lld, batch up to %lld: backend ready in %.1f s\n",
                   static_cast<long long>(ctx), static_cast<long long>(max_b),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t_setup).count());
      for (int64_t B : batches) {
        if (B > max_b) {
          std::printf("%9lld %5lld  (pools do not fit with the weights)\n", static_cast<long long>(ctx),
                      static_cast<long long>(B));
          continue;
        }
        std::vector<dsuf::SequenceState> seqs;
        for (int64_t b = 0; b < B; ++b) seqs.push_back(be.synthetic_sequence(ctx, 77 + b));
        std::vector<int32_t> tok(B), sampled(B);
        std::vector<std::vector<float>> logits(B);
        std::vector<double> wall, gpu;
        // Step s's items: fresh tokens (varied routing), token id (s·a + b·c + off) mod 120000 + 3.
        auto step_items = [&](int s, int64_t a, int64_t c, int64_t off) {
          std::vector<dsuf::ForwardItem> items;
          for (int64_t b = 0; b < B; ++b) {
            tok[b] = int32_t((s * a + b * c + off) % 120000) + 3;
            items.push_back({.state = &seqs[b], .tokens = {&tok[b], 1}, .want = dsuf::ForwardItem::Logits::kLast,
                             .logits = sample ? nullptr : &logits[b],
                             .sampling = {.temperature = 0.7f, .top_p = 0.9f, .top_k = 0, .seed = uint64_t(b)},
                             .draw = uint64_t(s), .token = sample ? &sampled[b] : nullptr});
          }
          return items;
        };
        for (int s = 0; s < steps + warmup; ++s) {
          std::vector<dsuf::ForwardItem> items = step_items(s, 7919, 104729, 0);
          auto t0 = std::chrono::steady_clock::now();
          be.forward(items);
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          if (s >= warmup) wall.push_back(ms), gpu.push_back(be.last_graph_ms());
        }
        Bytes by;
        for (const dsuf::TpPartition& part : parts) {  // the busiest rank
          const Bytes r = count_bytes(cfg, int(B), ctx, part);
          if (r.device() > by.device()) by = r;
        }
        const double bound_ms = by.device() / bw * 1e3, gms = median(gpu), wms = median(wall);
        std::printf("%9lld %5lld %10.3f %10.3f %9.3f %9.3f %8.1f%% %8.1f %10.3f\n", static_cast<long long>(ctx),
                    static_cast<long long>(B), wms, gms, by.device() / 1e9, bound_ms, 100.0 * bound_ms / gms,
                    B / (wms * 1e-3), by.engram_host / 1e6);
        std::fflush(stdout);
        if (!timeline.empty()) {
          // Three more steps (the graph replayed as above) under CUPTI; the middle one's summary.
          dsuf::bench::TimelineCapture cap;
          std::vector<uint64_t> begins;
          cap.start();
          for (int s = 0; s < 3; ++s) {
            std::vector<dsuf::ForwardItem> items = step_items(steps + warmup + s, 7919, 104729, 0);
            begins.push_back(dsuf::bench::TimelineCapture::now());
            be.forward(items);
          }
          const auto tsteps = dsuf::bench::split_steps(cap.stop(), begins);
          const std::string path = timeline + "-" + std::to_string(ctx) + "-" + std::to_string(B) + ".csv";
          dsuf::bench::write_csv(path, tsteps);
          std::printf("    timeline of %zu steps (CUPTI, graph replays; records in %s), the middle one:\n",
                      tsteps.size(), path.c_str());
          if (!tsteps.empty()) {
            const auto& mid = tsteps[tsteps.size() / 2];
            dsuf::bench::print_summary(stdout, dsuf::bench::summarize(mid), 30);
            // One layer's chain: from its attention site's collapse to the next layer's (two
            // collapses a layer; the middle layer).
            const int layer = cfg.text.num_hidden_layers / 2;
            std::printf("    layer %d, in the middle step, from its attention site's collapse:\n", layer);
            dsuf::bench::print_chain(stdout, mid, "k_collapse_norm", 2 * layer, 2);
          }
          std::fflush(stdout);
        }
        if (components) {
          // The same step without a graph, CUDA events between its parts; median of 5 per part.
          be.set_component_timing(true);
          std::map<std::string, std::vector<double>> per;
          double total = 0;
          for (int s = 0; s < 5; ++s) {
            std::vector<dsuf::ForwardItem> items = step_items(s, 104723, 7919, 55);
            be.forward(items);
            for (const auto& [name, ms] : be.component_ms()) per[name].push_back(ms);
          }
          be.set_component_timing(false);
          std::printf("    %-20s %9s %9s %9s %8s   (no graph: launch gaps included)\n", "component", "gpu ms", "GB",
                      "bound ms", "% bound");
          for (auto& [name, v] : per) {
            const double ms = median(v), gb = by.of(name);
            total += ms;
            std::printf("    %-20s %9.3f %9.3f %9.3f %7.1f%%\n", name.c_str(), ms, gb / 1e9, gb / bw * 1e3,
                        ms > 0 ? 100.0 * (gb / bw * 1e3) / ms : 0.0);
          }
          std::printf("    %-20s %9.3f %9.3f %9.3f %7.1f%%\n", "all", total, by.device() / 1e9, bound_ms,
                      100.0 * bound_ms / total);
          std::fflush(stdout);
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: error: %s\n", e.what());
    return 1;
  }
}
