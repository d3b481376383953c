// How tensor parallelism over the GPUs of one host splits the V4.1 weights (issue 8, docs/tp.md).
// Every matrix product that is split is split BY OUTPUT ROWS, so each output's reduction runs whole
// on one rank in the canonical order and TP=N is bit-identical to TP=1; activations are exchanged
// with all-gathers, never summed across ranks. This file is the one place that knows which tensor
// is sliced how: the CUDA backend loads with it, the memory plan counts with it, and the unit test
// checks that the slices cover every row exactly once for any world size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace dsuf {

struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const RowRange&) const = default;
};

// Splits [0, total) into `world` contiguous ranges in rank order, each a whole number of
// `align`-sized units (the last may end at `total`), sizes differing by at most one unit. Throws
// when a rank would get nothing.
std::vector<RowRange> split_rows(int64_t total, int world, int64_t align, const char* what);

// How the routed experts are split (DSUF_TP_EXPERTS=ep|width; ep by default):
//   kExpert  whole experts, round robin (EP): a token's rows are computed by their experts' owners and
//            exchanged (cuda::gather_expert_rows);
//   kWidth   every expert on every rank, split by output rows: w1/w3 rows `ffn` (the intermediate
//            width), w2 rows `hidden`; the intermediate is all-gathered before w2, w2's output after.
enum class ExpertSplit { kExpert, kWidth };
ExpertSplit expert_split_from_env();

struct TpPartition {
  int world = 1, rank = 0;
  ExpertSplit experts_by = ExpertSplit::kExpert;
  std::vector<RowRange> ffn;  // kWidth: rows of the routed experts' w1/w3 (moe_intermediate_size)
  // Per rank. Attention: output groups of wo_a, and the query heads that feed them (H/G per group).
  std::vector<RowRange> groups, heads;
  std::vector<RowRange> hidden;  // wo_b output rows (32-row blocks)
  std::vector<RowRange> vocab;   // head rows
  int64_t o_lora_rank = 0, head_dim = 0;

  // Routed experts: round robin. The shared expert of a layer: whole on one rank, rotating by layer.
  bool width_experts() const { return experts_by == ExpertSplit::kWidth; }
  bool owns_expert(int e) const { return width_experts() || e % world == rank; }
  int expert_owner(int e) const { return e % world; }
  int shared_owner(int layer) const { return layer % world; }
  bool owns_shared(int layer) const { return shared_owner(layer) == rank; }

  const RowRange& my_groups() const { return groups[rank]; }
  const RowRange& my_heads() const { return heads[rank]; }
  const RowRange& my_hidden() const { return hidden[rank]; }
  const RowRange& my_vocab() const { return vocab[rank]; }
  const RowRange& my_ffn() const { return ffn[rank]; }
  // Columns of the gathered wo_a output ([rows][G·o_lora_rank]) each rank writes.
  std::vector<RowRange> group_cols() const;

  // Throws (naming the dimension) when `world` ranks cannot split this model: more ranks than
  // output groups, hidden blocks or vocabulary rows.
  static TpPartition make(const TextConfig& t, int world, int rank, ExpertSplit experts = expert_split_from_env());
};

// Which rows of a physical tensor (first dimension, as stored) a rank holds.
struct TensorSlice {
  bool present = true;  // false: another rank owns it (an expert, a shared expert)
  bool sliced = false;  // true: only rows [rows.begin, rows.end) of the first dimension
  RowRange rows;
};
TensorSlice tensor_slice(const TpPartition& p, const std::string& name, const std::vector<int64_t>& shape);

}  // namespace dsuf
