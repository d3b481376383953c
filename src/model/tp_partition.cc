#include "model/tp_partition.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace dsuf {

std::vector<RowRange> split_rows(int64_t total, int world, int64_t align, const char* what) {
  DSUF_CHECK(world >= 1 && align >= 1 && total >= 0);
  const int64_t units = (total + align - 1) / align;
  if (units < world)
    fail("tensor parallelism over ", world, " GPUs: ", what, " (", total, " rows in ", units, " blocks of ", align,
         ") cannot give every GPU a share; use at most ", units, " GPUs");
  std::vector<RowRange> out;
  int64_t u = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t n = units / world + (r < units % world ? 1 : 0);
    out.push_back({std::min(u * align, total), std::min((u + n) * align, total)});
    u += n;
  }
  return out;
}

std::vector<RowRange> TpPartition::group_cols() const {
  std::vector<RowRange> c;
  for (const RowRange& g : groups) c.push_back({g.begin * o_lora_rank, g.end * o_lora_rank});
  return c;
}

ExpertSplit expert_split_from_env() {
  const char* v = std::getenv("DSUF_TP_EXPERTS");
  const std::string m = v ? v : "ep";
  if (m == "ep") return ExpertSplit::kExpert;
  if (m == "width") return ExpertSplit::kWidth;
  fail("DSUF_TP_EXPERTS=", m, ": expected ep or width");
}

TpPartition TpPartition::make(const TextConfig& t, int world, int rank, ExpertSplit experts) {
  if (world < 1 || rank < 0 || rank >= world) fail("tensor parallelism: rank ", rank, " of ", world, " GPUs");
  TpPartition p;
  p.world = world, p.rank = rank, p.experts_by = experts;
  p.o_lora_rank = t.o_lora_rank, p.head_dim = t.head_dim;
  DSUF_CHECK(t.o_groups > 0 && t.num_attention_heads % t.o_groups == 0, "heads not divisible into o_groups");
  // A group's heads feed one wo_a block, so heads go with their group. Uneven group counts are
  // fine (8 groups over 3 GPUs: 3, 3, 2 → 24, 24, 16 of 64 heads).
  p.groups = split_rows(t.o_groups, world, 1, "the attention output groups (o_groups)");
  const int64_t hpg = t.num_attention_heads / t.o_groups;
  for (const RowRange& g : p.groups) p.heads.push_back({g.begin * hpg, g.end * hpg});
  // FP8 weights carry one scale per 32×32 block: row slices start on a block.
  p.hidden = split_rows(t.hidden_size, world, 32, "the hidden rows of wo_b");
  p.vocab = split_rows(t.vocab_size, world, 1, "the vocabulary rows of the head");
  if (experts == ExpertSplit::kWidth)  // FP4 scales are per row: any row split
    p.ffn = split_rows(t.moe_intermediate_size, world, 1, "the routed experts' intermediate rows");
  else
    split_rows(t.n_routed_experts, world, 1, "the routed experts");  // every rank owns one at least
  return p;
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
// Rows of `shape` for a row range of the logical weight: FP8 scales hold one row per 32 rows.
TensorSlice rows_of(const std::string& name, const std::vector<int64_t>& shape, RowRange r, int64_t logical_rows) {
  TensorSlice s;
  s.sliced = true;
  if (ends_with(name, ".scale") && shape[0] != logical_rows) {
    DSUF_CHECK(r.begin % 32 == 0, name, ": slice does not start on a 32-row block");
    s.rows = {r.begin / 32, (r.end + 31) / 32};
  } else {
    s.rows = r;
  }
  return s;
}
}  // namespace

TensorSlice tensor_slice(const TpPartition& p, const std::string& name, const std::vector<int64_t>& shape) {
  if (name == "head.weight") return rows_of(name, shape, p.my_vocab(), p.vocab.back().end);
  if (name.rfind("layers.", 0) != 0) return {};
  const size_t dot = name.find('.', 7);
  const int layer = std::stoi(name.substr(7, dot - 7));
  const std::string rest = name.substr(dot + 1);
  auto is = [&](const char* base) { return rest == std::string(base) + ".weight" || rest == std::string(base) + ".scale"; };
  const int64_t hd = p.head_dim, ol = p.o_lora_rank;
  if (is("attn.wq_b"))
    return rows_of(name, shape, {p.my_heads().begin * hd, p.my_heads().end * hd}, p.heads.back().end * hd);
  if (is("attn.wo_a"))
    return rows_of(name, shape, {p.my_groups().begin * ol, p.my_groups().end * ol}, p.groups.back().end * ol);
  if (is("attn.wo_b")) return rows_of(name, shape, p.my_hidden(), p.hidden.back().end);
  TensorSlice whole;
  if (rest.rfind("ffn.shared_experts.", 0) == 0) whole.present = p.owns_shared(layer);
  if (rest.rfind("ffn.experts.", 0) == 0) {
    if (p.width_experts()) {  // ffn.experts.<e>.w1|w2|w3.weight|scale
      const std::string w = rest.substr(rest.find('.', 12) + 1, 2);
      if (w == "w2") return rows_of(name, shape, p.my_hidden(), p.hidden.back().end);
      return rows_of(name, shape, p.my_ffn(), p.ffn.back().end);
    }
    whole.present = p.owns_expert(std::stoi(rest.substr(12)));
  }
  return whole;
}

}  // namespace dsuf
