// CudaBackend: runs the V4.1 forward with the kernels of kernels.cu, step for step as the CPU
// reference does (same rounding points, same order of the state updates), one sequence chunk at a
// time. Speed comes later (fused kernels, batched decode, CUDA graphs); this version is the
// correctness baseline the fast kernels are checked against too.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/topk_plan.h"
#include "backend/cuda/tp.h"
#include "core/error.h"
#include "core/parse.h"
#include "model/engram.h"
#include "model/inventory.h"
#include "model/rope.h"
#include "model/tp_partition.h"

namespace dsuf {
namespace {

using cuda::RowMeta;
using cuda::SeqMeta;

// Owns one device allocation (freed on its own device, whichever is current: tensor parallel).
struct DevMem {
  void* p = nullptr;
  int dev = 0;
  DevMem() = default;
  explicit DevMem(size_t bytes) {
    DSUF_CUDA(cudaGetDevice(&dev));
    DSUF_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  DevMem(DevMem&& o) noexcept : p(o.p), dev(o.dev) { o.p = nullptr; }
  DevMem& operator=(DevMem&& o) noexcept {
    std::swap(p, o.p);
    std::swap(dev, o.dev);
    return *this;
  }
  ~DevMem() {
    if (!p) return;
    int cur = dev;
    cudaGetDevice(&cur);
    if (cur != dev) cudaSetDevice(dev);
    cudaFree(p);
    if (cur != dev) cudaSetDevice(cur);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct DevFp8 {
  const uint8_t* w = nullptr;
  const uint8_t* s = nullptr;
  int64_t out = 0, in = 0;
};

struct DevExperts {
  const uint8_t** w1 = nullptr;  // device arrays of per-expert device pointers
  const uint8_t** s1 = nullptr;
  const uint8_t** w2 = nullptr;
  const uint8_t** s2 = nullptr;
  const uint8_t** w3 = nullptr;
  const uint8_t** s3 = nullptr;
};

struct DevLayer {
  const float *hca_fn, *hca_base, *hca_scale, *hcf_fn, *hcf_base, *hcf_scale;
  const uint16_t *attn_norm, *ffn_norm, *q_norm, *kv_norm;
  const float* sink;
  DevFp8 wq_a, wq_b, wkv, wo_a, wo_b;
  const uint16_t *comp_wkv = nullptr, *comp_wgate = nullptr, *comp_norm = nullptr, *idx_wk = nullptr,
                 *idx_k_norm = nullptr, *idx_wproj = nullptr;
  DevFp8 idx_wq_b;
  const uint16_t* gate;
  const float *bias, *bias_vl;
  DevExperts experts;
  DevFp8 sw1, sw2, sw3;
  // Engram (tables in mapped pinned host memory).
  const uint8_t *e_table = nullptr, *e_scale = nullptr;
  DevFp8 e_wkv;
  const uint16_t *e_q = nullptr, *e_k = nullptr;
};

// One sequence's pools on one rank's device.
struct DevSeq {
  DevMem window;                      // [L][W][window_entry_bytes]
  std::vector<DevMem> ckv, ikey;      // per KV source, capacity entries
  std::vector<DevMem> pending[2];     // per KV source, [ratio][2·hd] FP32, double-buffered
  std::vector<int> cur;               // which pending buffer is current
  std::vector<int64_t> entries;       // per KV source
};
// SequenceState::device: the sequence's pools on every rank (replicated: each rank computes the
// shared KV latent, compressors and indexer keys itself). Copying a state copies the handle, so the
// set also records whose pools they are: the backend that made them and how many tokens they hold.
// A state whose pos differs holds a handle that went stale (a copy taken before the pools advanced,
// a state restored from the conversation cache, host pools replaced): Impl::seq drops it and
// uploads that state's host pools again.
struct DevSeqSet {
  const void* owner = nullptr;  // the CudaBackend whose ranks allocated them
  int64_t pos = 0;              // tokens the pools describe
  std::vector<std::unique_ptr<DevSeq>> ranks;
};

}  // namespace

struct CudaBackend::Impl {
  const ModelConfig& cfg;
  const LoadedModel* model;  // null for a synthetic model (weights drawn on the device)
  std::map<std::string, const uint8_t*> dev;  // every backbone tensor's device (or mapped host) address
  KvLayout layout;
  std::vector<int32_t> cids;
  CudaOptions opt;
  // Tensor parallelism: this rank's slices; comm is null at world size 1 (exchanges are no-ops).
  TpPartition part;
  cuda::TpComm* comm = nullptr;
  const std::map<std::string, const uint8_t*>* host_tables = nullptr;  // rank 0's pinned tables
  std::map<std::string, const uint8_t*> host_ptr;                       // (rank 0) pinned host addresses
  float *tp_send = nullptr, *tp_recv = nullptr;
  int64_t tp_send_floats = 0;
  cuda::ColSplit zg_split, hidden_split, vocab_split, ffn_split;  // columns each rank computes of the gathered products
  bool experts_tiled = false;  // the routed experts' E2M1 weights as tiles (cuda::fp4_tiled_wanted)
  std::unique_ptr<EngramHasher> hasher;
  cudaStream_t stream = nullptr;
  // A second stream for the independent branches of a layer (the compressor and indexer beside the
  // query/KV projections; the shared expert beside the routed ones), so that their small kernels
  // overlap instead of queueing (DSUF_OVERLAP=0 turns it off; off while timing components).
  cudaStream_t side = nullptr;
  cudaEvent_t ev_fork = nullptr, ev_join = nullptr;
  cudaEvent_t ev_scores = nullptr;  // an indexer layer's scores done (DSUF_WQB_WAIT=scores)
  bool overlap = true;
  // Work enqueued on branch() after fork() may run beside what `stream` gets next, until join().
  cudaStream_t branch() const { return overlap && !comp_timing ? side : stream; }
  void fork() {
    if (branch() == stream) return;
    DSUF_CUDA(cudaEventRecord(ev_fork, stream));
    DSUF_CUDA(cudaStreamWaitEvent(side, ev_fork));
  }
  void join() {
    if (branch() == stream) return;
    DSUF_CUDA(cudaEventRecord(ev_join, side));
    DSUF_CUDA(cudaStreamWaitEvent(stream, ev_join));
  }
  // The experts' linears take their routed rows (tokens × experts a token) grouped by expert, each
  // expert's weights read once per kRowGroup rows, from this many routed rows per expert of the
  // layer on average (DSUF_MOE_GROUP_ROWS; 0: never). Measured (docs/perf.md, v14, 96 experts):
  // 1 routed row per expert (batch 16) lost 9 %, 4 (batch 64) gained 6 %, a 512-token chunk 12 %.
  int64_t group_rows_per_expert = 4;
  int shared_fork = 0;  // DSUF_SHARED_FORK=auto|early|late: 0|1|2 (moe())
  // DSUF_HEAD_INPUT=direct|gather: when every row gets logits in row order (decode), the head's
  // collapse reads the streams and the last FFN site's pre where they are (direct, the default since
  // v36: one graph memcpy node — which no programmatic launch crosses — and k_gather_rows' 15 µs off
  // the step's tail; −0.022 ms a batch-1 step, docs/perf.md) or through the copy and the gather (v35).
  bool head_direct = true;
  bool gather_early = true;  // DSUF_GATHER=early|late (attention())
  // DSUF_SUM_EXPAND=collapse|kernel: the FFN site's MoE sum and expansion by the next attention site's
  // collapse (collapse, the default since session 34, with the wide collapse, where no Engram gate or
  // trace comes between: −0.031 ms at batch 1 and 8K, −0.028 at 128K, −0.037 at batch 4 against the
  // wide collapse alone, docs/perf.md v46) or by k_moe_sum_expand (kernel; in v45's 256-thread collapse
  // the sum cost more than the launch it saved, v24).
  bool sum_in_collapse = false;
  // DSUF_GATHER_REUSE=on|off: ws.keys past each row's window keeps the selected entries' keys of the
  // last gather; a layer that attends the same source slot's entries by the same selection (the
  // layers after an indexer layer, up to the next) has gather_keys decode only its window (on, the
  // default since v38) instead of all 640 keys again (off). keys_sel: what that part holds (slot and
  // selection layer, −1 nothing known), keys_layer: the layer that gathered last (a new pass starts
  // at a layer ≤ it).
  bool gather_reuse = true;
  int keys_sel = -1, keys_layer = -1;
  // DSUF_TOPK_RANK=gather|sort: the indexer's top-k leaves its picks unsorted and gather_keys' blocks
  // place them by rank (cuda::top_k_picks; v27, −0.065 ms a batch-1 step; steps of up to 4 rows) or
  // the top-k sorts them (v26).
  bool rank_gather = true;
  // DSUF_WQB_WAIT=scores|none (v29, default scores: −0.05 ms a batch-1 step at 8K): in an indexer layer,
  // wq_b waits for the indexer's scores (an event) instead of streaming beside them. Its 1,024 blocks
  // held the SMs the scores kernel needed (8.3 µs alone, ~22 in place), on the indexer layers' critical
  // path, while wq_b's result is needed only after the selection. (The event after the candidate
  // blocks' mask instead measured −0.007 ms, within noise: v29.) With k_fp8_gemv_tiles (session 25,
  // docs/perf.md v39): ungated +0.04 ms; ungated with its grid capped at 2–5 blocks an SM, leaving
  // room for the indexer's chain, ±0 to +0.02.
  bool wqb_after_scores = true;
  bool comp_fork_early = true;  // DSUF_COMP_FORK=early|late (attention())
  bool idx_q_main = true;       // DSUF_IDX_Q=main|side (attention())
  bool idx_rope_fused = true;   // DSUF_IDX_ROPE=fused|split (indexer_query())
  cudaStream_t mix_side = nullptr;  // the mHC mixes (hc_mix_fork); null: they run on `stream`
  cudaEvent_t mix_ev_fork = nullptr, ev_mix = nullptr;
  bool mix_pending = false;  // a mix on `mix_side` that `stream` has not waited for yet
  // DSUF_MIX_FORK=late: a site's mix is launched after the site's first linear (wq_a+wkv; the router
  // and route) instead of right after its collapse, so it overlaps other kernels (docs/perf.md v15).
  // attn: the attention site's mix after wq_b (beside the attention pair instead of wq_b: the mix's
  // blocks slowed wq_b's stream), the FFN site's right after its collapse (early). auto (the default
  // since session 31): attn for one row, early for more. Measured (docs/perf.md session 31, gpu ms,
  // same call): batch 1 at 8K attn −0.045 (4 of 4 rounds below early's), 128K −0.041; batch 4
  // +0.24 (the attention kernels of 4 rows take the SMs the mix would use). The FFN site's mix after
  // the route or after the routed experts' w1/w3 launch (with attn) measured +0.044 and +0.27 (session
  // 32): removed.
  enum MixFork { kMixAuto, kMixEarly, kMixLate, kMixAttn };
  MixFork mix_mode = kMixAuto;  // DSUF_MIX_FORK
  bool mix_attn = false;  // this step: the attention sites' mixes after wq_b (enqueue_step)
  std::function<void()> mix_deferred;  // the site's mix, when DSUF_MIX_FORK defers it and not launched yet
  // Engram ahead of its layer (DSUF_ENGRAM=start|inline|prev): an Engram layer's table rows, their
  // quantized layout and wkv depend on the token ids alone, not on the residual streams; only the
  // gate reads the streams. start (the default since session 32): every Engram layer's part is
  // launched on `e_side` right after the step's upload, beside layer 0; prev: at the previous
  // layer's attention site after wq_b (beside the latency-bound attention pair, as DSUF_MIX_FORK=attn
  // places the mix); inline: on the layer's own path (before session 32). The gate waits for its
  // layer's event. Steps of at most e_rows rows; own buffers per Engram layer. Measured (docs/perf.md
  // session 32, gpu ms against inline in the same call, 4 rounds): batch 1 at 8K start −0.029 and
  // −0.022 (two calls), prev −0.018 and −0.009; batch 4 start −0.073 and −0.055, prev −0.092 and −0.064.
  // DSUF_ENGRAM_SM=n: the ahead wkv's tile kernel at most n blocks an SM (0: as many as fit).
  // DSUF_ENGRAM_CHUNKS=n (prev): layer L's wkv in p = min(n, L + 1) slices of its output rows, one
  // beside each attention pair of layers L − p … L − 1, where "layer −1" is the step's start (the rows'
  // gather and layout go with the first slice). Neither beat start beyond the noise (±0.01).
  enum EngramMode { kEngramStart, kEngramInline, kEngramPrev };  // DSUF_ENGRAM's order
  EngramMode engram_mode = kEngramStart;
  int engram_sm = 0, engram_chunks = 1;
  cudaStream_t e_side = nullptr;
  cudaEvent_t e_ev_fork = nullptr;
  struct EngramAhead {
    float *emb = nullptr, *xq = nullptr, *xs = nullptr, *ekv = nullptr;
    cudaEvent_t done = nullptr;
  };
  std::vector<EngramAhead> e_ahead;  // one per Engram layer (its hasher slot)
  int e_rows = 0;                    // the most rows a step may have for the ahead path
  bool e_ahead_step = false;         // this step takes the ahead path (enqueue_step)
  std::vector<DevMem> owned;
  std::vector<void*> pinned;
  size_t weight_bytes = 0;
  const uint16_t *embed = nullptr, *head = nullptr, *norm = nullptr;
  Bf16FmaLimits head_fl;  // the head's weight limits for the FMA at batch ≥ 8 (cuda::bf16_fma_limits)
  std::vector<DevLayer> layers;
  std::vector<float> inv_main, inv_comp;  // RoPE frequencies (host); cos/sin go up per chunk
  int half = 0;
  // Workspace, sized for opt.max_chunk rows.
  struct {
    float *X, *pre, *mix_a, *mix_f, *u, *xn, *y, *tmp, *q_lat, *q, *kvw, *ag, *o, *zg, *qi, *wts,
        *scores, *bscores, *router, *rw, *h1, *h3, *ye, *ys, *h1s, *h3s, *emb, *ekv, *logits, *keys, *att;
    float *xq[3], *xs[3];  // linear inputs (cuda::linear_input): two live at a time, the third the shared expert's
    uint8_t* xp[2];        // byte planes of the routed experts' inputs (cuda::InputSink::xp): w1/w3, w2
    int32_t *sel, *cand, *ids;
    uint64_t* picks;  // [rows][index_topk] the indexer's unsorted picks (cuda::top_k_picks), for gather_keys
    cuda::RowGroups groups;  // the routed rows grouped by expert (cuda::group_rows), for many rows
    float *hc1 = nullptr, *hc3 = nullptr;  // experts split by width: this rank's columns of h1/h3 (hc1 also w2's)
    uint8_t* cand_mask;
    int8_t* qc;               // [max_rows][IH][ihd] indexer query codes; scales in qs
    float* qs;
    float* mix_part;          // hc_mix scratch: warp sums
    unsigned* mix_count;      // hc_mix scratch: one counter per row tile (kept zero between launches)
    float* sample_w;          // [sample_chunk][V] sampling weights
    uint32_t* sample_max;     // [max_rows]
    int32_t* sample_out;      // [max_rows] sampled tokens, one per sampling job
  } ws{};
  int64_t score_stride = 0, bscore_stride = 0, mask_stride = 0, logits_rows = 0;
  // The multi-block top-k's candidates (topk_plan.h); val null: DSUF_TOPK=single, one block per row.
  cuda::TopkScratch topk_scratch{};
  int max_rows = 0;  // rows per step: max(max_chunk, max_batch)
  float *X_head = nullptr, *pre_head = nullptr;

  // Per-step inputs: written into pinned host memory, copied up in one transfer (a graph-captured
  // decode step replays that copy from the same pinned buffer).
  struct Staging {
    uint8_t* host = nullptr;
    uint8_t* dev = nullptr;
    size_t cap = 0, used = 0;
    template <typename T>
    T* put(const T* data, size_t count) {  // returns the device address
      used = (used + 15) & ~size_t(15);
      const size_t bytes = count * sizeof(T);
      DSUF_CHECK(used + bytes <= cap, "step staging overflow (", used + bytes, " > ", cap, ")");
      if (bytes) std::memcpy(host + used, data, bytes);
      T* d = reinterpret_cast<T*>(dev + used);
      used += bytes;
      return d;
    }
  } stage;
  float* logits_host = nullptr;    // pinned
  int32_t* tokens_host = nullptr;  // pinned, one per sampling job
  int sample_chunk = 1;            // sampling jobs per launch (rows of ws.sample_w): max_batch

  // Decode steps captured as CUDA graphs, by batch size and whether the logits come back.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    size_t stage_bytes = 0;
  };
  std::map<std::pair<int, bool>, Graph> graphs;
  bool use_graphs = true;
  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
  double last_graph_ms = 0;

  // Component timing (set_component_timing): an event at each boundary, tagged with the part
  // that starts there.
  enum Comp { kEmbed, kEngram, kMhc, kAttention, kIndexer, kMoe, kHead, kEnd, kComps = kEnd };
  bool comp_timing = false;
  std::vector<cudaEvent_t> comp_events;
  std::vector<int> comp_tags;
  double comp_ms[kComps] = {};
  void mark(Comp c) {
    if (!comp_timing) return;
    if (comp_tags.size() == comp_events.size()) {
      cudaEvent_t e;
      DSUF_CUDA(cudaEventCreate(&e));
      comp_events.push_back(e);
    }
    DSUF_CUDA(cudaEventRecord(comp_events[comp_tags.size()], stream));
    comp_tags.push_back(c);
  }

  const void* backend_id = nullptr;  // the CudaBackend these ranks belong to (DevSeqSet::owner)
  Impl(const ModelConfig& c, const LoadedModel* m, std::vector<int32_t> ids, CudaOptions o, int rank)
      : cfg(c), model(m), layout(KvLayout::from_config(c)), cids(std::move(ids)), opt(o),
        part(TpPartition::make(c.text, std::max<int>(1, int(o.devices.size())), rank)) {
    if (!opt.devices.empty()) opt.device = opt.devices[rank];
  }

  template <typename T>
  T* alloc(size_t count) {
    owned.emplace_back(count * sizeof(T));
    return owned.back().as<T>();
  }
  template <typename T>
  const T* upload(const void* host, size_t bytes) {
    owned.emplace_back(bytes);
    DSUF_CUDA(cudaMemcpy(owned.back().p, host, bytes, cudaMemcpyHostToDevice));
    weight_bytes += bytes;
    return owned.back().as<T>();
  }
  const uint16_t* up(const Bf16Mat& m) { return m.data ? upload<uint16_t>(m.data, size_t(m.rows) * m.cols * 2) : nullptr; }
  const float* up(const std::vector<float>& v) { return upload<float>(v.data(), v.size() * 4); }
  DevFp8 up(const Fp8Linear& l) {
    if (!l.w) return {};
    const size_t sb = size_t((l.out + 31) / 32) * ((l.in + 31) / 32);
    return {upload<uint8_t>(l.w, size_t(l.out) * l.in), upload<uint8_t>(l.scale, sb), l.out, l.in};
  }
  const uint8_t** up_ptrs(const std::vector<const uint8_t*>& v) {
    return const_cast<const uint8_t**>(upload<const uint8_t*>(v.data(), v.size() * sizeof(void*)));
  }
  const uint8_t* pin(const uint8_t* host, size_t bytes) {
    void* p = nullptr;
    DSUF_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    std::memcpy(p, host, bytes);
    pinned.push_back(p);
    void* d = nullptr;
    DSUF_CUDA(cudaHostGetDevicePointer(&d, p, 0));
    return static_cast<const uint8_t*>(d);
  }

  // One sequence's slice of a step.
  struct Part {
    ForwardItem* item;
    DevSeq* ds;
    int offset, n;
    bool logits;  // rows of this part get logits (the last row, or all for kAll)
    bool sample;  // the item's last row is in this part and its token is sampled here
  };
  // Device addresses of one step's staged inputs.
  struct Step {
    int rows = 0, seqs = 0;
    int32_t* tok;
    RowMeta* meta;
    SeqMeta* seqtab;
    float *cs_main, *cs_comp, *cs_ent;
    uint8_t *image, *dead;
    std::vector<int64_t*> engram_rows;       // per Engram slot
    std::vector<cuda::EmitJob*> emit;        // per KV source
    std::vector<int> n_emit;
    std::vector<cuda::PendingJob*> pending;  // per KV source
    int32_t* logit_rows;
    int n_logit_rows = 0;
    bool logit_rows_identity = false;  // logit row i is row i, for every row
    std::vector<int> logit_row_of_part;  // first logits row of each part, −1 if none
    bool all_rows_logits = false;        // fixed layout: every row has logits
    bool copy_logits = false;            // some item wants its logits on the host
    cuda::SampleJob* jobs = nullptr;     // the rows sampled (fixed layout: one per row, on or off)
    int n_jobs = 0;
    std::vector<int> sample_job_of_part;  // the job whose token a part gets, −1 if none
    int64_t max_entries = 0;
  };

  void load(uint64_t synthetic_seed);
  void place_host_tables(uint64_t synthetic_seed);
  void place_tensors(uint64_t synthetic_seed);
  void alloc_workspace();
  DevSeq& seq(SequenceState& st);
  void check_host_pools(const SequenceState& st) const;
  Step stage_step(std::vector<Part>& parts, bool fixed_layout);
  void enqueue_step(const Step& st, std::vector<Part>& parts, bool trace);
  Step run_step(std::vector<Part>& parts);
  void finish_step(std::vector<Part>& parts, const Step& st);
  // xin: the normalized rows ws.xn laid out for the linears (collapse_norm wrote them through a sink).
  void attention(int l, const Step& st, const cuda::LinearInput& xin, float* out);
  void compressor_branch(int l, const Step& st, cudaStream_t stream);
  void indexer_xn_part(int l, const Step& st, cudaStream_t stream);
  void indexer_query(int l, const Step& st, const cuda::LinearInput& qin, cudaStream_t stream);
  // Returns whether it left its selection as picks (ws.picks) for gather_keys to sort. after_scores:
  // recorded on `stream` right after the scores kernel (null: none).
  bool indexer_branch(int l, const Step& st, const cuda::LinearInput& qin, bool with_query, cudaStream_t stream,
                      cudaEvent_t after_scores = nullptr);
  // sum_to_next: the sum and expansion left to the next attention site's collapse (enqueue_step).
  void moe(int l, int n, const uint8_t* image, const cuda::LinearInput& xin, const float* expand_mix,
           bool sum_to_next = false);
  // mHC mixes on a second stream (off the critical path: a site's mix is read only by its expansion,
  // after its attention/MoE, and by the next site's collapse); DSUF_HC_FORK=0 keeps them on `stream`.
  // `also`, when set, is enqueued on the mix's stream after the mix (work that nothing reads before
  // the join).
  void hc_mix_fork(const float* fn, const float* base, const float* scale, int n, float* out,
                   const std::function<void(cudaStream_t)>& also = {});
  void hc_mix_join();
  // Launches the site's mix now, or keeps it for run_deferred_mix where DSUF_MIX_FORK defers it.
  void fork_mix(std::function<void()> launch, bool attention_site);
  void run_deferred_mix();
  // Engram layer l's projection of its table rows into ekv, on s: slice `part` of `parts` of wkv's
  // output rows (multiples of 32), the gather and the quantized layout first with slice 0.
  void engram_project(int l, const Step& st, float* emb, float* xq, float* xs, float* ekv, cudaStream_t s,
                      int tile_sm, int part = 0, int parts = 1);
  // The ahead path: slice `part` of layer l's projection on e_side into its own buffers, after what
  // `stream` has so far; the layer's event after the last slice.
  void engram_ahead(int l, const Step& st, int part = 0, int parts = 1);
  // DSUF_ENGRAM=prev: the slices due beside layer `site`'s attention pair (−1: the step's start).
  void engram_ahead_at(int site, const Step& st);
};

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

namespace {
bool on_device_backbone(const std::string& name) {
  return name.rfind("layers.", 0) == 0 || name == "embed.weight" || name == "head.weight" || name == "norm.weight";
}
bool in_host_memory(const std::string& name) { return name.find(".engram.embed.") != std::string::npos; }
int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
// E8M0 code that makes random E4M3 (|q| ≲ 1) or E2M1 (|q| ≲ 3) codes land near 1/sqrt(fan_in).
uint8_t synthetic_scale(int64_t fan_in, bool fp4) {
  const int e = int(std::lround(std::log2(std::sqrt(double(fan_in))))) + (fp4 ? 1 : 0);
  return uint8_t(127 - e);
}

// A rank's device weights live in one allocation (an arena), each tensor at a multiple of this
// offset (cudaMalloc's own alignment). One allocation instead of one per tensor: at 352 experts
// over 2 GPUs a rank holds ~42,000 tensors, each was a cudaMalloc (a driver call that maps pages,
// and a cudaFree at the end), and where the driver rounds a large allocation up to 2 MiB pages,
// each 5.625 MiB FP4 expert matrix took 6 MiB (≈ 7.7 GiB a rank the plan did not count). The plan
// counts the arena to the byte.
constexpr size_t kWeightAlign = 256;
// The Engram ahead path (DSUF_ENGRAM=start|prev) serves steps of at most this many rows (decode
// batches); its buffers, per Engram layer and row: the gathered rows, their layout, wkv's output.
constexpr int64_t kEngramAheadRows = 64;
// DSUF_ENGRAM=start|inline|prev, as Impl::EngramMode's order.
int engram_mode_env() { return env_choice("DSUF_ENGRAM", {"start", "inline", "prev"}); }
bool engram_ahead_wanted() { return engram_mode_env() != 1; }
// One Engram layer's ahead buffers a row, in floats (alloc_workspace allocates them, the plan counts them).
struct EngramAheadRow {
  int64_t emb, xq, xs, ekv;  // the gathered rows, their layout (linear_input's row) and scales, wkv's output
  int64_t total() const { return emb + xq + xs + ekv; }
};
EngramAheadRow engram_ahead_row(const TextConfig& t) {
  const int64_t in = int64_t(t.engram_max_ngram_size - 1) * t.engram_n_heads * t.engram_head_dim;
  const int64_t laid = cuda::interleaved_k(in);
  return {in, laid, laid / 32, (t.hc_mult + 1) * t.hidden_size};
}
int64_t engram_ahead_floats(const TextConfig& t, int64_t max_rows) {
  if (t.engram_layer_ids.empty() || !engram_ahead_wanted()) return 0;
  return int64_t(t.engram_layer_ids.size()) * std::min(max_rows, kEngramAheadRows) * engram_ahead_row(t).total();
}
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Every backbone tensor of the inventory in order, with its synthetic salt (seed + its position
// among the backbone tensors, counted whether or not this rank holds it, so that every rank and
// world size draws the same values). fn(w, ts, off, bytes, full_bytes, host, salt) runs for the
// tensors this rank holds: [off, off + bytes) is its slice of the whole tensor's full_bytes; host:
// an Engram table (pinned host memory).
template <typename Fn>
void for_each_backbone_tensor(const ModelConfig& cfg, const TpPartition& part, uint64_t seed, Fn&& fn) {
  uint64_t salt = seed;
  for (const WeightSpec& w : expected_weights(cfg)) {
    for (const TensorSpec& ts : physical_tensors(w)) {
      if (!on_device_backbone(ts.name)) continue;
      ++salt;
      const size_t full_bytes = size_t(numel(ts.shape)) * dtype_size(ts.dtype);
      const TensorSlice sl = tensor_slice(part, ts.name, ts.shape);
      if (!sl.present) continue;
      const size_t row_bytes = full_bytes / size_t(ts.shape[0]);
      const size_t off = sl.sliced ? size_t(sl.rows.begin) * row_bytes : 0;
      const size_t bytes = sl.sliced ? size_t(sl.rows.size()) * row_bytes : full_bytes;
      fn(w, ts, off, bytes, full_bytes, in_host_memory(ts.name), salt);
    }
  }
}

// Bytes of a rank's weight arena: its device tensors, each aligned.
size_t weight_arena_bytes(const ModelConfig& cfg, const TpPartition& part) {
  size_t total = 0;
  for_each_backbone_tensor(cfg, part, 0, [&](const WeightSpec&, const TensorSpec&, size_t, size_t bytes, size_t,
                                             bool host, uint64_t) {
    if (!host) total += align_up(bytes, kWeightAlign);
  });
  return total;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void CudaBackend::Impl::place_host_tables(uint64_t synthetic_seed) {
  // The Engram tables, in pinned host memory the GPUs read directly: from the checkpoint, or drawn
  // on the host. Once, by rank 0, before the ranks load; the others map rank 0's (place_tensors).
  DSUF_CUDA(cudaSetDevice(opt.device));
  const auto t0 = std::chrono::steady_clock::now();
  size_t total = 0;
  for_each_backbone_tensor(cfg, part, synthetic_seed, [&](const WeightSpec& w, const TensorSpec& ts, size_t,
                                                          size_t bytes, size_t, bool host, uint64_t salt) {
    if (!host) return;
    total += bytes;
    if (model) {
      dev[ts.name] = pin(model->checkpoint->get(ts.name).data, bytes);
      host_ptr[ts.name] = static_cast<const uint8_t*>(pinned.back());
      return;
    }
    void* p = nullptr;
    DSUF_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    pinned.push_back(p);
    host_ptr[ts.name] = static_cast<const uint8_t*>(p);
    const bool is_scale = ts.dtype == DType::F8_E8M0;
    cuda::fill_host_synthetic(static_cast<uint8_t*>(p), bytes, salt,
                              is_scale ? cuda::Fill::kConstant : cuda::Fill::kE4M3, synthetic_scale(w.shape.back(), false));
    void* d = nullptr;
    DSUF_CUDA(cudaHostGetDevicePointer(&d, p, 0));
    dev[ts.name] = static_cast<const uint8_t*>(d);
  });
  if (opt.progress && total)
    std::fprintf(stderr, "Engram tables: %.2f GB (%.2f GiB) pinned in host memory and %s in %.1f s\n", total / 1e9,
                 total / double(1ull << 30), model ? "copied" : "drawn", seconds_since(t0));
}

void CudaBackend::Impl::place_tensors(uint64_t synthetic_seed) {
  // Every backbone tensor by checkpoint name: on the device in one allocation (kWeightAlign), from
  // the checkpoint or drawn on the device; the Engram tables are rank 0's pinned host copies
  // (place_host_tables), mapped. Tensor parallel: each rank takes only its row slice of a split
  // tensor (tp_partition.h) and skips experts other ranks own; a slice gets the values the whole
  // tensor's draw holds there (the fill starts at the slice's first element), so TP and TP=1 hold
  // the same values.
  const auto t0 = std::chrono::steady_clock::now();
  const size_t arena_bytes = weight_arena_bytes(cfg, part);
  uint8_t* arena = alloc<uint8_t>(arena_bytes);
  size_t used = 0, tensors = 0;
  for_each_backbone_tensor(cfg, part, synthetic_seed, [&](const WeightSpec& w, const TensorSpec& ts, size_t off,
                                                          size_t bytes, size_t full_bytes, bool host, uint64_t salt) {
    if (host) {
      if (dev.count(ts.name)) return;  // rank 0: pinned by place_host_tables
      DSUF_CHECK(host_tables, "rank ", part.rank, ": the Engram tables were not placed before the weights");
      void* d = nullptr;
      DSUF_CUDA(cudaHostGetDevicePointer(&d, const_cast<uint8_t*>(host_tables->at(ts.name)), 0));
      dev[ts.name] = static_cast<const uint8_t*>(d);
      return;
    }
    uint8_t* d = arena + used;
    used += align_up(bytes, kWeightAlign);
    DSUF_CHECK(used <= arena_bytes, "weight arena overflow at ", ts.name);
    weight_bytes += bytes;
    ++tensors;
    dev[ts.name] = d;
    if (model) {
      DSUF_CUDA(cudaMemcpy(d, model->checkpoint->get(ts.name).data + off, bytes, cudaMemcpyHostToDevice));
      return;
    }
    const bool is_scale = ts.dtype == DType::F8_E8M0;
    const int64_t fan_in = w.shape.back();
    cuda::Fill mode = cuda::Fill::kBytes;
    uint8_t constant = 0;
    float sigma = 1.0f;
    size_t elem = 1;  // bytes per element of the fill mode
    if (is_scale) {
      mode = cuda::Fill::kConstant, constant = synthetic_scale(fan_in, w.kind == WeightKind::kFp4Linear);
    } else if (ts.dtype == DType::F8_E4M3) {
      mode = cuda::Fill::kE4M3;
    } else if (ts.dtype == DType::BF16) {
      mode = w.init == WeightInit::kNorm ? cuda::Fill::kBf16One : cuda::Fill::kBf16Normal, elem = 2;
      sigma = w.init == WeightInit::kHead ? 2.5f / std::sqrt(float(fan_in))
              : w.init == WeightInit::kEmbed ? 1.0f : 1.0f / std::sqrt(float(fan_in));
    } else if (ts.dtype == DType::F32) {
      mode = cuda::Fill::kF32Normal, elem = 4;
      sigma = w.init == WeightInit::kHcFn ? 0.1f / std::sqrt(float(fan_in)) : w.init == WeightInit::kBias ? 0.01f : 1.0f;
      if (w.init == WeightInit::kHcScale) mode = cuda::Fill::kF32One;
    }
    DSUF_CHECK(off % elem == 0 && full_bytes % elem == 0, ts.name, ": slice not on an element boundary");
    cuda::fill_device_synthetic(d, bytes, salt, mode, constant, sigma, stream, off / elem);
  });
  DSUF_CUDA(cudaStreamSynchronize(stream));
  if (opt.progress)
    std::fprintf(stderr, "rank %d (GPU %d): %s %.2f GB (%.2f GiB, %zu tensors, one allocation) in %.1f s\n", part.rank,
                 opt.device, model ? "uploaded" : "filled", arena_bytes / 1e9, arena_bytes / double(1ull << 30),
                 tensors, seconds_since(t0));
}

void CudaBackend::Impl::load(uint64_t synthetic_seed) {
  DSUF_CUDA(cudaSetDevice(opt.device));
  DSUF_CUDA(cudaStreamCreate(&stream));
  DSUF_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  DSUF_CUDA(cudaEventCreateWithFlags(&ev_fork, cudaEventDisableTiming));
  DSUF_CUDA(cudaEventCreateWithFlags(&ev_join, cudaEventDisableTiming));
  DSUF_CUDA(cudaEventCreateWithFlags(&ev_scores, cudaEventDisableTiming));
  if (const char* v = std::getenv("DSUF_OVERLAP")) overlap = std::string(v) != "0";
  shared_fork = env_choice("DSUF_SHARED_FORK", {"auto", "early", "late"});
  gather_early = !env_picks("DSUF_GATHER", "early", "late");
  sum_in_collapse = !env_picks("DSUF_SUM_EXPAND", "collapse", "kernel");
  gather_reuse = !env_picks("DSUF_GATHER_REUSE", "on", "off");
  rank_gather = !env_picks("DSUF_TOPK_RANK", "gather", "sort");
  head_direct = !env_picks("DSUF_HEAD_INPUT", "direct", "gather");
  wqb_after_scores = !env_picks("DSUF_WQB_WAIT", "scores", "none");
  comp_fork_early = !env_picks("DSUF_COMP_FORK", "early", "late");
  idx_q_main = !env_picks("DSUF_IDX_Q", "main", "side");
  idx_rope_fused = !env_picks("DSUF_IDX_ROPE", "fused", "split");
  mix_mode = MixFork(env_choice("DSUF_MIX_FORK", {"auto", "early", "late", "attn"}));
  if (const char* f = std::getenv("DSUF_HC_FORK"); !f || std::string(f) != "0") {
    DSUF_CUDA(cudaStreamCreate(&mix_side));
    DSUF_CUDA(cudaEventCreateWithFlags(&mix_ev_fork, cudaEventDisableTiming));
    DSUF_CUDA(cudaEventCreateWithFlags(&ev_mix, cudaEventDisableTiming));
  }
  const TextConfig& t = cfg.text;
  DSUF_CHECK(int64_t(cids.size()) >= t.vocab_size, "compressed-id table too short");
  if (!t.engram_layer_ids.empty()) hasher = std::make_unique<EngramHasher>(t, cids.at(t.engram_pad_token_id));
  engram_mode = EngramMode(engram_mode_env());
  if (const char* v = std::getenv("DSUF_ENGRAM_SM")) {
    engram_sm = std::atoi(v);
    DSUF_CHECK(engram_sm >= 0 && engram_sm <= 32, "DSUF_ENGRAM_SM=", v, ": expected 0..32");
  }
  if (const char* v = std::getenv("DSUF_ENGRAM_CHUNKS")) {
    engram_chunks = std::atoi(v);
    DSUF_CHECK(engram_chunks >= 1 && engram_chunks <= 16, "DSUF_ENGRAM_CHUNKS=", v, ": expected 1..16");
  }
  if (hasher && engram_mode != kEngramInline) {
    DSUF_CUDA(cudaStreamCreateWithFlags(&e_side, cudaStreamNonBlocking));
    DSUF_CUDA(cudaEventCreateWithFlags(&e_ev_fork, cudaEventDisableTiming));
  }
  place_tensors(synthetic_seed);
  auto u16 = [&](const std::string& n) -> const uint16_t* {
    auto it = dev.find(n);
    return it == dev.end() ? nullptr : reinterpret_cast<const uint16_t*>(it->second);
  };
  auto f32 = [&](const std::string& n) { return reinterpret_cast<const float*>(dev.at(n)); };
  auto fp8 = [&](const std::string& n, int64_t out, int64_t in) -> DevFp8 {
    auto it = dev.find(n + ".weight");
    if (it == dev.end()) return {};
    return {it->second, dev.at(n + ".scale"), out, in};
  };
  embed = u16("embed.weight"), head = u16("head.weight"), norm = u16("norm.weight");
  const int64_t D = t.hidden_size, H = t.num_attention_heads, hd = t.head_dim, qr = t.q_lora_rank;
  head_fl = cuda::bf16_fma_limits(head, int64_t(part.my_vocab().size()) * D, stream);
  const int64_t G = t.o_groups, ol = t.o_lora_rank, F = t.moe_intermediate_size;
  // This rank's rows of the split products (all of them at world size 1).
  const int64_t Hr = part.my_heads().size(), Gr = part.my_groups().size(), Dr = part.my_hidden().size();
  int fallback_expert = 0;  // experts of other ranks point here: their rows are computed, then dropped
  while (!part.owns_expert(fallback_expert)) ++fallback_expert;
  zg_split = cuda::col_split(part.group_cols()), hidden_split = cuda::col_split(part.hidden);
  vocab_split = cuda::col_split(part.vocab);
  if (part.world > 1 && part.width_experts()) ffn_split = cuda::col_split(part.ffn);
  // The experts' layout: tiles by default (k_fp4_imma<…, true>), row-major where the model needs it —
  // experts split by width (the tiles hold 16 whole rows) or unquantized activations (no byte planes).
  const bool tileable = !(part.world > 1 && part.width_experts()) && opt.numerics.act_quant;
  const cuda::Fp4TiledWish wish = cuda::fp4_tiled_wanted();
  DSUF_CHECK(tileable || wish != cuda::Fp4TiledWish::kRequired,
             "DSUF_FP4=tiled: the experts are split by width (docs/tp.md; set DSUF_TP_EXPERTS=ep) or the "
             "activations are not quantized; unset DSUF_FP4 to let the model pick its layout");
  experts_tiled = tileable && wish != cuda::Fp4TiledWish::kNo;
  uint8_t* tile_scratch = nullptr;  // one expert matrix, for the in-place re-layout
  for (const LayerPlan& lp : cfg.layers) {
    const std::string p = "layers." + std::to_string(lp.layer) + ".";
    DevLayer d{};
    d.hca_fn = f32(p + "hc_attn_fn"), d.hca_base = f32(p + "hc_attn_base"), d.hca_scale = f32(p + "hc_attn_scale");
    d.hcf_fn = f32(p + "hc_ffn_fn"), d.hcf_base = f32(p + "hc_ffn_base"), d.hcf_scale = f32(p + "hc_ffn_scale");
    d.attn_norm = u16(p + "attn_norm.weight"), d.ffn_norm = u16(p + "ffn_norm.weight");
    d.q_norm = u16(p + "attn.q_norm.weight"), d.kv_norm = u16(p + "attn.kv_norm.weight");
    d.sink = f32(p + "attn.attn_sink");
    d.wq_a = fp8(p + "attn.wq_a", qr, D), d.wq_b = fp8(p + "attn.wq_b", Hr * hd, qr), d.wkv = fp8(p + "attn.wkv", hd, D);
    d.wo_a = fp8(p + "attn.wo_a", Gr * ol, H * hd / G), d.wo_b = fp8(p + "attn.wo_b", Dr, G * ol);
    d.comp_wkv = u16(p + "attn.compressor.wkv.weight"), d.comp_wgate = u16(p + "attn.compressor.wgate.weight");
    d.comp_norm = u16(p + "attn.compressor.norm.weight");
    d.idx_wk = u16(p + "attn.indexer.wk.weight"), d.idx_k_norm = u16(p + "attn.indexer.k_norm.weight");
    d.idx_wproj = u16(p + "attn.indexer.weights_proj.weight");
    d.idx_wq_b = fp8(p + "attn.indexer.wq_b", int64_t(t.index_n_heads) * t.index_head_dim, qr);
    d.gate = u16(p + "ffn.gate.weight"), d.bias = f32(p + "ffn.gate.bias"), d.bias_vl = f32(p + "ffn.gate.bias_vl");
    std::vector<const uint8_t*> ptr[6];
    for (int e = 0; e < t.n_routed_experts; ++e) {
      const int own = part.owns_expert(e) ? e : fallback_expert;
      const std::string ep = p + "ffn.experts." + std::to_string(own) + ".";
      const char* names[3] = {"w1", "w2", "w3"};
      for (int k = 0; k < 3; ++k) {
        ptr[2 * k].push_back(dev.at(ep + names[k] + ".weight"));
        ptr[2 * k + 1].push_back(dev.at(ep + names[k] + ".scale"));
      }
    }
    d.experts = {up_ptrs(ptr[0]), up_ptrs(ptr[1]), up_ptrs(ptr[2]), up_ptrs(ptr[3]), up_ptrs(ptr[4]), up_ptrs(ptr[5])};
    if (experts_tiled) {  // w1, w3: [F, D/2]; w2: [D, F/2] (each distinct tensor once: stand-ins repeat)
      if (!tile_scratch) DSUF_CUDA(cudaMalloc(&tile_scratch, size_t(F * D / 2)));
      for (int k : {0, 2, 4}) {
        const int64_t out = k == 2 ? D : F, in = k == 2 ? F : D;
        std::vector<const uint8_t*> once(ptr[k]);
        std::sort(once.begin(), once.end());
        once.erase(std::unique(once.begin(), once.end()), once.end());
        for (const uint8_t* w : once) cuda::fp4_tile_in_place(const_cast<uint8_t*>(w), out, in, tile_scratch, nullptr);
      }
    }
    d.sw1 = fp8(p + "ffn.shared_experts.w1", F, D), d.sw2 = fp8(p + "ffn.shared_experts.w2", D, F);
    d.sw3 = fp8(p + "ffn.shared_experts.w3", F, D);
    if (lp.engram_slot >= 0) {
      const int64_t in = int64_t(t.engram_max_ngram_size - 1) * t.engram_n_heads * t.engram_head_dim;
      d.e_table = dev.at(p + "engram.embed.weight"), d.e_scale = dev.at(p + "engram.embed.scale");
      d.e_wkv = fp8(p + "engram.wkv", (t.hc_mult + 1) * D, in);
      d.e_q = u16(p + "engram.q_weight"), d.e_k = u16(p + "engram.k_weight");
    }
    layers.push_back(d);
  }
  if (tile_scratch) {
    DSUF_CUDA(cudaDeviceSynchronize());
    DSUF_CUDA(cudaFree(tile_scratch));
  }
  // RoPE frequencies: the same FP32 values the CPU reference computes (model/rope.h).
  half = t.qk_rope_head_dim / 2;
  inv_main = rope_inv_freq(t.qk_rope_head_dim, t.rope_theta, nullptr);
  inv_comp = rope_inv_freq(t.qk_rope_head_dim, t.compress_rope_theta, &t.rope_scaling);
  alloc_workspace();
}

namespace {
// The multi-block top-k's smallest chunk: topk::kDefaultChunk, or DSUF_TOPK_CHUNK (≥ 256).
int64_t topk_min_chunk() {
  const char* c = std::getenv("DSUF_TOPK_CHUNK");
  const int64_t v = c ? std::atoll(c) : topk::kDefaultChunk;
  DSUF_CHECK(v >= 256, "DSUF_TOPK_CHUNK=", c ? c : "", ": expected >= 256");
  return v;
}
// Every workspace buffer, in floats (or the element counts named), for one max_chunk forward. The
// one list serves the allocation and the memory plan.
struct WorkspaceSizes {
  // qi: also the indexer query codes (qi bytes) and their scales (qi/32 floats)
  // topk: candidate slots of the multi-block top-k (a float and an int32 each)
  int64_t X, pre, mix, vecD, tmp, q_lat, q, kvw, ag, o, zg, qi, wts, scores, bscores, sel, cand, cand_mask,
      router, ids, h, ye, hs, emb, ekv, logits, keys, att, sample_w, sample, aq, aq_shared, mix_part, topk;
  int64_t row_groups;  // int32: order (ids), groups (3·ids), the count (1)
  int64_t aqp;  // bytes of each of the two byte-plane buffers of the FP4 linears' inputs
  int64_t score_stride, bscore_stride;
  size_t bytes() const {
    const int64_t floats = X + pre + 2 * mix + 3 * vecD + tmp + q_lat + q + kvw + ag + o + zg + qi +
                           wts + scores + bscores + router + ids /*rw*/ + 2 * h + ye + vecD /*ys*/ + 2 * hs + emb + ekv +
                           logits + keys + att + sample_w + 2 * (aq + aq / 32) + aq_shared + aq_shared / 32 + qi / 32 +
                           mix_part + row_groups;
    return size_t(floats) * 4 + size_t(sel + cand + ids + 2 * sample + sample /*mix counters*/) * 4 +
           size_t(cand_mask + qi) + size_t(topk + sel /*picks*/) * 8 + size_t(2 * aqp);
  }
};
// N rows per step; S sampling jobs per launch (max_batch).
WorkspaceSizes workspace_sizes(const TextConfig& t, int64_t N, int64_t max_context, int64_t R, int64_t S) {
  const int64_t D = t.hidden_size, hc = t.hc_mult, H = t.num_attention_heads, hd = t.head_dim;
  const int64_t qr = t.q_lora_rank, G = t.o_groups, ol = t.o_lora_rank, F = t.moe_intermediate_size;
  const int64_t E = t.n_routed_experts, K = t.num_experts_per_tok, IH = t.index_n_heads, ihd = t.index_head_dim;
  const int64_t ehd = t.engram_head_dim, half = t.qk_rope_head_dim / 2;
  WorkspaceSizes w{};
  w.score_stride = max_context;
  w.bscore_stride = (max_context + t.candidate_block_size - 1) / t.candidate_block_size;
  w.X = N * hc * D, w.pre = N * hc, w.mix = N * cuda::hc_mix_stride(int(hc)), w.vecD = N * D;
  w.mix_part = cuda::hc_mix_part_floats(int(N), int(hc));
  w.tmp = N * std::max(qr, hd), w.q_lat = N * qr, w.q = N * H * hd;
  w.kvw = N * hd, w.ag = N * 2 * hd, w.o = N * H * hd, w.zg = N * G * ol;
  w.qi = N * IH * ihd, w.wts = N * IH, w.scores = N * w.score_stride, w.bscores = N * w.bscore_stride;
  w.sel = N * t.index_topk, w.cand = N * t.candidate_topk_blocks, w.cand_mask = N * w.bscore_stride;
  // The two top-k launches of a layer (block scores, then scores) share the candidates.
  const int64_t min_chunk = topk_min_chunk();
  w.topk = std::max(topk::scratch_slots(N, w.score_stride, t.index_topk, min_chunk),
                    topk::scratch_slots(N, w.bscore_stride, t.candidate_topk_blocks, min_chunk));
  w.router = N * E, w.ids = N * K, w.h = N * K * F, w.ye = N * K * D, w.hs = N * F;
  w.row_groups = 4 * w.ids + 1;
  w.emb = N * std::max<int64_t>(R * ehd, 1), w.ekv = N * (hc + 1) * D, w.logits = N * t.vocab_size;
  w.keys = N * (t.sliding_window + t.index_topk) * hd;
  w.att = N * H * (t.sliding_window + t.index_topk);
  w.sample_w = S * t.vocab_size, w.sample = N;
  // The largest linear input, laid out (cuda::linear_input); the shared expert's has its own.
  const auto lin = [](int64_t k) { return cuda::interleaved_k(k); };
  w.aq_shared = N * lin(F);
  w.aq = N * std::max({lin(D), lin(qr), G * lin(H / G * hd), lin(G * ol), K * lin(F), lin(std::max<int64_t>(R * ehd, 32))});
  w.aqp = std::max(N * cuda::interleaved_planes(D), N * K * cuda::interleaved_planes(F));
  return w;
}
// Scratch of the tensor-parallel exchanges, in floats (none at world size 1): the packed send block
// of a column gather and the receive buffer of every rank's blocks or expert rows.
// Experts split by width also need this rank's columns of h1/h3 and of w2's output (`compact`: two
// buffers of N·K rows × its widest share), and gather N·K-row blocks.
struct TpScratch {
  int64_t send = 0, recv = 0, compact = 0;
};
TpScratch tp_scratch(const TextConfig& t, const TpPartition& p, int64_t N) {
  if (p.world == 1) return {};
  int64_t cmax = 0;
  for (const auto* ranges : {&p.hidden, &p.vocab})
    for (const RowRange& r : *ranges) cmax = std::max(cmax, r.size());
  for (const RowRange& r : p.group_cols()) cmax = std::max(cmax, r.size());
  const int64_t K = t.num_experts_per_tok, moe = N * K * t.hidden_size;
  int64_t compact = 0;
  if (p.width_experts()) {  // world > 1 here
    int64_t wmax = 0;
    for (const auto* ranges : {&p.hidden, &p.ffn})
      for (const RowRange& r : *ranges) wmax = std::max(wmax, r.size());
    cmax = std::max(cmax, K * wmax);
    compact = 2 * N * K * wmax;
  }
  return {N * cmax, p.world * std::max(N * cmax, moe), compact};
}
}  // namespace

std::string CudaMemoryPlan::describe() const {
  auto gib = [](size_t b) { return double(b) / (1ull << 30); };
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "weights %.2f GiB + sequences %.2f GiB (%.3f GiB each) + workspace %.2f GiB = %.2f GiB on the device; "
                "Engram tables %.2f GiB pinned in host memory",
                gib(weights), gib(sequences), gib(per_sequence), gib(workspace), gib(total()), gib(host_pinned));
  return buf;
}

CudaMemoryPlan plan_cuda_memory(const LoadedModel& model, const CudaOptions& opt, int rank) {
  return plan_cuda_memory(model.config, opt, rank);
}

CudaMemoryPlan plan_cuda_memory(const ModelConfig& cfg, const CudaOptions& opt, int rank) {
  const TextConfig& t = cfg.text;
  const TpPartition part = TpPartition::make(t, std::max<int>(1, int(opt.devices.size())), rank);
  CudaMemoryPlan p;
  // The weight arena (place_tensors) to the byte; the Engram tables once, shared by the ranks.
  for_each_backbone_tensor(cfg, part, 0, [&](const WeightSpec&, const TensorSpec&, size_t, size_t bytes, size_t,
                                             bool host, uint64_t) {
    if (host) p.host_pinned += bytes;
    else p.weights += align_up(bytes, kWeightAlign);
  });
  const KvLayout L = KvLayout::from_config(cfg);
  p.per_sequence = size_t(L.num_layers) * L.window * L.window_entry_bytes;
  for (size_t k = 0; k < L.kv_sources.size(); ++k)
    p.per_sequence += size_t(opt.max_context) * (L.ckv_entry_bytes + L.ikey_entry_bytes) +
                      2 * size_t(L.source_ratio[k]) * 2 * L.head_dim * 4;
  p.sequences = p.per_sequence * size_t(opt.max_batch);
  const int64_t R = t.engram_layer_ids.empty() ? 0 : int64_t(t.engram_max_ngram_size - 1) * t.engram_n_heads;
  const WorkspaceSizes w =
      workspace_sizes(t, std::max(opt.max_chunk, opt.max_batch), opt.max_context, R, std::max(opt.max_batch, 1));
  const TpScratch tps = tp_scratch(t, part, std::max(opt.max_chunk, opt.max_batch));
  p.workspace = w.bytes() + size_t(w.X + w.pre) * 4 + size_t(tps.send + tps.recv + tps.compact) * 4 +  // + the head's gathered rows
                size_t(engram_ahead_floats(t, std::max(opt.max_chunk, opt.max_batch))) * 4;
  return p;
}

void CudaBackend::Impl::alloc_workspace() {
  const TextConfig& t = cfg.text;
  const int64_t R = hasher ? hasher->rows_per_token() : 0;
  max_rows = std::max(opt.max_chunk, opt.max_batch);
  sample_chunk = std::max(opt.max_batch, 1);
  const WorkspaceSizes w = workspace_sizes(t, max_rows, opt.max_context, R, sample_chunk);
  X_head = alloc<float>(w.X), pre_head = alloc<float>(w.pre);
  ws.X = alloc<float>(w.X), ws.pre = alloc<float>(w.pre), ws.mix_a = alloc<float>(w.mix), ws.mix_f = alloc<float>(w.mix);
  ws.u = alloc<float>(w.vecD), ws.xn = alloc<float>(w.vecD), ws.y = alloc<float>(w.vecD);
  ws.tmp = alloc<float>(w.tmp), ws.q_lat = alloc<float>(w.q_lat), ws.q = alloc<float>(w.q), ws.kvw = alloc<float>(w.kvw);
  ws.ag = alloc<float>(w.ag), ws.o = alloc<float>(w.o), ws.zg = alloc<float>(w.zg);
  ws.qi = alloc<float>(w.qi), ws.wts = alloc<float>(w.wts);
  ws.qc = alloc<int8_t>(w.qi), ws.qs = alloc<float>(w.qi / 32);
  score_stride = w.score_stride, bscore_stride = w.bscore_stride, mask_stride = w.bscore_stride;
  ws.scores = alloc<float>(w.scores), ws.bscores = alloc<float>(w.bscores);
  ws.sel = alloc<int32_t>(w.sel), ws.picks = alloc<uint64_t>(w.sel);
  ws.cand = alloc<int32_t>(w.cand), ws.cand_mask = alloc<uint8_t>(w.cand_mask);
  // DSUF_TOPK=single: the single-block top-k for every row (the path before the multi-block one).
  // DSUF_TOPK_CHUNK=n: the multi-block top-k's smallest chunk (default topk::kDefaultChunk).
  const char* topk_mode = std::getenv("DSUF_TOPK");
  DSUF_CHECK(!topk_mode || std::string(topk_mode) == "single" || std::string(topk_mode) == "multi",
             "DSUF_TOPK=", topk_mode, ": expected single or multi");
  if (w.topk > 0 && !(topk_mode && std::string(topk_mode) == "single")) {
    topk_scratch.min_chunk = topk_min_chunk();
    topk_scratch.slots = w.topk, topk_scratch.val = alloc<float>(w.topk), topk_scratch.idx = alloc<int32_t>(w.topk);
  }
  ws.router = alloc<float>(w.router), ws.ids = alloc<int32_t>(w.ids), ws.rw = alloc<float>(w.ids);
  ws.groups.order = alloc<int32_t>(w.row_groups);
  ws.groups.groups = ws.groups.order + w.ids, ws.groups.n_groups = ws.groups.groups + 3 * w.ids;
  if (const char* v = std::getenv("DSUF_MOE_GROUP_ROWS")) group_rows_per_expert = std::atoll(v);
  ws.h1 = alloc<float>(w.h), ws.h3 = alloc<float>(w.h), ws.ye = alloc<float>(w.ye), ws.ys = alloc<float>(w.vecD);
  ws.keys = alloc<float>(w.keys);
  ws.mix_part = alloc<float>(w.mix_part), ws.mix_count = alloc<unsigned>(w.sample);
  DSUF_CUDA(cudaMemset(ws.mix_count, 0, size_t(w.sample) * sizeof(unsigned)));
  ws.att = alloc<float>(w.att);
  cuda::att_trace_init();  // DSUF_ATT_TRACE (a diagnostic), before any capture
  const TpScratch tps = tp_scratch(t, part, max_rows);
  if (tps.recv) tp_send = alloc<float>(tps.send), tp_recv = alloc<float>(tps.recv), tp_send_floats = tps.send;
  if (tps.compact) ws.hc1 = alloc<float>(tps.compact / 2), ws.hc3 = alloc<float>(tps.compact / 2);
  ws.h1s = alloc<float>(w.hs), ws.h3s = alloc<float>(w.hs), ws.emb = alloc<float>(w.emb), ws.ekv = alloc<float>(w.ekv);
  for (int i = 0; i < 3; ++i) {
    const int64_t floats = i < 2 ? w.aq : w.aq_shared;
    ws.xq[i] = alloc<float>(floats), ws.xs[i] = alloc<float>(floats / 32);
  }
  for (int i = 0; i < 2; ++i) ws.xp[i] = alloc<uint8_t>(w.aqp);
  if (e_side) {  // the Engram ahead path's buffers (DSUF_ENGRAM), for steps of up to e_rows rows
    e_rows = int(std::min<int64_t>(max_rows, kEngramAheadRows));
    const EngramAheadRow row = engram_ahead_row(t);
    e_ahead.resize(size_t(hasher->num_slots()));
    for (EngramAhead& e : e_ahead) {
      e.emb = alloc<float>(e_rows * row.emb), e.xq = alloc<float>(e_rows * row.xq), e.xs = alloc<float>(e_rows * row.xs);
      e.ekv = alloc<float>(e_rows * row.ekv);
      DSUF_CUDA(cudaEventCreateWithFlags(&e.done, cudaEventDisableTiming));
    }
  }
  logits_rows = max_rows;
  ws.logits = alloc<float>(w.logits);
  DSUF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&logits_host), size_t(w.logits) * 4, cudaHostAllocDefault));
  pinned.push_back(logits_host);
  ws.sample_w = alloc<float>(w.sample_w), ws.sample_max = alloc<uint32_t>(w.sample);
  ws.sample_out = alloc<int32_t>(w.sample);
  DSUF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&tokens_host), size_t(w.sample) * 4, cudaHostAllocDefault));
  pinned.push_back(tokens_host);
  // Staging: every per-step list, bounded by max_rows rows (and as many sequences).
  const size_t Rn = size_t(max_rows), S = layout.kv_sources.size();
  const size_t slots = hasher ? size_t(hasher->num_slots()) : 0, Rr = hasher ? size_t(hasher->rows_per_token()) : 0;
  stage.cap = 64 * 16 + Rn * (4 + sizeof(RowMeta) + sizeof(SeqMeta) + 2 + 4 + 2 * 2 * half * 4 + slots * Rr * 8 +
                              sizeof(cuda::SampleJob)) +
              S * (2 * Rn) * (sizeof(cuda::EmitJob) + sizeof(cuda::PendingJob) + 2 * half * 4) + 2 * half * 4;
  DSUF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&stage.host), stage.cap, cudaHostAllocDefault));
  pinned.push_back(stage.host);
  stage.dev = alloc<uint8_t>(stage.cap);
}

void CudaBackend::Impl::check_host_pools(const SequenceState& st) const {
  const char* why = "sequence state: its host pools do not describe its position (a copy of a device "
                    "state taken without Backend::download?)";
  DSUF_CHECK(int(st.window.size()) == layout.num_layers, why);
  for (const auto& w : st.window) DSUF_CHECK(w.size() == size_t(layout.window) * layout.window_entry_bytes, why);
  const size_t S = layout.kv_sources.size();
  DSUF_CHECK(st.ckv.size() == S && st.ikey.size() == S && st.pending.size() == S, why);
  for (size_t k = 0; k < S; ++k) {
    const int64_t ratio = layout.source_ratio[k], entries = st.pos / ratio;
    DSUF_CHECK(st.ckv[k].size() == size_t(entries) * layout.ckv_entry_bytes, why, " (compressed KV of source ", k, ")");
    DSUF_CHECK(st.ikey[k].size() == size_t(entries) * layout.ikey_entry_bytes, why, " (indexer keys of source ", k, ")");
    DSUF_CHECK(st.pending[k].size() == size_t(st.pos % ratio) * 2 * layout.head_dim, why, " (compressor state of source ", k, ")");
  }
  DSUF_CHECK(int(st.engram_history.size()) == layout.history, why);
}

DevSeq& CudaBackend::Impl::seq(SequenceState& st) {
  if (st.device) {
    const auto* held = static_cast<const DevSeqSet*>(st.device.get());
    if (held->owner != backend_id || held->pos != st.pos) st.device.reset();  // stale: host pools are the truth
  }
  if (!st.device) {
    // A state that already holds tokens (deserialized, restored from the cache, or one whose stale
    // handle was dropped above) is uploaded from its host pools, which must describe exactly pos
    // tokens: a copy of a device state taken without Backend::download fails here instead of
    // running on stale bytes.
    if (st.pos > 0) check_host_pools(st);
    auto set = std::make_shared<DevSeqSet>();
    set->owner = backend_id;
    set->pos = st.pos;
    st.device = set;
  }
  DevSeqSet& set = *static_cast<DevSeqSet*>(st.device.get());
  if (set.ranks.size() < size_t(part.world)) set.ranks.resize(part.world);
  if (set.ranks[part.rank]) return *set.ranks[part.rank];
  DSUF_CUDA(cudaSetDevice(opt.device));
  const TextConfig& t = cfg.text;
  auto ds = std::make_unique<DevSeq>();
  const size_t ring_bytes = size_t(layout.num_layers) * layout.window * layout.window_entry_bytes;
  ds->window = DevMem(ring_bytes);
  const size_t S = layout.kv_sources.size();
  ds->cur.assign(S, 0);
  ds->entries.assign(S, 0);
  for (size_t k = 0; k < S; ++k) {
    ds->ckv.emplace_back(size_t(opt.max_context) * layout.ckv_entry_bytes);
    ds->ikey.emplace_back(size_t(opt.max_context) * layout.ikey_entry_bytes);
    for (auto& pb : ds->pending) pb.emplace_back(size_t(layout.source_ratio[k]) * 2 * t.head_dim * 4);
  }
  if (st.pos > 0) {
    for (int l = 0; l < layout.num_layers; ++l)
      DSUF_CUDA(cudaMemcpy(ds->window.as<uint8_t>() + size_t(l) * layout.window * layout.window_entry_bytes,
                           st.window[l].data(), st.window[l].size(), cudaMemcpyHostToDevice));
    for (size_t k = 0; k < S; ++k) {
      ds->entries[k] = st.entries(layout, int(k));
      DSUF_CHECK(ds->entries[k] <= opt.max_context, "sequence longer than max_context");
      DSUF_CUDA(cudaMemcpy(ds->ckv[k].p, st.ckv[k].data(), st.ckv[k].size(), cudaMemcpyHostToDevice));
      DSUF_CUDA(cudaMemcpy(ds->ikey[k].p, st.ikey[k].data(), st.ikey[k].size(), cudaMemcpyHostToDevice));
      if (!st.pending[k].empty())
        DSUF_CUDA(cudaMemcpy(ds->pending[0][k].p, st.pending[k].data(), st.pending[k].size() * 4, cudaMemcpyHostToDevice));
    }
  } else {
    DSUF_CUDA(cudaMemset(ds->window.p, 0, ring_bytes));
  }
  set.ranks[part.rank] = std::move(ds);
  return *set.ranks[part.rank];
}

// Host side of a step: rows, sequences, RoPE tables, Engram rows and the compressor's job lists,
// all staged for one upload. With fixed_layout (graph-captured decode) every list has the same
// length for a given number of rows, so the captured kernels' arguments stay valid.
CudaBackend::Impl::Step CudaBackend::Impl::stage_step(std::vector<Part>& parts, bool fixed_layout) {
  const ModelConfig& c = cfg;
  const TextConfig& t = c.text;
  const int W = t.sliding_window;
  Step st;
  stage.used = 0;
  std::vector<int32_t> tok;
  std::vector<RowMeta> meta;
  std::vector<SeqMeta> seqs;
  std::vector<uint8_t> image;
  for (Part& p : parts) {
    SequenceState& s = *p.item->state;
    SeqMeta sm{};
    sm.window = p.ds->window.as<uint8_t>();
    for (size_t k = 0; k < layout.kv_sources.size(); ++k) sm.ckv[k] = p.ds->ckv[k].as<uint8_t>(), sm.ikey[k] = p.ds->ikey[k].as<uint8_t>();
    sm.P = s.pos;
    sm.row0 = int32_t(tok.size());
    sm.n = p.n;
    for (int j = 0; j < p.n; ++j) {
      const int32_t id = p.item->tokens[p.offset + j];
      if (id < 0 || id >= t.vocab_size) fail("token id ", id, " is outside the vocabulary [0, ", t.vocab_size, ")");
      tok.push_back(id);
      meta.push_back({s.pos + j, int32_t(seqs.size()), j >= p.n - W ? 1 : 0});
      image.push_back(id == c.image_token_id);
    }
    st.max_entries = std::max<int64_t>(st.max_entries, s.pos + p.n);
    seqs.push_back(sm);
  }
  const int R = int(tok.size());
  st.rows = R;
  st.seqs = int(seqs.size());
  st.tok = stage.put(tok.data(), R);
  st.meta = stage.put(meta.data(), R);
  st.seqtab = stage.put(seqs.data(), seqs.size());
  st.image = stage.put(image.data(), R);
  std::vector<float> csm(size_t(R) * 2 * half), csc(size_t(R) * 2 * half);
  for (int i = 0; i < R; ++i) {
    rope_cos_sin(meta[i].pos, inv_main, csm.data() + size_t(i) * 2 * half);
    rope_cos_sin(meta[i].pos, inv_comp, csc.data() + size_t(i) * 2 * half);
  }
  st.cs_main = stage.put(csm.data(), csm.size());
  st.cs_comp = stage.put(csc.data(), csc.size());
  // Engram: row ids per token per Engram layer (hashing is host work on token ids).
  if (hasher) {
    const int Rr = hasher->rows_per_token(), ctx_len = t.engram_max_ngram_size;
    std::vector<uint8_t> dead(R);
    std::vector<int32_t> cid(R), ctx(ctx_len);
    for (int i = 0; i < R; ++i) cid[i] = image[i] ? -1 : cids[tok[i]], dead[i] = image[i];
    st.dead = stage.put(dead.data(), R);
    for (int slot = 0; slot < hasher->num_slots(); ++slot) {
      std::vector<int64_t> rows(size_t(R) * Rr, 0);
      for (size_t q = 0; q < parts.size(); ++q) {
        const SequenceState& s = *parts[q].item->state;
        const int row0 = seqs[q].row0;
        for (int j = 0; j < parts[q].n; ++j) {
          if (cid[row0 + j] < 0) continue;
          for (int b = 0; b < ctx_len; ++b) {
            const int src = j - b, h = -src - 1;
            ctx[b] = src >= 0 ? cid[row0 + src] : (h < int(s.engram_history.size()) ? s.engram_history[h] : -1);
          }
          hasher->row_ids(slot, ctx.data(), rows.data() + size_t(row0 + j) * Rr);
        }
      }
      st.engram_rows.push_back(stage.put(rows.data(), rows.size()));
    }
  }
  // Compressor jobs per KV source: the entries this step closes, and the partial groups to keep.
  std::vector<float> ecs;
  std::vector<std::vector<cuda::EmitJob>> emit(layout.kv_sources.size());
  std::vector<std::vector<cuda::PendingJob>> pend(layout.kv_sources.size());
  for (size_t k = 0; k < layout.kv_sources.size(); ++k) {
    const int ratio = layout.source_ratio[k];
    for (size_t q = 0; q < parts.size(); ++q) {
      DevSeq& ds = *parts[q].ds;
      const int64_t P = seqs[q].P, before = ds.entries[k], after = (P + parts[q].n) / ratio;
      DSUF_CHECK(before == P / ratio, "compressed-KV bookkeeping out of step");
      if (after > opt.max_context)
        fail("sequence of ", P + parts[q].n, " tokens exceeds the CUDA backend's max_context ", opt.max_context);
      const int pending_n = int(P % ratio);
      const float* pin = ds.pending[ds.cur[k]][k].as<float>();
      for (int64_t w = before; w < after; ++w) {
        // A fixed layout gives each (source, sequence) one cos/sin row: a decode row closes at most one entry.
        const size_t row = fixed_layout ? k * parts.size() + q : ecs.size() / (2 * half);
        ecs.resize(std::max(ecs.size(), (row + 1) * 2 * half));
        emit[k].push_back({w, pin, int32_t(q), pending_n, int32_t(row), 0});
        rope_cos_sin(w * ratio, inv_comp, ecs.data() + row * 2 * half);
      }
      if (fixed_layout && after == before) emit[k].push_back({-1, pin, int32_t(q), 0, 0, 0});
      pend[k].push_back({pin, ds.pending[1 - ds.cur[k]][k].as<float>(), int32_t(q), pending_n,
                         int32_t((P + parts[q].n) % ratio), 0});
    }
  }
  if (fixed_layout) ecs.resize(std::max<size_t>(1, layout.kv_sources.size() * parts.size()) * 2 * half);
  st.cs_ent = stage.put(ecs.data(), std::max<size_t>(ecs.size(), 2 * half));
  for (size_t k = 0; k < layout.kv_sources.size(); ++k) {
    st.emit.push_back(stage.put(emit[k].data(), emit[k].size()));
    st.n_emit.push_back(int(emit[k].size()));
    st.pending.push_back(stage.put(pend[k].data(), pend[k].size()));
  }
  // Rows that get logits (with a fixed layout: every row, whoever asked).
  std::vector<int32_t> lrows;
  st.all_rows_logits = fixed_layout;
  for (size_t q = 0; q < parts.size(); ++q) {
    st.logit_row_of_part.push_back(parts[q].logits || fixed_layout ? int(lrows.size()) : -1);
    if (fixed_layout) {
      for (int j = 0; j < parts[q].n; ++j) lrows.push_back(seqs[q].row0 + j);
      continue;
    }
    if (!parts[q].logits) continue;
    const bool all = parts[q].item->want == ForwardItem::Logits::kAll;
    for (int j = all ? 0 : parts[q].n - 1; j < parts[q].n; ++j) lrows.push_back(seqs[q].row0 + j);
  }
  st.n_logit_rows = int(lrows.size());
  st.logit_rows_identity = st.n_logit_rows == st.rows;
  for (int i = 0; i < st.n_logit_rows && st.logit_rows_identity; ++i) st.logit_rows_identity = lrows[size_t(i)] == i;
  st.logit_rows = stage.put(lrows.data(), lrows.size());
  // Sampling jobs: one per sampled part (its last row). A fixed layout has one job per logits row,
  // off where nothing is sampled, so the graph's launches do not depend on who samples.
  std::vector<cuda::SampleJob> jobs;
  if (fixed_layout)
    for (size_t j = 0; j < lrows.size(); ++j) jobs.push_back({.params = {}, .draw = 0, .row = int32_t(j), .on = 0});
  for (size_t q = 0; q < parts.size(); ++q) {
    const Part& p = parts[q];
    st.copy_logits |= p.logits && p.item->logits != nullptr;
    int job = -1;
    if (p.sample) {
      const bool rows_of_all = st.all_rows_logits || p.item->want == ForwardItem::Logits::kAll;
      const int row = st.logit_row_of_part[q] + (rows_of_all ? p.n - 1 : 0);
      DSUF_CHECK(st.logit_row_of_part[q] >= 0 && row < int(lrows.size()), "sampled row without logits");
      const cuda::SampleJob sj{.params = p.item->sampling, .draw = p.item->draw, .row = int32_t(row), .on = 1};
      job = fixed_layout ? row : int(jobs.size());
      if (fixed_layout)
        jobs[row] = sj;
      else
        jobs.push_back(sj);
    }
    st.sample_job_of_part.push_back(job);
  }
  st.n_jobs = int(jobs.size());
  st.jobs = stage.put(jobs.data(), jobs.size());
  if (fixed_layout) st.max_entries = opt.max_context;
  return st;
}

// The compressor: this layer's new compressed entries, from xn alone (the collapse's normalized
// rows), on `stream`.
void CudaBackend::Impl::compressor_branch(int l, const Step& st, cudaStream_t stream) {
  const TextConfig& t = cfg.text;
  const LayerPlan& lp = cfg.layers[l];
  if (!lp.owns_compressor) return;
  const DevLayer& d = layers[l];
  const int n = st.rows;
  const int64_t D = t.hidden_size, hd = t.head_dim;
  const int slot = layout.source_slot[l];
  const int ratio = lp.ratio;
  cuda::bf16_linear(d.comp_wkv, hd, D, ws.xn, D, n, ws.ag, 2 * hd, false, stream);
  if (ratio > 1) cuda::bf16_linear(d.comp_wgate, hd, D, ws.xn, D, n, ws.ag + hd, 2 * hd, false, stream);
  cuda::CompressArgs ca{.ag = ws.ag, .jobs = st.emit[slot], .n_jobs = st.n_emit[slot], .seqs = st.seqtab,
                        .src = slot, .ratio = ratio, .hd = hd, .ihd = t.index_head_dim, .norm = d.comp_norm,
                        .wk = d.idx_wk, .k_norm = d.idx_k_norm, .cs = st.cs_ent, .half = half,
                        .eps = float(t.rms_norm_eps), .r = opt.numerics.bf16_activations};
  cuda::compress_emit(ca, stream);
  cuda::update_pending(ws.ag, st.pending[slot], st.seqs, st.seqtab, ratio, hd, stream);
}

// The parts of the indexer that need only xn: its heads' weights (with the compressor, before the
// q latent exists when the compressor forks early).
void CudaBackend::Impl::indexer_xn_part(int l, const Step& st, cudaStream_t stream) {
  const TextConfig& t = cfg.text;
  if (!cfg.layers[l].runs_indexer) return;
  const int64_t D = t.hidden_size;
  cuda::bf16_linear(layers[l].idx_wproj, t.index_n_heads, D, ws.xn, D, st.rows, ws.wts, t.index_n_heads, false,
                    stream);
}

// The indexer's queries from the normalized q latent (qin): projected, rotated, quantized, on
// `stream`.
void CudaBackend::Impl::indexer_query(int l, const Step& st, const cuda::LinearInput& qin, cudaStream_t stream) {
  const TextConfig& t = cfg.text;
  if (!cfg.layers[l].runs_indexer) return;
  const DevLayer& d = layers[l];
  const bool r = opt.numerics.bf16_activations;
  const int n = st.rows, IH = t.index_n_heads;
  const int64_t ihd = t.index_head_dim;
  cuda::fp8_linear(d.idx_wq_b.w, d.idx_wq_b.s, IH * ihd, t.q_lora_rank, qin, n, ws.qi, IH * ihd, r, stream);
  // The queries' RoPE in the quantizer (DSUF_IDX_ROPE=fused, the v25 candidate) or k_rope first (split).
  const cuda::FusedRope qrope{.cs = st.cs_comp, .half = half, .heads = IH, .dim = ihd, .sign = 1.0f, .r = r};
  if (idx_rope_fused) {
    cuda::index_q_quant(ws.qi, n * IH * ihd, ws.qc, ws.qs, stream, qrope);
  } else {
    cuda::rope(ws.qi, n, IH, ihd, st.cs_comp, half, 1.0f, r, stream);
    cuda::index_q_quant(ws.qi, n * IH * ihd, ws.qc, ws.qs, stream);
  }
}

// The indexer's selection from its queries (made here first when with_query), its heads' weights and
// the compressor's entries, on `stream`.
bool CudaBackend::Impl::indexer_branch(int l, const Step& st, const cuda::LinearInput& qin, bool with_query,
                                       cudaStream_t stream, cudaEvent_t after_scores) {
  const TextConfig& t = cfg.text;
  const LayerPlan& lp = cfg.layers[l];
  const bool r = opt.numerics.bf16_activations;
  const int n = st.rows;
  const int slot = layout.source_slot[l];
  const int ratio = lp.ratio;
  if (lp.runs_indexer) {
    const int IH = t.index_n_heads;
    const int64_t ihd = t.index_head_dim;
    if (with_query) indexer_query(l, st, qin, stream);
    cuda::IndexScoreArgs ia{.qc = ws.qc, .qs = ws.qs, .wts = ws.wts, .meta = st.meta, .seqs = st.seqtab, .src = slot,
                            .max_entries = st.max_entries / ratio, .rows = n, .IH = IH, .ratio = ratio, .ihd = ihd,
                            .cand_mask = lp.candidate_constrained ? ws.cand_mask : nullptr, .mask_stride = mask_stride,
                            .block = t.candidate_block_size, .scores = ws.scores, .score_stride = score_stride, .r = r};
    cuda::index_scores(ia, stream);
    if (after_scores) DSUF_CUDA(cudaEventRecord(after_scores, stream));
    if (lp.candidate_source) {
      cuda::candidate_block_scores(ws.scores, score_stride, n, st.meta, ratio, t.candidate_block_size, ws.bscores,
                                   bscore_stride, stream);
      cuda::TopkScratch ts = topk_scratch;
      ts.max_count = (st.max_entries / ratio + t.candidate_block_size - 1) / t.candidate_block_size;
      // Only the set of candidate blocks matters (the mask), not its order: no sort.
      cuda::top_k_mask(ws.bscores, bscore_stride, n, st.meta, ratio, t.candidate_block_size, t.candidate_topk_blocks,
                       ws.cand, ws.cand_mask, mask_stride, stream, ts);
    }
    cuda::TopkScratch ts = topk_scratch;
    ts.max_count = st.max_entries / ratio;
    // Each pick's rank is counted by a gather block over the row's k picks (k² compares a row): for
    // the few rows of a decode step, where one block per row sorting on one SM is the chain.
    if (rank_gather && n <= 4)
      return cuda::top_k_picks(ws.scores, score_stride, n, st.meta, ratio, t.index_topk, ws.picks, ws.sel,
                               t.index_topk, stream, ts);
    cuda::top_k(ws.scores, score_stride, n, st.meta, ratio, 0, t.index_topk, ws.sel, t.index_topk, stream, ts);
  }
  return false;
}

void CudaBackend::Impl::attention(int l, const Step& st, const cuda::LinearInput& xin, float* out) {
  const TextConfig& t = cfg.text;
  const LayerPlan& lp = cfg.layers[l];
  const DevLayer& d = layers[l];
  const bool r = opt.numerics.bf16_activations, aq = opt.numerics.act_quant;
  const int H = t.num_attention_heads, W = t.sliding_window, n = st.rows;
  const int64_t D = t.hidden_size, hd = t.head_dim, qr = t.q_lora_rank, G = t.o_groups, ol = t.o_lora_rank;
  const float eps = float(t.rms_norm_eps);
  const float* cs = lp.compress_rope ? st.cs_comp : st.cs_main;
  // Tensor parallel: this rank's query heads [h0, h0+Hr) and the output groups they feed
  // [g0, g0+Gr); wo_b rows [d0, d0+Dr). Everything else here runs whole on every rank.
  const int h0 = int(part.my_heads().begin), Hr = int(part.my_heads().size());
  const int g0 = int(part.my_groups().begin), Gr = int(part.my_groups().size());
  const int64_t d0 = part.my_hidden().begin, Dr = part.my_hidden().size();

  mark(kAttention);
  // The compressor (which needs only xn) starts on the side stream before wq_a, not after q_norm;
  // the indexer's queries wait for q_norm there (a second fork). DSUF_COMP_FORK=late: after q_norm
  // (early measured −0.07 ms a step, docs/perf.md v19/v20).
  const bool comp_early = comp_fork_early && branch() != stream;
  // DSUF_IDX_Q=main (default since v22): in an indexer layer the indexer's heads' weights and its
  // queries are made on the attention's own stream after q_norm, before wq_b (the attention after
  // it waits for the indexer's selection anyway), so that the side stream's scores start when the
  // compressor's entry is out instead of queueing its query kernels behind it (side: the v21 order).
  const bool q_main = idx_q_main && lp.runs_indexer && branch() != stream;
  if (comp_early) {
    fork();
    compressor_branch(l, st, branch());
    if (!q_main) indexer_xn_part(l, st, branch());
  }
  // wq_a and wkv in one launch (same input), then q_norm and kv_norm in one (kv normalized in place).
  const uint32_t wi = cuda::whatif();  // DSUF_WHATIF (a timing diagnostic): pieces left out
  if (!(wi & cuda::kWhatIfWqA))
    cuda::fp8_linear(d.wq_a.w, d.wq_a.s, qr, D, xin, n, ws.tmp, qr, r, stream,
                     {.W = d.wkv.w, .Ws = d.wkv.s, .out = hd, .y = ws.kvw, .y_stride = hd});
  if (mix_mode == kMixLate) run_deferred_mix();  // DSUF_MIX_FORK=late: the site's mix beside what follows
  const cuda::InputSink qsink{ws.xq[1], ws.xs[1], aq};  // the normalized q latent, laid out for wq_b
  // kv_norm also applies the window KV's rope and FP8 fake quantization (the same arithmetic as rope()
  // then fp8_fake_quant(), one launch fewer); nothing reads ws.kvw before the attention.
  const cuda::FusedRope kv_rope{.cs = cs, .half = half, .heads = 1, .dim = hd, .sign = 1.0f, .r = r};
  if (!(wi & cuda::kWhatIfQnorm))
    cuda::rmsnorm2({ws.tmp, qr, d.q_norm, ws.q_lat, qsink},
                   {.x = ws.kvw, .dim = hd, .w = d.kv_norm, .y = ws.kvw, .fake_quant = true, .fq_rope = kv_rope}, n,
                   eps, r, stream);
  const cuda::LinearInput qin = cuda::sink_input(qsink, qr);
  if (q_main) {
    indexer_xn_part(l, st, stream);
    indexer_query(l, st, qin, stream);
  }
  // The compressor and the indexer (on the side stream) need only xn and q_lat; the query
  // projection goes on beside them.
  // RoPE is fused into the kernels around it (the same arithmetic, one launch fewer each): the window
  // KV's into kv_norm's, the queries' into the logits kernel's query staging (ws.q stays unrotated:
  // nothing else reads it), the output's inverse into the P·V kernel's layout of wo_a's input.
  fork();
  // DSUF_WQB_WAIT=scores: in an indexer layer the side stream's compressor and indexer are enqueued
  // first and wq_b waits for the scores kernel (below); otherwise wq_b goes now, beside them.
  const bool wqb_gate = wqb_after_scores && lp.runs_indexer && branch() != stream;
  auto wq_b = [&] {
    if (!(wi & cuda::kWhatIfWqB)) cuda::fp8_linear(d.wq_b.w, d.wq_b.s, Hr * hd, qr, qin, n, ws.q, Hr * hd, r, stream);
  };
  if (!wqb_gate) wq_b();

  const int slot = layout.source_slot[l];
  const int ratio = lp.ratio;
  mark(kIndexer);
  const int64_t gin = (H / G) * hd;  // wo_a's inputs a group
  cuda::AttentionArgs aa{.q = ws.q, .kv_chunk = ws.kvw, .meta = st.meta, .seqs = st.seqtab, .layer = l,
                         .src = ratio > 0 ? slot : -1, .sel = ratio > 0 ? ws.sel : nullptr,
                         .sel_stride = t.index_topk, .sink = d.sink + h0, .out = ws.o, .keys = ws.keys, .att = ws.att,
                         .kmax = W + t.index_topk, .rows = n, .H = Hr, .W = W, .hd = hd, .r = r,
                         .q_rope = {.cs = cs, .half = half, .heads = Hr, .dim = hd, .sign = 1.0f, .r = r},
                         // The output goes straight into wo_a's input layout, rotated back on the way
                         // (linear_input's arithmetic, in the P·V kernel: one launch fewer).
                         .o_sink = {.xq = ws.xq[0], .xs = ws.xs[0], .quantize = opt.numerics.wo_a_act_quant && aq},
                         .o_group = gin,
                         .o_rope = {.cs = cs, .half = half, .heads = Hr, .dim = hd, .sign = -1.0f, .r = r}};
  if (!comp_early) {
    compressor_branch(l, st, branch());
    if (!q_main) indexer_xn_part(l, st, branch());
  }
  if (indexer_branch(l, st, qin, !q_main, branch(), wqb_gate ? ev_scores : nullptr))
    aa.picks = ws.picks, aa.sel_out = ws.sel;
  if (wqb_gate) {
    DSUF_CUDA(cudaStreamWaitEvent(stream, ev_scores));
    wq_b();
  }
  const int sel_id = ratio > 0 ? slot * 4096 + lp.index_source : -1;
  if (l <= keys_layer) keys_sel = -1;  // a new pass
  aa.window_only = gather_reuse && sel_id >= 0 && !aa.picks && sel_id == keys_sel;
  keys_sel = sel_id, keys_layer = l;
  // The keys decoded on the side stream after the selection, beside wq_b, instead of first on the
  // attention's path (DSUF_GATHER=late: the other way; −0.05 to −0.1 ms a step, docs/perf.md v19).
  if (gather_early && !(wi & cuda::kWhatIfGather)) cuda::gather_keys(aa, branch());
  run_deferred_mix();  // DSUF_MIX_FORK=attn (auto at one row): the site's mix after wq_b, beside the attention pair
  if (e_ahead_step && engram_mode == kEngramPrev) engram_ahead_at(l, st);  // beside this attention pair
  join();
  mark(kAttention);
  const cuda::LinearInput oin = cuda::attention(aa, stream, gather_early);
  cuda::LinearInput zin;
  if (cuda::fp8_sink_mode() != 0 && Gr == G) {  // wo_b's input laid out by wo_a (one rank: nothing to gather)
    const cuda::InputSink zs{.xq = ws.xq[1], .xs = ws.xs[1], .quantize = aq};
    if (!(wi & cuda::kWhatIfWoA)) cuda::fp8_linear_groups(d.wo_a.w, d.wo_a.s, Gr, ol, gin, oin, n, ws.zg, G * ol, r, stream, zs);
    zin = cuda::sink_input(zs, G * ol);
  } else {
    cuda::fp8_linear_groups(d.wo_a.w, d.wo_a.s, Gr, ol, gin, oin, n, ws.zg + g0 * ol, G * ol, r, stream);
    cuda::gather_cols(comm, zg_split, ws.zg, n, G * ol, tp_send, tp_recv, stream);
    zin = cuda::linear_input(ws.zg, G * ol, n, G * ol, aq, ws.xq[1], ws.xs[1], stream);
  }
  if (!(wi & cuda::kWhatIfWoB)) cuda::fp8_linear(d.wo_b.w, d.wo_b.s, Dr, G * ol, zin, n, out + d0, D, r, stream);
  cuda::gather_cols(comm, hidden_split, out, n, D, tp_send, tp_recv, stream);
  // The window ring's copy of this step's KV (ws.kvw) is enqueued with the FFN site's mix, off the
  // critical path (enqueue_step).
}

void CudaBackend::Impl::moe(int l, int n, const uint8_t* image, const cuda::LinearInput& xin,
                            const float* expand_mix, bool sum_to_next) {
  const TextConfig& t = cfg.text;
  const DevLayer& d = layers[l];
  const bool r = opt.numerics.bf16_activations, aq = opt.numerics.act_quant;
  const int E = t.n_routed_experts, K = t.num_experts_per_tok;
  const int64_t D = t.hidden_size, F = t.moe_intermediate_size;
  const float limit = float(t.swiglu_limit);
  // The shared expert on the side stream, beside the routed experts (its own input buffer xq[2]):
  // forked before the router (DSUF_SHARED_FORK=early), so that its 35 MB stream while the router's
  // latency-bound kernels run, not only beside the routed experts' (v18: −0.28 ms at batch 1), or
  // after the routing (late). auto (the default since v39): late for one row, early for more. At one
  // row the routed w1/w3 launch is 108 blocks of 53 K registers each, which start only on an SM with
  // nothing else on it: forked early, the shared expert's blocks held every SM and delayed the
  // routed experts' start ~6 µs a layer after the route; forked late, the routed experts take their
  // 108 SMs first and the shared expert runs on the other 24 (session 25: −0.066 to −0.078 ms at
  // batch 1 in three calls, +0.05 at batch 4 in one round, where the routed launch fills every SM
  // anyway). The two now end within ~1 µs of each other: the routed launches at the greatest
  // priority made the shared expert the tail (+0.25, docs/perf.md v39). (Measured on one GPU; under
  // tensor parallelism the launches' shapes differ and auto was not timed there.)
  const bool shared_early = shared_fork == 1 || (shared_fork == 0 && n > 1);
  const uint32_t wi = cuda::whatif();  // DSUF_WHATIF (a timing diagnostic): pieces left out
  auto shared_expert = [&] {
    if (!part.owns_shared(l)) return;
    fork();
    if (wi & cuda::kWhatIfShared) return;  // DSUF_WHATIF (joined as usual)
    cudaStream_t s2 = branch();
    cuda::fp8_linear(d.sw1.w, d.sw1.s, F, D, xin, n, ws.h1s, F, r, s2,
                     {.W = d.sw3.w, .Ws = d.sw3.s, .out = F, .y = ws.h3s, .y_stride = F});
    const cuda::InputSink hssink{ws.xq[2], ws.xs[2], aq};
    cuda::swiglu(ws.h1s, ws.h3s, n, F, nullptr, limit, opt.numerics.shared_expert_clamp, r, s2, hssink);
    const cuda::LinearInput hsin = cuda::sink_input(hssink, F);
    cuda::fp8_linear(d.sw2.w, d.sw2.s, D, F, hsin, n, ws.ys, D, r, s2);
  };
  if (shared_early) shared_expert();
  if (!(wi & cuda::kWhatIfRouter)) cuda::bf16_linear(d.gate, E, D, ws.xn, D, n, ws.router, E, false, stream);
  cuda::route(ws.router, n, E, K, d.bias, d.bias_vl, image, float(t.gate_temp), float(t.routed_scaling_factor),
              ws.ids, ws.rw, stream);
  if (mix_mode == kMixLate) run_deferred_mix();  // DSUF_MIX_FORK=late
  if (!shared_early) shared_expert();
  const int64_t rows = int64_t(n) * K;
  const cuda::RowGroups* grouped = nullptr;
  // Tiled experts, not split by width: pairs of rows of one expert a block (imma_row_group) where the
  // kernels would otherwise take the rows one at a time; else kRowGroup's groups from
  // group_rows_per_expert rows an expert on average.
  const int multi = experts_tiled && !(part.world > 1 && part.width_experts()) ? cuda::imma_row_group(rows, E) : 0;
  if (multi > 0) {
    cuda::group_rows(ws.ids, rows, E, ws.groups, stream, multi);
    grouped = &ws.groups;
  } else if (group_rows_per_expert > 0 && rows >= group_rows_per_expert * E) {
    cuda::group_rows(ws.ids, rows, E, ws.groups, stream);
    grouped = &ws.groups;
  }
  const cuda::InputSink hsink{ws.xq[1], ws.xs[1], aq, ws.xp[1]};
  const cuda::LinearInput hin = cuda::sink_input(hsink, F);
  if (part.world > 1 && part.width_experts()) {
    // Experts split by width (docs/tp.md): this rank's rows of every expert's w1/w3 — intermediate
    // columns [f0, f0+Fr) — gathered into the whole h1/h3, SwiGLU on whole rows (it lays out w2's
    // input), this rank's rows of w2 — hidden columns [d0, d0+Dr) — gathered into ye. Every output
    // is still one rank's whole reduction: the bits of TP=1.
    const int64_t f0 = part.my_ffn().begin, Fr = part.my_ffn().size();
    const int64_t d0 = part.my_hidden().begin, Dr = part.my_hidden().size();
    auto place = [&](float* full, int64_t ld, int64_t c0, const float* part_cols, int64_t cols) {
      DSUF_CUDA(cudaMemcpy2DAsync(full + c0, size_t(ld) * 4, part_cols, size_t(cols) * 4, size_t(cols) * 4,
                                  size_t(rows), cudaMemcpyDeviceToDevice, stream));
    };
    cuda::fp4_linear_grouped(d.experts.w1, d.experts.s1, ws.ids, Fr, D, xin, K, rows, ws.hc1, r, stream,
                             {.W = d.experts.w3, .Ws = d.experts.s3, .y = ws.hc3}, grouped);
    place(ws.h1, F, f0, ws.hc1, Fr), place(ws.h3, F, f0, ws.hc3, Fr);
    cuda::gather_cols(comm, ffn_split, ws.h1, rows, F, tp_send, tp_recv, stream);
    cuda::gather_cols(comm, ffn_split, ws.h3, rows, F, tp_send, tp_recv, stream);
    cuda::swiglu(ws.h1, ws.h3, rows, F, ws.rw, limit, true, r, stream, hsink);
    cuda::fp4_linear_grouped(d.experts.w2, d.experts.s2, ws.ids, Dr, F, hin, 1, rows, ws.hc1, r, stream, {},
                             grouped);
    place(ws.ye, D, d0, ws.hc1, Dr);
    cuda::gather_cols(comm, hidden_split, ws.ye, rows, D, tp_send, tp_recv, stream);
    if (part.owns_shared(l)) join();
    cuda::gather_expert_rows(comm, ws.ye, nullptr, rows, D, tp_recv, ws.ys, n, part.shared_owner(l), stream);
  } else {
    if (!(wi & cuda::kWhatIfW13))
      cuda::fp4_swiglu_grouped(d.experts.w1, d.experts.s1, d.experts.w3, d.experts.s3, ws.ids, F, D, xin, K, rows,
                               ws.h1, ws.h3, r, stream, grouped, experts_tiled, ws.rw, limit, true, hsink);
    if (!(wi & cuda::kWhatIfW2))
      cuda::fp4_linear_grouped(d.experts.w2, d.experts.s2, ws.ids, D, F, hin, 1, rows, ws.ye, r, stream, {},
                               grouped, experts_tiled);
    // Tensor parallel: the rows of ye whose expert another rank owns were computed with a stand-in
    // expert and are replaced by the owner's; the shared expert runs whole on its layer's owner.
    if (part.owns_shared(l)) join();
    cuda::gather_expert_rows(comm, ws.ye, ws.ids, rows, D, tp_recv, ws.ys, n, part.shared_owner(l), stream);
  }
  hc_mix_join();  // the site's mix (post, comb) expands the output into the streams
  if (!sum_to_next)
    cuda::moe_sum_expand(ws.ye, K, ws.ys, n, t.hc_mult, D, expand_mix, cuda::hc_mix_stride(t.hc_mult), ws.X, r,
                         stream);
}

void CudaBackend::Impl::hc_mix_fork(const float* fn, const float* base, const float* scale, int n, float* out,
                                    const std::function<void(cudaStream_t)>& also) {
  const TextConfig& t = cfg.text;
  cudaStream_t s = stream;
  if (mix_side) {  // the mix waits for everything before it on `stream` (the streams it reads)
    DSUF_CHECK(!mix_pending, "hc_mix_fork: the previous mix was not joined");
    DSUF_CUDA(cudaEventRecord(mix_ev_fork, stream));
    DSUF_CUDA(cudaStreamWaitEvent(mix_side, mix_ev_fork, 0));
    s = mix_side;
  }
  const uint32_t wi = cuda::whatif();  // DSUF_WHATIF (a timing diagnostic)
  if (!(wi & cuda::kWhatIfMix))
    cuda::hc_mix(fn, base, scale, ws.X, n, t.hc_mult, t.hidden_size, float(t.rms_norm_eps),
                 wi & cuda::kWhatIfSinkhorn ? 1 : t.hc_sinkhorn_iters, float(t.hc_eps), out, ws.mix_part, ws.mix_count, s);
  if (also) also(s);
  if (mix_side) {
    DSUF_CUDA(cudaEventRecord(ev_mix, mix_side));
    mix_pending = true;
  }
}
void CudaBackend::Impl::fork_mix(std::function<void()> launch, bool attention_site) {
  DSUF_CHECK(!mix_deferred, "fork_mix: the previous site's mix was not launched");
  if (mix_mode == kMixLate || (attention_site && mix_attn)) mix_deferred = std::move(launch);
  else launch();
}
void CudaBackend::Impl::run_deferred_mix() {
  if (!mix_deferred) return;
  std::function<void()> launch = std::move(mix_deferred);
  mix_deferred = nullptr;
  launch();
}
void CudaBackend::Impl::engram_project(int l, const Step& st, float* emb, float* xq, float* xs, float* ekv,
                                       cudaStream_t s, int tile_sm, int part, int parts) {
  const TextConfig& t = cfg.text;
  const DevLayer& d = layers[l];
  const int n = st.rows, Rr = hasher->rows_per_token();
  const int64_t ehd = t.engram_head_dim, K = d.e_wkv.in, out = d.e_wkv.out;
  if (part == 0) cuda::engram_gather(st.engram_rows[cfg.layers[l].engram_slot], n, Rr, d.e_table, d.e_scale, ehd, emb, s);
  // The layout (launched with slice 0; rows = 0 describes it without a launch).
  const cuda::LinearInput ein =
      cuda::linear_input(emb, Rr * ehd, part == 0 ? n : 0, K, opt.numerics.act_quant, xq, xs, s);
  const int64_t blocks = (out + 31) / 32, per = (blocks + parts - 1) / parts;
  const int64_t r0 = std::min(out, part * per * 32), r1 = std::min(out, (part + 1) * per * 32);
  if (r1 <= r0) return;
  // Rows [r0, r1) of W and their 32×32 blocks' scales ([out/32][K/32]).
  cuda::fp8_linear(d.e_wkv.w + r0 * K, d.e_wkv.s + (r0 / 32) * (K / 32), r1 - r0, K, ein, n, ekv + r0,
                   (t.hc_mult + 1) * t.hidden_size, opt.numerics.bf16_activations, s, {}, tile_sm);
}
void CudaBackend::Impl::engram_ahead(int l, const Step& st, int part, int parts) {
  const EngramAhead& e = e_ahead[size_t(cfg.layers[l].engram_slot)];
  DSUF_CUDA(cudaEventRecord(e_ev_fork, stream));
  DSUF_CUDA(cudaStreamWaitEvent(e_side, e_ev_fork, 0));
  engram_project(l, st, e.emb, e.xq, e.xs, e.ekv, e_side, engram_sm, part, parts);
  if (part == parts - 1) DSUF_CUDA(cudaEventRecord(e.done, e_side));
}
void CudaBackend::Impl::engram_ahead_at(int site, const Step& st) {
  for (const LayerPlan& lp : cfg.layers) {
    const int L = lp.layer, parts = std::min(engram_chunks, L + 1);
    if (lp.engram_slot >= 0 && L > site && site >= L - parts) engram_ahead(L, st, site - (L - parts), parts);
  }
}
void CudaBackend::Impl::hc_mix_join() {
  run_deferred_mix();
  if (!mix_pending) return;
  DSUF_CUDA(cudaStreamWaitEvent(stream, ev_mix, 0));
  mix_pending = false;
}

// The kernels of one step, in order; no host synchronization inside unless tracing (so a decode
// step can be captured as a CUDA graph).
void CudaBackend::Impl::enqueue_step(const Step& st, std::vector<Part>& parts, bool trace) {
  const ModelConfig& c = cfg;
  const TextConfig& t = c.text;
  const bool r = opt.numerics.bf16_activations;
  const int hc = t.hc_mult, n = st.rows, ms = cuda::hc_mix_stride(hc);
  const int64_t D = t.hidden_size, V = t.vocab_size;
  const float eps = float(t.rms_norm_eps);
  mix_attn = mix_mode == kMixAttn || (mix_mode == kMixAuto && n == 1);
  mark(kEmbed);
  DSUF_CUDA(cudaMemcpyAsync(stage.dev, stage.host, stage.used, cudaMemcpyHostToDevice, stream));
  e_ahead_step = e_side && n <= e_rows && !comp_timing;
  if (e_ahead_step && engram_mode == kEngramStart)
    for (const LayerPlan& lp : c.layers)
      if (lp.engram_slot >= 0) engram_ahead(lp.layer, st);
  if (e_ahead_step && engram_mode == kEngramPrev) engram_ahead_at(-1, st);
  cuda::embed(st.tok, n, embed, D, hc, ws.X, ws.pre, stream);
  const float* pre = ws.pre;  // the next attention site's collapse weights: the embedding's one-hot
  int pre_stride = hc;
  cuda::MoeSumIn moe_sum;  // set: the previous FFN site's sum and expansion is left to this collapse
  for (size_t li = 0; li < c.layers.size(); ++li) {
    const LayerPlan& lp = c.layers[li];
    const int l = lp.layer;
    const DevLayer& d = layers[l];
    if (lp.engram_slot >= 0) {
      mark(kEngram);
      float* ekv = ws.ekv;
      if (e_ahead_step) {
        const EngramAhead& e = e_ahead[size_t(lp.engram_slot)];
        DSUF_CUDA(cudaStreamWaitEvent(stream, e.done, 0));
        ekv = e.ekv;
      } else {
        engram_project(l, st, ws.emb, ws.xq[0], ws.xs[0], ws.ekv, stream, 0);
      }
      cuda::engram_gate(ws.X, ekv, d.e_q, d.e_k, st.dead, n, hc, D, eps, r, stream);
    }
    // Attention site: the collapse (with the previous site's pre) first, then the site's mix on the
    // mix stream: launched the other way round, the mix's blocks held the multiprocessors the
    // collapse's cluster waited for (12.5 against 6.5 µs, docs/perf.md v15). This collapse does not
    // write the streams, so the mix reads the same values either way.
    mark(kMhc);
    // Both collapses also lay their rows out for the site's first linears (xq[0], no linear_input).
    const cuda::InputSink xsink{ws.xq[0], ws.xs[0], opt.numerics.act_quant};
    const cuda::LinearInput xin = cuda::sink_input(xsink, D);
    // With moe_sum set, the previous FFN site's sum and expansion first, with its mix (pre's rows).
    const float* emix = moe_sum.ye ? pre : nullptr;
    cuda::collapse_norm(pre, pre_stride, emix, emix ? pre_stride : 0, nullptr, ws.X, n, hc, D, d.attn_norm, eps, ws.xn,
                        r, stream, xsink, moe_sum);
    moe_sum = {};
    fork_mix([&] { hc_mix_fork(d.hca_fn, d.hca_base, d.hca_scale, n, ws.mix_a); }, true);
    attention(l, st, xin, ws.y);
    // FFN site: the attention site's expansion, then the collapse with its pre, in one kernel.
    mark(kMhc);
    hc_mix_join();
    // This one also writes the byte planes the routed experts' FP4 linears read (xp[0]).
    const cuda::InputSink fsink{ws.xq[0], ws.xs[0], opt.numerics.act_quant, ws.xp[0]};
    if (!(cuda::whatif() & cuda::kWhatIfFfnCollapse))  // DSUF_WHATIF (a timing diagnostic)
      cuda::collapse_norm(ws.mix_a, ms, ws.mix_a, ms, ws.y, ws.X, n, hc, D, d.ffn_norm, eps, ws.xn, r, stream, fsink);
    // With the mix: this step's KV rows into the window ring (read by the next steps' attention; the
    // next writer of ws.kvw, the next layer's wkv, comes after the join).
    fork_mix([&] {
      hc_mix_fork(d.hcf_fn, d.hcf_base, d.hcf_scale, n, ws.mix_f, [&](cudaStream_t s) {
        cuda::pack_window(ws.kvw, n, st.meta, st.seqtab, l, t.head_dim, t.sliding_window, s);
      });
    }, false);
    mark(kMoe);
    // The sum and expansion left to the next attention site's collapse where nothing reads the streams
    // before it: a next layer without an Engram gate, no trace.
    const bool sum_to_next = sum_in_collapse && !trace && li + 1 < c.layers.size() &&
                             c.layers[li + 1].engram_slot < 0 && cuda::moe_sum_fits(D, t.num_experts_per_tok);
    // (ends with the FFN site's expansion, unless sum_to_next)
    moe(l, n, st.image, cuda::sink_input(fsink, D), ws.mix_f, sum_to_next);
    if (sum_to_next) moe_sum = {.ye = ws.ye, .ys = ws.ys, .k = t.num_experts_per_tok};
    // pre of the FFN site feeds the next attention site's collapse.
    pre = ws.mix_f, pre_stride = ms;
    if (trace) {
      std::vector<float> x(size_t(n) * hc * D);
      DSUF_CUDA(cudaMemcpyAsync(x.data(), ws.X, x.size() * 4, cudaMemcpyDeviceToHost, stream));
      DSUF_CUDA(cudaStreamSynchronize(stream));
      if (part.rank == 0) parts[0].item->trace->push_back(std::move(x));
    }
  }
  const bool direct = head_direct && st.logit_rows_identity;
  if (pre != ws.pre && !direct)  // the head collapses with the last FFN site's pre
    DSUF_CUDA(cudaMemcpy2DAsync(ws.pre, hc * 4, pre, pre_stride * 4, hc * 4, n, cudaMemcpyDeviceToDevice, stream));
  if (st.n_logit_rows > 0) {
    const int nl = st.n_logit_rows;
    mark(kHead);
    if (direct) {
      cuda::collapse_norm(pre, pre_stride, nullptr, 0, nullptr, ws.X, nl, hc, D, norm, eps, ws.xn, r, stream);
    } else {
      cuda::gather_rows(ws.X, ws.pre, st.logit_rows, nl, hc, D, X_head, pre_head, stream);
      cuda::collapse_norm(pre_head, hc, nullptr, 0, nullptr, X_head, nl, hc, D, norm, eps, ws.xn, r, stream);
    }
    // Vocabulary-parallel head: this rank's rows, gathered; rank 0 samples and hands the tokens
    // (and the logits when asked) to the host.
    const int64_t v0 = part.my_vocab().begin;
    // The FMA's limits only where the norm rounds its outputs to BF16 (else no row would qualify).
    cuda::bf16_linear(head, part.my_vocab().size(), D, ws.xn, D, nl, ws.logits + v0, V, false, stream,
                      r ? head_fl : Bf16FmaLimits{});
    cuda::gather_cols(comm, vocab_split, ws.logits, nl, V, tp_send, tp_recv, stream);
    // Sampling where the logits are (sample_chunk jobs per launch, the size of the weight
    // workspace); the tokens come back, the logits only when an item wants them.
    for (int j0 = 0; part.rank == 0 && j0 < st.n_jobs; j0 += sample_chunk)
      cuda::sample(ws.logits, V, st.jobs + j0, std::min(sample_chunk, st.n_jobs - j0), ws.sample_max + j0,
                   ws.sample_w, ws.sample_out + j0, stream);
    if (part.rank == 0 && st.n_jobs > 0)
      DSUF_CUDA(cudaMemcpyAsync(tokens_host, ws.sample_out, size_t(st.n_jobs) * 4, cudaMemcpyDeviceToHost, stream));
    if (part.rank == 0 && st.copy_logits)
      DSUF_CUDA(cudaMemcpyAsync(logits_host, ws.logits, size_t(nl) * V * 4, cudaMemcpyDeviceToHost, stream));
  }
  mark(kEnd);
}

void CudaBackend::Impl::finish_step(std::vector<Part>& parts, const Step& st) {
  const ModelConfig& c = cfg;
  const int64_t V = c.text.vocab_size;
  for (size_t q = 0; q < parts.size(); ++q) {
    Part& p = parts[q];
    SequenceState& s = *p.item->state;
    if (p.logits && p.item->logits && st.logit_row_of_part[q] >= 0) {
      const bool all = p.item->want == ForwardItem::Logits::kAll;
      const int rows = all ? p.n : 1;
      const int src_row = st.logit_row_of_part[q] + (all || !st.all_rows_logits ? 0 : p.n - 1);
      const size_t off = all ? size_t(p.offset) * V : 0;
      p.item->logits->resize(off + size_t(rows) * V);
      std::memcpy(p.item->logits->data() + off, logits_host + size_t(src_row) * V, size_t(rows) * V * 4);
    }
    if (p.sample) *p.item->token = tokens_host[st.sample_job_of_part[q]];
    auto& hist = s.engram_history;
    for (int j = 0; j < p.n; ++j) {
      const int32_t id = p.item->tokens[p.offset + j];
      for (int h = int(hist.size()) - 1; h > 0; --h) hist[h] = hist[h - 1];
      if (!hist.empty()) hist[0] = id == c.image_token_id ? -1 : cids[id];
    }
    s.pos += p.n;
    auto* set = static_cast<DevSeqSet*>(s.device.get());
    set->pos = s.pos;
    for (auto& ds : set->ranks)  // every rank's copy of the pools
      for (size_t k = 0; k < layout.kv_sources.size(); ++k) {
        ds->entries[k] = s.pos / layout.source_ratio[k];
        ds->cur[k] ^= 1;
      }
  }
}

// One rank's share of a step (staging, kernels, synchronization); finish_step then runs once.
CudaBackend::Impl::Step CudaBackend::Impl::run_step(std::vector<Part>& parts) {
  DSUF_CUDA(cudaSetDevice(opt.device));
  bool trace = false, decode = use_graphs && !comp_timing;
  comp_tags.clear();
  for (const Part& p : parts) {
    trace |= p.item->trace != nullptr;
    decode &= p.n == 1;
  }
  decode &= !trace;
  const Step st = stage_step(parts, decode);
  if (decode) {
    // Decode steps replay a graph captured for this batch size; the staged inputs change, the
    // kernels and their arguments do not.
    Graph& g = graphs[{st.rows, st.copy_logits}];
    if (!g.exec || g.stage_bytes != stage.used) {
      if (g.exec) cudaGraphExecDestroy(g.exec);
      cudaGraph_t graph;
      DSUF_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      enqueue_step(st, parts, false);
      DSUF_CUDA(cudaStreamEndCapture(stream, &graph));
      DSUF_CUDA(cudaGraphInstantiate(&g.exec, graph,
                                     cuda::latency_priority_on() ? cudaGraphInstantiateFlagUseNodePriority : 0));
      DSUF_CUDA(cudaGraphDestroy(graph));
      g.stage_bytes = stage.used;
    }
    if (!ev0) {
      DSUF_CUDA(cudaEventCreate(&ev0));
      DSUF_CUDA(cudaEventCreate(&ev1));
    }
    DSUF_CUDA(cudaEventRecord(ev0, stream));
    DSUF_CUDA(cudaGraphLaunch(g.exec, stream));
    DSUF_CUDA(cudaEventRecord(ev1, stream));
  } else {
    enqueue_step(st, parts, trace);
  }
  DSUF_CUDA(cudaStreamSynchronize(stream));
  DSUF_CUDA(cudaGetLastError());
  if (decode) {
    float ms = 0;
    DSUF_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
    last_graph_ms = ms;
  }
  if (comp_timing) {
    std::fill(comp_ms, comp_ms + kComps, 0.0);
    for (size_t j = 0; j + 1 < comp_tags.size(); ++j) {
      float ms = 0;
      DSUF_CUDA(cudaEventElapsedTime(&ms, comp_events[j], comp_events[j + 1]));
      comp_ms[comp_tags[j]] += ms;
    }
  }
  return st;
}

namespace {
// Refuses with the plan's numbers when it does not fit the device.
void check_fits(const ModelConfig& cfg, const CudaOptions& opt, int rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) fail("--gpus: no CUDA device is available");
  if (opt.device >= count) fail("--gpus: device ", opt.device, " does not exist (", count, " visible)");
  DSUF_CUDA(cudaSetDevice(opt.device));
  const CudaMemoryPlan plan = plan_cuda_memory(cfg, opt, rank);
  size_t free_b = 0, total_b = 0;
  DSUF_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const size_t margin = size_t(512) << 20;  // CUDA context growth, allocator rounding
  if (plan.total() + margin > free_b)
    fail("the model does not fit GPU ", opt.device, ": needs ", plan.describe(), ", plus 0.5 GiB margin; ",
         double(free_b) / (1ull << 30), " GiB free of ", double(total_b) / (1ull << 30),
         " GiB. Lower --max-batch or --max-context, or give more GPUs");
}
}  // namespace

CudaBackend::CudaBackend(const LoadedModel& model, std::vector<int32_t> compressed_ids, CudaOptions opt) {
  init(model.config, &model, std::move(compressed_ids), std::move(opt), 0);
}

CudaBackend::CudaBackend(const ModelConfig& config, std::vector<int32_t> compressed_ids, CudaOptions opt,
                         uint64_t seed) {
  init(config, nullptr, std::move(compressed_ids), std::move(opt), seed);
}

struct CudaBackend::Tp {
  std::vector<std::unique_ptr<cuda::TpComm>> comms;
  std::unique_ptr<cuda::RankPool> pool;
};

void CudaBackend::init(const ModelConfig& cfg, const LoadedModel* model, std::vector<int32_t> ids, CudaOptions opt,
                       uint64_t seed) {
  if (opt.devices.empty()) opt.devices = {opt.device};
  const int world = int(opt.devices.size());
  for (int i = 0; i < world; ++i)
    for (int j = 0; j < i; ++j)
      if (opt.devices[i] == opt.devices[j]) fail("--gpus lists GPU ", opt.devices[i], " twice");
  for (int r = 0; r < world; ++r) {
    CudaOptions o = opt;
    o.device = opt.devices[r];
    check_fits(cfg, o, r);  // plan first: refuse before uploading anything
  }
  tp_ = std::make_unique<Tp>();
  if (world > 1) {
    const auto t0 = std::chrono::steady_clock::now();
    tp_->comms = cuda::TpComm::create_all(opt.devices);
    if (opt.progress) std::fprintf(stderr, "tensor parallel: NCCL communicators in %.1f s\n", seconds_since(t0));
  }
  try {
    load_ranks(cfg, model, ids, opt, seed);
  } catch (...) {
    for (auto& c : tp_->comms) c->abort();  // local: freeing them normally would wait for the peers
    throw;
  }
}

void CudaBackend::load_ranks(const ModelConfig& cfg, const LoadedModel* model, const std::vector<int32_t>& ids,
                             const CudaOptions& opt, uint64_t seed) {
  const int world = int(opt.devices.size());
  bool graphs = true;
  if (const char* g = std::getenv("DSUF_CUDA_GRAPHS")) graphs = std::string(g) != "0";  // profiling
  for (int r = 0; r < world; ++r) {
    ranks_.push_back(std::make_unique<Impl>(cfg, model, ids, opt, r));
    Impl& im = *ranks_.back();
    im.backend_id = this;
    im.use_graphs = graphs;
    if (world > 1) im.comm = tp_->comms[r].get();
    if (r > 0) im.host_tables = &ranks_[0]->host_ptr;
  }
  // The Engram tables first (rank 0 pins them, the others map them), then every rank its weights,
  // all ranks at once, each on its own thread and GPU (one after another, TP=2 took twice as long).
  ranks_[0]->place_host_tables(seed);
  const auto t0 = std::chrono::steady_clock::now();
  if (world > 1) {
    tp_->pool = std::make_unique<cuda::RankPool>(opt.devices, [this] {
      for (auto& c : tp_->comms) c->abort();
    });
    tp_->pool->run([&](int r) { ranks_[r]->load(seed); });
    if (opt.progress)
      std::fprintf(stderr, "tensor parallel: %d ranks loaded in parallel in %.1f s\n", world, seconds_since(t0));
    // Every collective kind once, small and large, outside any graph capture: NCCL connects its
    // peers on first use, which must not happen inside a captured decode step.
    tp_->pool->run([&](int r) {
      Impl& im = *ranks_[r];
      im.comm->all_gather(im.tp_send, im.tp_recv, 1, im.stream);
      im.comm->all_gather(im.tp_send, im.tp_recv, size_t(im.tp_send_floats), im.stream);
      im.comm->group_start();
      im.comm->all_gather(im.tp_send, im.tp_recv, 1, im.stream);
      im.comm->broadcast(im.tp_send, size_t(im.tp_send_floats), 0, im.stream);
      im.comm->group_end();
      DSUF_CUDA(cudaStreamSynchronize(im.stream));
    });
  } else {
    ranks_[0]->load(seed);
  }
  DSUF_CUDA(cudaSetDevice(opt.devices[0]));
}

CudaBackend::~CudaBackend() {
  // First the captured graphs (they hold NCCL work), then the communicators, then the rest.
  for (auto& rk : ranks_) {
    cudaSetDevice(rk->opt.device);
    if (rk->stream) cudaStreamSynchronize(rk->stream);
    cuda::att_trace_dump();  // DSUF_ATT_TRACE
    for (auto& [b, g] : rk->graphs)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    rk->graphs.clear();
  }
  if (tp_ && tp_->pool) {
    // Each rank frees its own communicator on its own thread (NCCL's finalize waits for the peers),
    // then the threads end. After a failure the communicators were aborted and need no freeing.
    try {
      tp_->pool->run([&](int r) { tp_->comms[r].reset(); });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tensor parallel: freeing the communicators: %s\n", e.what());
    }
    tp_->pool.reset();
  }
  // Last rank first: rank 0's pinned Engram tables are mapped by the others.
  for (int r = int(ranks_.size()) - 1; r >= 0; --r) {
    Impl& im = *ranks_[r];
    cudaSetDevice(im.opt.device);
    if (im.ev0) cudaEventDestroy(im.ev0), cudaEventDestroy(im.ev1);
    for (cudaEvent_t e : im.comp_events) cudaEventDestroy(e);
    for (void* p : im.pinned) cudaFreeHost(p);
    if (im.mix_ev_fork) cudaEventDestroy(im.mix_ev_fork), cudaEventDestroy(im.ev_mix);
    if (im.mix_side) cudaStreamDestroy(im.mix_side);
    for (auto& e : im.e_ahead) cudaEventDestroy(e.done);
    if (im.e_side) cudaStreamDestroy(im.e_side), cudaEventDestroy(im.e_ev_fork);
    if (im.stream) cudaStreamDestroy(im.stream);
    if (im.side)
      cudaStreamDestroy(im.side), cudaEventDestroy(im.ev_fork), cudaEventDestroy(im.ev_join),
          cudaEventDestroy(im.ev_scores);
    ranks_[r].reset();
  }
  tp_.reset();
}

const ModelConfig& CudaBackend::config() const { return ranks_[0]->cfg; }
const KvLayout& CudaBackend::layout() const { return ranks_[0]->layout; }
size_t CudaBackend::weight_bytes(int rank) const { return ranks_.at(rank)->weight_bytes; }
int CudaBackend::world_size() const { return int(ranks_.size()); }

SequenceState CudaBackend::new_sequence() const { return SequenceState::empty(ranks_[0]->layout); }

void CudaBackend::forward(std::span<ForwardItem> batch) {
  Impl& im = *ranks_[0];
  std::vector<size_t> done(batch.size(), 0);
  std::vector<SequenceState*> seen;
  std::vector<const void*> pools;
  for (ForwardItem& item : batch) {
    DSUF_CHECK(item.state, "forward item without a sequence state");
    DSUF_CHECK(std::find(seen.begin(), seen.end(), item.state) == seen.end(), "a sequence appears twice in one batch");
    seen.push_back(item.state);
    if (item.state->pos + int64_t(item.tokens.size()) > im.cfg.text.max_position_embeddings)
      fail("sequence of ", item.state->pos + item.tokens.size(), " tokens exceeds max_position_embeddings");
    // Input errors are refused here, before any rank starts: a rank failing alone inside a step
    // would have to abort the communicators (the backend is then unusable).
    for (const int32_t id : item.tokens)
      if (id < 0 || id >= im.cfg.text.vocab_size)
        fail("token id ", id, " is outside the vocabulary [0, ", im.cfg.text.vocab_size, ")");
    for (size_t k = 0; k < im.layout.kv_sources.size(); ++k)
      if ((item.state->pos + int64_t(item.tokens.size())) / im.layout.source_ratio[k] > im.opt.max_context)
        fail("sequence of ", item.state->pos + item.tokens.size(), " tokens exceeds the CUDA backend's max_context ",
             im.opt.max_context);
    if (item.logits) item.logits->clear();
    DSUF_CHECK(!item.token || (item.want != ForwardItem::Logits::kNone && !item.tokens.empty()),
               "sampling a token needs the last row's logits");
    // Two copies of one state at the same position would advance the same device pools: the
    // later one gets pools of its own, uploaded from its host pools.
    if (item.state->device && std::find(pools.begin(), pools.end(), item.state->device.get()) != pools.end())
      item.state->device.reset();
    for (auto& rk : ranks_) rk->seq(*item.state);  // every rank's pools, allocated here, not on the rank threads
    pools.push_back(item.state->device.get());
  }
  // Steps of at most max_rows rows; each sequence contributes one chunk per step, in order. A traced
  // item runs alone (its trace is per step).
  for (;;) {
    std::vector<Impl::Part> parts;
    int used = 0;
    for (size_t i = 0; i < batch.size() && used < im.max_rows; ++i) {
      ForwardItem& item = batch[i];
      const int left = int(item.tokens.size() - done[i]);
      if (left == 0) continue;
      if (item.trace && !parts.empty()) continue;
      const int take = std::min(left, im.max_rows - used);
      const bool last = done[i] + take == item.tokens.size();
      const bool logits = item.want == ForwardItem::Logits::kAll || (last && item.want == ForwardItem::Logits::kLast);
      parts.push_back({&item, &im.seq(*item.state), int(done[i]), take, logits, last && item.token != nullptr});
      done[i] += take;
      used += take;
      if (item.trace) break;
    }
    if (parts.empty()) break;
    if (ranks_.size() == 1) {
      const Impl::Step st = im.run_step(parts);
      im.finish_step(parts, st);
      continue;
    }
    // Tensor parallel: every rank runs the step on its own thread with its own pools; the
    // collectives inside keep them in lockstep. The host bookkeeping then runs once.
    std::vector<Impl::Step> steps(ranks_.size());
    tp_->pool->run([&](int r) {
      std::vector<Impl::Part> mine = parts;
      for (Impl::Part& p : mine) p.ds = &ranks_[r]->seq(*p.item->state);
      steps[r] = ranks_[r]->run_step(mine);
    });
    im.finish_step(parts, steps[0]);
  }
}

double CudaBackend::last_graph_ms() const { return ranks_[0]->last_graph_ms; }
// Component timing: rank 0's events (with several GPUs, its waits in the exchanges are in its parts).
void CudaBackend::set_component_timing(bool on) {
  for (auto& rk : ranks_) rk->comp_timing = on;
}
std::vector<std::pair<std::string, double>> CudaBackend::component_ms() const {
  static const char* names[Impl::kComps] = {"embedding", "engram", "mhc+norms", "attention", "indexer+compressor",
                                            "moe", "head+sampling"};
  std::vector<std::pair<std::string, double>> out;
  for (int c = 0; c < Impl::kComps; ++c) out.emplace_back(names[c], ranks_[0]->comp_ms[c]);
  return out;
}

SequenceState CudaBackend::synthetic_sequence(int64_t pos, uint64_t seed) {
  const KvLayout& L = ranks_[0]->layout;
  SequenceState st = SequenceState::empty(L);
  for (auto& rk : ranks_) rk->seq(st);
  st.pos = pos;
  static_cast<DevSeqSet*>(st.device.get())->pos = pos;
  for (auto& rk : ranks_) {  // the same bytes on every rank (the pools are replicated)
    Impl& im = *rk;
    DSUF_CUDA(cudaSetDevice(im.opt.device));
    DevSeq& ds = im.seq(st);
    const int64_t hd = L.head_dim, ihd = L.index_head_dim;
    cuda::fill_entries_synthetic(ds.window.as<uint8_t>(), int64_t(L.num_layers) * L.window, int64_t(L.window_entry_bytes),
                                 hd, true, 127, seed, im.stream);
    for (size_t k = 0; k < L.kv_sources.size(); ++k) {
      const int64_t entries = pos / L.source_ratio[k];
      DSUF_CHECK(entries <= im.opt.max_context, "synthetic sequence longer than max_context");
      cuda::fill_entries_synthetic(ds.ckv[k].as<uint8_t>(), entries, int64_t(L.ckv_entry_bytes), hd / 2, false, 0x30,
                                   seed + 1 + k, im.stream);
      cuda::fill_entries_synthetic(ds.ikey[k].as<uint8_t>(), entries, int64_t(L.ikey_entry_bytes), ihd / 2, false, 127,
                                   seed + 101 + k, im.stream);
      ds.entries[k] = entries;
      DSUF_CUDA(cudaMemsetAsync(ds.pending[ds.cur[k]][k].p, 0, size_t(L.source_ratio[k]) * 2 * hd * 4, im.stream));
    }
    DSUF_CUDA(cudaStreamSynchronize(im.stream));
  }
  for (size_t h = 0; h < st.engram_history.size(); ++h) st.engram_history[h] = int32_t((seed * 7919 + h * 104729) % 99092);
  DSUF_CUDA(cudaSetDevice(ranks_[0]->opt.device));
  return st;
}

void CudaBackend::download(SequenceState& st) const {
  if (!st.device) return;
  const KvLayout& L = ranks_[0]->layout;
  const auto* set = static_cast<const DevSeqSet*>(st.device.get());
  if (set->owner != this || set->pos != st.pos) {
    st.device.reset();  // a stale handle: the host pools are already this state's truth
    return;
  }
  DSUF_CUDA(cudaSetDevice(ranks_[0]->opt.device));
  DevSeq& ds = *set->ranks.at(0);  // rank 0's copy (all are equal)
  for (int l = 0; l < L.num_layers; ++l)
    DSUF_CUDA(cudaMemcpy(st.window[l].data(), ds.window.as<uint8_t>() + size_t(l) * L.window * L.window_entry_bytes,
                         st.window[l].size(), cudaMemcpyDeviceToHost));
  for (size_t k = 0; k < L.kv_sources.size(); ++k) {
    st.ckv[k].resize(size_t(ds.entries[k]) * L.ckv_entry_bytes);
    st.ikey[k].resize(size_t(ds.entries[k]) * L.ikey_entry_bytes);
    DSUF_CUDA(cudaMemcpy(st.ckv[k].data(), ds.ckv[k].p, st.ckv[k].size(), cudaMemcpyDeviceToHost));
    DSUF_CUDA(cudaMemcpy(st.ikey[k].data(), ds.ikey[k].p, st.ikey[k].size(), cudaMemcpyDeviceToHost));
    st.pending[k].resize(size_t(st.pos % L.source_ratio[k]) * 2 * L.head_dim);
    if (!st.pending[k].empty())
      DSUF_CUDA(cudaMemcpy(st.pending[k].data(), ds.pending[ds.cur[k]][k].p, st.pending[k].size() * 4,
                           cudaMemcpyDeviceToHost));
  }
}

}  // namespace dsuf
