// Kernels of the CUDA backend: each step of the CPU reference (src/backend/cpu/cpu_backend.cc) with
// the same operations in the same order (the canonical summation orders of core/detmath.h), FP32
// arithmetic with the same BF16 rounding points, so results equal the reference bit for bit.
// Layouts: activations row-major FP32 [rows][dim] (values already BF16-rounded where the reference
// rounds); the linears' inputs in the interleaved layout of linear_input; weights in their
// checkpoint formats (FP8 E4M3 + E8M0 per 32×32 tile, packed E2M1 + E8M0 per 32 inputs, raw BF16).
// docs/cuda.md lists the kernels, docs/perf.md what each version measured.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/bf16_fma.h"
#include "core/sampling.h"

namespace dsuf::cuda {


// Embedding rows to every stream; pre[row] = one-hot(stream 0).
void embed(const int32_t* tok, int n, const uint16_t* table, int64_t D, int hc, float* X, float* pre,
           cudaStream_t s);
// mHC mix per token, one launch: out[row] = pre[hc] | post[hc] | comb[hc·hc] (model-spec §3.2).
// part (hc_mix_part_floats(n, hc) floats) and count (n counters, zero before the first launch; every
// launch leaves them zero) are its scratch; launches sharing them must not run concurrently.
void hc_mix(const float* fn, const float* base, const float* scale, const float* X, int n, int hc, int64_t D,
            float norm_eps, int iters, float hc_eps, float* out, float* part, unsigned* count, cudaStream_t s);
constexpr int hc_mix_stride(int hc) { return 2 * hc + hc * hc; }
int64_t hc_mix_part_floats(int rows, int hc);
void hc_collapse(const float* pre, int pre_stride, const float* X, int n, int hc, int64_t D, float* u, bool r,
                 cudaStream_t s);
// rope()'s rotation done by another kernel on the way, with rope()'s arithmetic and rounding: rows of
// `heads` head vectors of `dim` values (dim % 32 == 0), the last 2·half of each rotated by the row's
// cos/sin in cs (row-major [rows][half][cos,sin]) with sign·sin, rounded as rope() with r. Off when
// cs is null.
struct FusedRope {
  const float* cs = nullptr;
  int half = 0;
  int heads = 1;
  int64_t dim = 0;
  float sign = 1.0f;
  bool r = false;
};
// Where a producer (collapse_norm, rmsnorm2, swiglu) also writes its output rows laid out for the linears, as
// linear_input would (one group): the floats xq, the scales xs when quantize. Off when xq is null.
// With xp set (and quantize) also the byte planes of 512·(E4M3 value) that the FP4 linears read
// (interleaved_planes(K) bytes a row; kernels.cu, ppos16).
struct InputSink {
  float* xq = nullptr;
  float* xs = nullptr;
  bool quantize = false;
  uint8_t* xp = nullptr;
};
// y = rmsnorm(Σ_k pre[k]·X[k]) per row (the collapsed row never leaves the chip). With emix set, the
// streams are first expanded in place with the mix rows emix (stride emix_stride) and the site output
// y_in, as the reference's hc_expand: X_k ← bf16(post_k·y_in + Σ_j C[j][k]·X_j). y is also laid out for
// the linears through sink when set (D % 32 == 0).
// With moe.ye set, y_in is the FFN site's output instead, summed as moe_sum_expand sums it —
// bf16(Σ_j moe.ye[row·k + j] + moe.ys[row]) — so that the next attention site's collapse does the MoE's
// sum and expansion (moe_sum_fits says where: the wide kernel, k ≤ kMoeSumMax).
struct MoeSumIn {
  const float* ye = nullptr;
  const float* ys = nullptr;
  int k = 0;
};
constexpr int kMoeSumMax = 8;
bool moe_sum_fits(int64_t D, int k);
void collapse_norm(const float* pre, int pre_stride, const float* emix, int emix_stride, const float* y_in, float* X,
                   int n, int hc, int64_t D, const uint16_t* w, float eps, float* y, bool r, cudaStream_t s,
                   const InputSink& sink = {}, const MoeSumIn& moe = {});
// y = bf16(w ⊙ x·rsqrt(mean(x²)+eps)) per row (w optional; y may be x).
void rmsnorm(const float* x, int64_t rows, int64_t dim, const uint16_t* w, float eps, float* y, bool r,
             cudaStream_t s);
// Two independent row sets of `rows` rows each in one launch.
struct RmsJob {
  const float* x;
  int64_t dim;
  const uint16_t* w;
  float* y;
  InputSink sink = {};  // dim % 32 == 0
  // fake_quant (dim % 32 == 0): the normalized values then go through fp8_fake_quant(y, rows·dim, r,
  // s, fq_rope) before they are stored, in the same kernel (the window KV: kv_norm, rope, FP8).
  bool fake_quant = false;
  FusedRope fq_rope = {};
};
void rmsnorm2(const RmsJob& a, const RmsJob& b, int64_t rows, float eps, bool r, cudaStream_t s);
// The input rows of the FP8/FP4 linears, laid out by linear_input: per row `stride` floats, per group
// of K inputs interleaved_k(K) floats (group_stride), interleaved so that a warp's loads are
// contiguous (kernels.cu, xpos4). With scale set, the reference's per-32 FP8 activation quantization
// of them: E4M3 values times 2^64, block scales at scale[row·scale_stride + group·K/32 + kb].
// planes: the quantized rows' byte planes (InputSink::xp; plane_stride bytes a row), which the FP4
// linears need when scale is set.
struct LinearInput {
  const float* x;
  int64_t stride, group_stride;
  const float* scale;
  int64_t scale_stride;
  const uint8_t* planes = nullptr;
  int64_t plane_stride = 0;
  // Unquantized inputs (scale null) that are all BF16 values: an FP8 linear may then take each
  // product and add as one fmaf (the product of a BF16 and an E4M3 value is exact; kernels.cu,
  // fp8_kb_parts). Set by the producer that guarantees it (attention()'s layout for wo_a).
  bool bf16 = false;
};
// Floats of one group of K inputs in the interleaved layout (K/32 blocks rounded up to 32).
__host__ __device__ constexpr int64_t interleaved_k(int64_t K) { return (K / 32 + 31) / 32 * 1024; }
// Bytes of one row of K inputs as byte planes: 3·32 bytes a K-block, K/32 rounded up to 32.
__host__ __device__ constexpr int64_t interleaved_planes(int64_t K) { return 3 * interleaved_k(K); }
// Lays out rows × groups × K inputs of x (row stride x_stride) into xq [rows][groups·interleaved_k(K)]
// for the linears, quantized (scales into xs [rows][groups·K/32]) when quantize: once, for every
// linear that reads them. With rope.cs set, each row's values (head vectors of rope.dim from the row's
// start) are first rotated as rope(x, …, rope.sign, rope.r) would, in registers only: x is not
// written (the inverse rope of the attention output, fused into wo_a's input).
LinearInput linear_input(const float* x, int64_t x_stride, int64_t rows, int64_t K, bool quantize, float* xq,
                         float* xs, cudaStream_t s, int groups = 1, const FusedRope& rope = {});
// The layout a producer wrote through `sink` for rows of K inputs (what linear_input would return).
LinearInput sink_input(const InputSink& sink, int64_t K);
// A second linear of the same inputs, run in the same launch (its own weights, outputs and y).
struct Fp8Pair {
  const uint8_t* W = nullptr;
  const uint8_t* Ws = nullptr;
  int64_t out = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
};
// y[r][o] = Σ_kb s_x[r][kb]·s_w[o/32][kb]·Σ x·w (scales 1 for unquantized inputs); y rows have
// stride y_stride. W may be a row slice of a larger weight. With pair.W, the pair's linear too.
// tile_sm > 0: where k_fp8_gemv_tiles takes the linear, at most tile_sm of its blocks an SM (the tests
// use it to vary which warp takes which tiles; capping wq_b's grid beside the indexer measured no gain,
// docs/perf.md v39).
void fp8_linear(const uint8_t* W, const uint8_t* Ws, int64_t out, int64_t K, const LinearInput& in, int64_t rows,
                float* y, int64_t y_stride, bool r, cudaStream_t s, const Fp8Pair& pair = {}, int tile_sm = 0);
// `groups` independent products in one launch (the grouped o-projection): group g uses weight rows
// [g·out, (g+1)·out) (out a multiple of 32), inputs g·K.. of each row, outputs g·out.. of each row.
// With sink.xq set, y is also laid out through sink as the next linear's input (one group of
// groups·out inputs: linear_input's arithmetic), by the kernel itself where its shape allows (one row,
// DSUF_WOB_INPUT=fused|fused_late: fp8_sink_mode() 1|2), else by linear_input after it.
void fp8_linear_groups(const uint8_t* W, const uint8_t* Ws, int groups, int64_t out, int64_t K,
                       const LinearInput& in, int64_t rows, float* y, int64_t y_stride, bool r, cudaStream_t s,
                       const InputSink& sink = {}, int tile_sm = 0);
// DSUF_WOB_INPUT=fused|separate|fused_late (1|0|2): wo_b's input laid out by wo_a's kernel (1, the
// default since v34: its dependents triggered at entry; 2: at its end) or by a linear_input launch
// between them (0).
int fp8_sink_mode();
// The second weights of a grouped FP4 pair (w1 and w3 of the experts) and their outputs.
struct Fp4Pair {
  const uint8_t* const* W = nullptr;
  const uint8_t* const* Ws = nullptr;
  float* y = nullptr;
};
// Grouped FP4 linear (experts): row r uses expert ids[r]'s weights and input row r / x_div; with
// pair.W, the same for the pair's weights into pair.y, in the same launch. Quantized inputs (in.scale)
// must come with their byte planes (in.planes): the blocks are exact integer sums (docs/numerics.md §3).
// Rows grouped by expert (group_rows), for many rows at once (prefill chunks, large batches): order
// holds the rows sorted by expert, groups [expert, first, count] of at most kRowGroup consecutive
// order entries of one expert, *n_groups of them (at most max_groups = group_bound(rows, experts)).
constexpr int kRowGroup = 8;
struct RowGroups {
  int32_t* order = nullptr;
  int32_t* groups = nullptr;
  int32_t* n_groups = nullptr;
  int64_t max_groups = 0;
  int64_t rows = 0, experts = 0;  // what group_rows was given
  int size = kRowGroup;           // the most rows a group (kRowGroup, or imma_row_group's)
};
int64_t group_bound(int64_t rows, int experts, int size = kRowGroup);
// Builds g from ids[0..rows) (experts 0..experts-1) in groups of at most `size` rows, one block; g's
// buffers hold rows, 3·rows and 1 int32.
void group_rows(const int32_t* ids, int64_t rows, int experts, RowGroups& g, cudaStream_t s, int size = kRowGroup);
// The group size (2) at which fp4_linear_grouped and fp4_swiglu_grouped run tiled experts several
// routed rows a block (k_fp4_imma<…, kRows>: each stage's weights decoded once for the group), or 0:
// a row at a time. DSUF_EXPERT_ROWS=auto (pairs from as many routed rows as experts) | 1 | 2.
int imma_row_group(int64_t rows, int experts);
// tiled: the experts' weights are laid out as fp4_tile_in_place leaves them (the matrices it tiles:
// det::fp4_tileable), read by k_fp4_imma<…, true> (one row at a time) and k_fp4_mma_rows<true> (groups).
void fp4_linear_grouped(const uint8_t* const* W, const uint8_t* const* Ws, const int32_t* ids, int64_t out,
                        int64_t K, const LinearInput& in, int x_div, int64_t rows, float* y, bool r, cudaStream_t s,
                        const Fp4Pair& pair = {}, const RowGroups* groups = nullptr, bool tiled = false);
// Whether the routed experts' E2M1 weights are to be laid out at load as k_fp4_imma<…, true>'s tiles
// (core/fp4_dp4a.h, det::fp4_tiled_offset): by default wherever the model allows it (quantized
// activations, experts not split by width), DSUF_FP4=tiled requires it, any other DSUF_FP4 keeps
// the checkpoint's row-major layout.
enum class Fp4TiledWish { kNo, kWhereAllowed, kRequired };
Fp4TiledWish fp4_tiled_wanted();
// Rewrites one row-major E2M1 matrix [out, K/2] as tiles when det::fp4_tileable(out, K) (else leaves
// it), through `scratch` (out·K/2 bytes), on stream s.
void fp4_tile_in_place(uint8_t* W, int64_t out, int64_t K, uint8_t* scratch, cudaStream_t s);
// FP32 product with a BF16 weight; y = W·x (optionally BF16-rounded). One row and at least 16,384
// outputs (the head): a persistent stream, one block an SM (k_bf16_stream, DSUF_BF16_STREAM).
// fl: the weights' Bf16FmaLimits (bf16_fma_limits below; core/bf16_fma.h): with them the head's form
// of 8 rows a block (k_bf16_wide: ≥ 16,384 outputs, ≥ 8 rows) takes each product and add as one fmaf
// on the blocks whose staged input rows qualify — the same bits; the default {} never does, nor the
// other forms (measured no faster: session 44).
void bf16_linear(const uint16_t* W, int64_t out, int64_t K, const float* x, int64_t x_stride, int64_t rows,
                 float* y, int64_t y_stride, bool r, cudaStream_t s, Bf16FmaLimits fl = {});
// The limits of a BF16 matrix of n values on the device (a scan of its exponents; synchronizes s:
// call it when the weights are loaded, not in a captured step). {} when DSUF_BF16_FMA=off.
Bf16FmaLimits bf16_fma_limits(const uint16_t* W, int64_t n, cudaStream_t s);
// Interleaved RoPE on the last 2·half values of each head vector; row i rotates by cs[i][half][cos,sin]
// (computed on the host by model/rope.h, the same values the CPU reference uses).
void rope(float* x, int64_t rows, int heads, int64_t dim, const float* cs, int half, float sign, bool r,
          cudaStream_t s);
// The reference's FP8 fake-quant per 32 values in place (rounded by r). With rope.cs set, rope()
// first (x is rope.heads·rope.dim values a row), in the same launch: the quantizer sees the rotated,
// rounded values, exactly as rope() then fp8_fake_quant() (the window KV of a layer).
void fp8_fake_quant(float* x, int64_t n, bool r, cudaStream_t s, const FusedRope& rope = {});
// ---- Per-row metadata: a step's rows may come from several sequences (a prefill chunk is rows of
// one sequence; a decode step one row per sequence). Rows of one sequence are consecutive and in
// position order.
constexpr int kMaxKvSources = 8;
struct RowMeta {
  int64_t pos;    // absolute position of the row's token
  int32_t seq;    // index into the step's SeqMeta table
  int32_t write;  // 1: this row's window KV goes into the ring (the last W rows of its sequence)
};
struct SeqMeta {
  uint8_t* window;                  // the sequence's window pools, [layer][W][entry bytes]
  uint8_t* ckv[kMaxKvSources];      // packed compressed entries per KV source
  uint8_t* ikey[kMaxKvSources];     // packed indexer keys per KV source
  int64_t P;                        // position of the sequence's first row in this step
  int32_t row0, n;                  // its rows in this step
};
// One compressed entry to emit (from a KV source layer): w < 0 means nothing to do (fixed-size job
// lists keep graph-captured grids constant).
struct EmitJob {
  int64_t w;
  const float* pending;  // the sequence's buffered tokens before this step ([ratio][2·hd] FP32)
  int32_t seq, pending_n;
  int32_t cs_row;        // row of the entry's cos/sin in the entry table
  int32_t pad;
};
struct PendingJob {
  const float* in;
  float* out;
  int32_t seq, pending_n, keep, pad;
};

// Writes the rows flagged `write` into their sequence's ring of layer `layer` (slot = pos mod W).
void pack_window(const float* kv, int rows, const RowMeta* meta, const SeqMeta* seqs, int layer, int64_t hd, int W,
                 cudaStream_t s);

struct AttentionArgs {
  const float* q;         // [rows][H][hd]; not yet rotated when q_rope.cs is set
  const float* kv_chunk;  // [rows][hd] this step's window KV (fake-quantized)
  const RowMeta* meta;
  const SeqMeta* seqs;
  int layer, src;         // src: KV source slot of this layer (−1: window only)
  const int32_t* sel;     // [rows][sel_stride] selected entries, −1 padded (or null)
  int sel_stride;
  // With picks (top_k_picks' unsorted selection, [rows][sel_stride], 0 padded): gather_keys places
  // each pick's key at its rank in (score desc, index asc) and writes the sorted selection to sel_out
  // (the buffer sel points at; its −1 padding top_k_picks wrote). Null: sel is sorted already.
  const uint64_t* picks = nullptr;
  int32_t* sel_out = nullptr;
  // Set: keys already holds the selected entries' keys past each row's window (an earlier layer of
  // the same pass gathered the same source slot's entries by the same selection): gather_keys
  // decodes the window only.
  bool window_only = false;
  const float* sink;      // [H]
  float* out;             // [rows][H][hd]
  float* keys;            // workspace [rows][kmax][hd]: the row's keys decoded once for all heads
  float* att;             // workspace [rows][H][kmax]: attention logits
  int kmax;               // W + sel_stride
  int rows, H, W;
  int64_t hd;
  bool r;
  FusedRope q_rope = {};  // set: the logits kernel rotates the queries it stages (q itself stays as it is)
  // Set (o_sink.xq): the output is laid out as the next linear's input instead of written to out,
  // exactly as linear_input(out, H·hd, rows, o_group, o_sink.quantize, o_sink.xq, o_sink.xs, s,
  // H·hd / o_group, o_rope) would (wo_a's input: its groups of o_group values, the inverse rope).
  InputSink o_sink = {};
  int64_t o_group = 0;
  FusedRope o_rope = {};
  bool w_early = false;  // attention() sets it: the P·V kernel loads the sinks before its wait (DSUF_W_EARLY)
  // attention() sets them: the logits / P·V kernel lets the next kernel launch at its end (after its
  // loop) instead of at its entry (DSUF_LOGITS_TRIGGER=late|entry, DSUF_PV_TRIGGER=entry|late).
  bool logits_late = false, pv_late = false;
  // attention() sets it: 16-byte copies for the queries (logits) and the logits (P·V) where aligned
  // (DSUF_ATT_STAGE=16; the default 4 — v27 measured 16 +0.02 ms a step). The same values either way.
  bool stage16 = false;
  // attention() sets it (DSUF_PV_KEYS_EARLY=1, the default since v28): the P·V kernel stages its keys'
  // 32-dim slice and counts the row's keys before its dependency wait. gather_keys wrote them at least
  // two launches back, and the logits kernel between triggers this one only after its own wait, which
  // waited for gather_keys too. (The logits kernel reading its first key before its wait, where
  // gather_keys is its direct prerequisite, was measured slower and broke the TP=2 decode: v28.)
  bool pv_keys_early = false;
  // attention() sets it for the logits kernel (DSUF_ATT_BULK=q|off, q by default since v40): its 8
  // heads' queries staged by one bulk copy (the copy engine) completing on an mbarrier, instead of a
  // cp.async per 4 or 16 bytes from every thread. Where the source is not 16-byte aligned, as before.
  bool bulk = false;
  // attention() sets them under DSUF_ATT_TRACE (a diagnostic; att_trace_init): the logits and P·V
  // kernels' blocks stamp their phases (%globaltimer) into a ring, a ticket a block.
  unsigned long long* trace = nullptr;
  unsigned* trace_tickets = nullptr;
  bool exp_nb = false;  // attention() sets it (DSUF_PV_EXP=nb, the default): the P·V softmax by det::fexp_nb
  // Tests: the P·V form by its index in DSUF_PV's names after auto (0 warps, 1 cp, 2 tiles, 3 cpw)
  // instead of DSUF_PV's choice; −1: DSUF_PV's.
  int pv_form = -1;
};
// DSUF_ATT_TRACE=FILE: att_trace_init (outside any capture) allocates the attention kernels' phase
// ring; att_trace_dump writes it to FILE, a line a block: kernel (0 logits, 1 P·V), ticket, grid
// size, then the kernel's stamps in ns (0 where a phase did not run). Both do nothing without it.
// Only the device att_trace_init first ran on is traced (under tensor parallelism: the first rank).
void att_trace_init();
void att_trace_dump();
// DSUF_WHATIF=piece,… (a timing diagnostic; the step's results are WRONG with any set): those pieces
// of each layer are left out of the step — their launches not enqueued, so whatever reads their
// outputs reads what an earlier step left there — so that the step's time without a piece, in place,
// bounds what making that piece free could gain (docs/perf.md, session 39). whatif() reads the
// variable once and says on stderr that results are wrong; an unknown piece throws.
enum WhatIf : uint32_t {
  kWhatIfMix = 1u << 0,        // both mHC mixes (hc_mix)
  kWhatIfSinkhorn = 1u << 1,   // the mixes' Sinkhorn at 1 iteration instead of hc_sinkhorn_iters
  kWhatIfLogits = 1u << 2,     // the attention logits kernel
  kWhatIfPv = 1u << 3,         // the softmax + P·V kernel
  kWhatIfGather = 1u << 4,     // gather_keys
  kWhatIfQnorm = 1u << 5,      // q_norm + kv_norm (rmsnorm2)
  kWhatIfWqA = 1u << 6,        // wq_a + wkv
  kWhatIfWqB = 1u << 7,        // wq_b
  kWhatIfWoA = 1u << 8,        // wo_a
  kWhatIfWoB = 1u << 9,        // wo_b
  kWhatIfRouter = 1u << 10,    // the router's linear (the route reads an earlier step's scores)
  kWhatIfW13 = 1u << 11,       // the routed experts' w1/w3 (with their SwiGLU)
  kWhatIfW2 = 1u << 12,        // the routed experts' w2
  kWhatIfShared = 1u << 13,    // the shared expert (w1/w3, SwiGLU, w2)
  kWhatIfFfnCollapse = 1u << 14,  // the FFN site's expansion + collapse + norm
};
uint32_t whatif();
// Gathers the keys, then the logits, then softmax and P·V: k_attention_pv, or k_attention_pv_tiles with
// DSUF_PV=tiles (read once; both equal the reference). With o_sink set, returns the layout it wrote
// (the P·V kernel writes it itself when hd % 32 == 0 and H % 8 == 0; otherwise a linear_input
// launch follows), else {}. gathered: gather_keys(a, ·) already ran (on a stream s waits for).
LinearInput attention(const AttentionArgs& a, cudaStream_t s, bool gathered = false);
// The keys a row attends (window ∪ selected compressed entries), decoded into a.keys: attention()'s
// first launch, on its own for a side stream (it needs only the KV and the selection).
void gather_keys(const AttentionArgs& a, cudaStream_t s);

struct CompressArgs {
  const float* ag;        // [rows][2·hd] this step's a‖g (FP32)
  const EmitJob* jobs;
  int n_jobs;
  const SeqMeta* seqs;
  int src, ratio;
  int64_t hd, ihd;
  const uint16_t* norm;   // compressor.norm [hd]
  const uint16_t* wk;     // indexer.wk [ihd][hd]
  const uint16_t* k_norm; // indexer.k_norm [ihd]
  const float* cs;        // [entry rows][half][cos,sin] (compress RoPE at each entry's position)
  int half;
  float eps;
  bool r;
};
void compress_emit(const CompressArgs& a, cudaStream_t s);
// pending' = the last `keep` tokens of pending ++ the sequence's rows.
void update_pending(const float* ag, const PendingJob* jobs, int n_jobs, const SeqMeta* seqs, int ratio, int64_t hd,
                    cudaStream_t s);

// Indexer queries (rotated, FP32) to the reference's FP4 fake-quant kept as codes, blocks of 32:
// codes[i] = 2·E2M1 value (−12..12), scales[i/32] the block's power-of-two scale (fp4_pow2_scale).
// With rope.cs set, the queries are first rotated as rope() would (one launch fewer; x stays as it is).
void index_q_quant(const float* x, int64_t n, int8_t* codes, float* scales, cudaStream_t s,
                   const FusedRope& rope = {});
// Indexer scores, the reference's order (docs/numerics.md §3): per entry and head the dot in blocks
// of 32, each exact from the integer code sum (det::fp4_block_dot), added in order; the head terms
// added in head order. index_head_dim must be 128; keys 68 B per entry.
struct IndexScoreArgs {
  const int8_t* qc;          // [rows][IH][ihd] query codes (index_q_quant)
  const float* qs;           // [rows][IH][ihd/32] query block scales
  const float* wts;          // [rows][IH] weights_proj output (FP32)
  const RowMeta* meta;
  const SeqMeta* seqs;
  int src;
  int64_t max_entries;       // bound over the rows (grid-stride loop up to it)
  int rows, IH, ratio;
  int64_t ihd;
  const uint8_t* cand_mask;  // [rows][mask_stride] or null
  int64_t mask_stride;
  int block;                 // candidate_block_size
  float* scores;             // [rows][score_stride]
  int64_t score_stride;
  bool r;
};
void index_scores(const IndexScoreArgs& a, cudaStream_t s);
// Block scores for the candidate source: max over `block` entries, the newest block forced to +inf.
void candidate_block_scores(const float* scores, int64_t score_stride, int rows, const RowMeta* meta, int ratio,
                            int block, float* bscores, int64_t b_stride, cudaStream_t s);
// Candidate buffers of the multi-block top-k (topk_plan.h). val == nullptr: the single-block kernel.
struct TopkScratch {
  float* val = nullptr;    // [slots] candidate values
  int32_t* idx = nullptr;  // [slots] their row indices
  int64_t slots = 0;       // capacity (launch_groups never needs more)
  int64_t max_count = 0;   // a bound on every row's count in the launches (groups per row come from it)
  int64_t min_chunk = 0;   // smallest chunk (topk::kDefaultChunk; DSUF_TOPK_CHUNK)
};
// Per row: the k largest finite values of row[0..count), count = (pos+1)/ratio (block > 0: in blocks
// of `block`), ties to the lower index, sorted by (value desc, index asc); rows padded with −1.
// One block per row (k_top_k), or, given scratch and rows of at least 2·min_chunk, each row split
// over several blocks (k_top_k_chunks) and their picks merged (k_top_k_merge): the same output.
void top_k(const float* x, int64_t stride, int rows, const RowMeta* meta, int ratio, int block, int k, int32_t* out,
           int out_stride, cudaStream_t s, const TopkScratch& scratch = {});
// top_k's selection without its sort (v27, DSUF_TOPK_RANK=gather): picks[row][0, want) the rows' picks
// (topk_plan.h pick: (key << 32) | ~index) in no particular order, 0 after; out[row][want, out_stride)
// −1, out[row][0, want) left for gather_keys (AttentionArgs::picks), which places each pick at its
// rank, spread over its blocks, instead of one block per row sorting 512 picks on one SM.
// out_stride ≥ k. Returns false, having run top_k (sorted into out; picks untouched), where the
// rows take the multi-block path.
// how: kBlock one block a row (k_top_k); kCluster a cluster of 8 blocks a row (k_top_k_cluster: each an
// eighth of the row, for rows up to 131,072 entries with scratch.max_count set to their bound and
// k ≥ 1, else kBlock's path); kAuto DSUF_TOPK_PICKS=cluster|block (default cluster since v29).
enum class TopkPicks { kAuto, kBlock, kCluster };
bool top_k_picks(const float* x, int64_t stride, int rows, const RowMeta* meta, int ratio, int k, uint64_t* picks,
                 int32_t* out, int out_stride, cudaStream_t s, const TopkScratch& scratch = {},
                 TopkPicks how = TopkPicks::kAuto);
void mask_from_selection(const int32_t* sel, int sel_stride, int n, uint8_t* mask, int64_t mask_stride,
                         cudaStream_t s);
// mask_from_selection of top_k's selection, without its order: mask[row][j] = 1 for the selected j,
// 0 elsewhere in [0, mask_stride). One kernel a row, no sort, when top_k would use one block a row;
// otherwise top_k into sel (out_stride k) and mask_from_selection.
void top_k_mask(const float* x, int64_t stride, int rows, const RowMeta* meta, int ratio, int block, int k,
                int32_t* sel, uint8_t* mask, int64_t mask_stride, cudaStream_t s, const TopkScratch& scratch = {});

// Gathers rows of X and pre (for the head).
void gather_rows(const float* X, const float* pre, const int32_t* rows, int n, int hc, int64_t D, float* Xo,
                 float* preo, cudaStream_t s);

// MoE routing per token: sqrt(softplus(logit/temp)) scores, top-k of score + bias (bias_vl for
// image tokens), weights normalized (+1e-20) and scaled.
void route(const float* logits, int n, int E, int k, const float* bias, const float* bias_vl,
           const uint8_t* image, float temp, float route_scale, int32_t* ids, float* w, cudaStream_t s);
// h1[row] = bf16(weight[row]·silu(min(h1,L))·clamp(h3,±L)) (clamps when clamp); also laid out for
// the next linear through sink when set (F % 32 == 0).
void swiglu(float* h1, const float* h3, int64_t rows, int64_t F, const float* weight, float limit, bool clamp,
            bool r, cudaStream_t s, const InputSink& sink = {});
// The routed experts' w1 and w3 (a grouped FP4 pair) then swiglu(h1, h3, …, sink): with tiled weights
// at up to 32 routed rows (DSUF_SWIGLU=auto, the default since v35; `fused`: up to 128, `separate`:
// never), one k_fp4_imma launch whose blocks take w1's and w3's same rows and end with SwiGLU's
// arithmetic on them (h into h1 and through sink; h3 is not written), else the two launches.
void fp4_swiglu_grouped(const uint8_t* const* W1, const uint8_t* const* S1, const uint8_t* const* W3,
                        const uint8_t* const* S3, const int32_t* ids, int64_t F, int64_t K, const LinearInput& in,
                        int x_div, int64_t rows, float* h1, float* h3, bool r, cudaStream_t s, const RowGroups* groups,
                        bool tiled, const float* weight, float limit, bool clamp, const InputSink& sink);
// The FFN site's end: y = bf16(Σ_j y_experts[row·k + j] + y_shared[row]), expanded straight into the
// streams with the mix rows `mix` (as collapse_norm's expansion); y itself is not stored.
void moe_sum_expand(const float* y_experts, int k, const float* y_shared, int n, int hc, int64_t D, const float* mix,
                    int mix_stride, float* X, bool r, cudaStream_t s);

// Engram: gather + dequantize 'rows' table rows per token (table in host-mapped memory).
void engram_gather(const int64_t* row_ids, int n, int rows, const uint8_t* table, const uint8_t* scales,
                   int64_t ehd, float* emb, cudaStream_t s);
void engram_gate(float* X, const float* kv, const uint16_t* qw, const uint16_t* kw, const uint8_t* dead, int n,
                 int hc, int64_t D, float eps, bool r, cudaStream_t s);

void add_rows(float* y, const float* x, int64_t n, cudaStream_t s);  // y += x

// ---- Sampling (sample.cu): core/sampling.h's definition, block-parallel. One job per logits row
// that may be sampled; jobs with on = 0 are skipped (fixed job lists keep graph-captured grids constant).
struct SampleJob {
  SamplingParams params;
  uint64_t draw;
  int32_t row;  // the logits row
  int32_t on;
};
// out[j] = the token of job j. Workspace: max_key [n_jobs], weights [n_jobs][V] FP32.
void sample(const float* logits, int64_t V, const SampleJob* jobs, int n_jobs, uint32_t* max_key, float* weights,
            int32_t* out, cudaStream_t s);
// Checking aid: the serial form (sampling::draw_serial) on one device thread per job, same outputs.
void sample_serial(const float* logits, int64_t V, const SampleJob* jobs, int n_jobs, float* weights, int32_t* out,
                   cudaStream_t s);

// Synthetic weights (benchmarks): raw bytes, E4M3 codes with |value| ≤ 1.875 (no NaN), a constant
// byte, BF16 ≈ N(0, σ²) or ≈ 1, FP32 ≈ N(0, σ²) or 1; deterministic in the seed.
enum class Fill { kBytes, kE4M3, kConstant, kBf16Normal, kBf16One, kF32Normal, kF32One };
// `first`: the index (in elements of the mode: bytes, BF16 or FP32 values) of p[0] within the tensor
// the seed draws, so a slice gets exactly the values a draw of the whole tensor holds there.
void fill_device_synthetic(uint8_t* p, size_t bytes, uint64_t seed, Fill mode, uint8_t constant, float sigma,
                           cudaStream_t s, size_t first = 0);
void fill_host_synthetic(uint8_t* p, size_t bytes, uint64_t seed, Fill mode, uint8_t constant);
// Packed KV entries: the first value_bytes of each entry random (E4M3 codes or raw FP4 bytes), the
// rest (the scales) the constant `scale`.
void fill_entries_synthetic(uint8_t* p, int64_t entries, int64_t entry_bytes, int64_t value_bytes, bool e4m3_values,
                            uint8_t scale, uint64_t seed, cudaStream_t s);

// DSUF_PRIORITY=auto|latency|none: whether the step's latency-bound kernels are launched at the
// greatest priority (the decode graph is then instantiated to honour node priorities); auto, the
// default, is none since session 35 (step_policy.h).
bool latency_priority_on();

// The device's fast conversions (hardware E4M3 code, pow2_ceil and division by a power of two by
// bits) and det::fexp_nb against the exact software ones and det::fexp over every float32 (the
// division: one divisor a float): mismatches [0..3], inputs compared [4..7] (cuda_backend_tests,
// CudaNumerics).
namespace testing {
void fast_conversion_mismatches(unsigned long long out[8]);
}

}  // namespace dsuf::cuda
