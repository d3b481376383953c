#!/usr/bin/env python3
"""Per-kernel and per-component breakdown of one decode step from an Nsight Compute CSV.

  ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum --kernel-name regex:'^k_(?!fill)' \
      --csv --log-file ncu.csv build-gpu/bin/bench_decode --contexts 8192 --batches 1 --steps 1 --warmup 0
  python3 bench/ncu_breakdown.py ncu.csv --bw 4250

Prints each kernel's launches, time, share and achieved DRAM read bandwidth, then the same per
component, with the ratio of the achieved bandwidth to --bw (the copy bandwidth bench_decode
measured in its own run). Kernel times under ncu include its per-launch overhead and no overlap,
so the shares are of the serialized kernel time, not of the graph-replayed step.
"""
import argparse
import collections
import csv

COMPONENTS = [  # (component, kernel-name prefixes)
    ("attention core", ("k_attention", "k_gather_keys", "k_pack_window", "k_fp8_fake_quant", "k_rope")),
    ("indexer + compressors", ("k_index_scores", "k_top_k", "k_candidate", "k_mask_from", "k_compress",
                               "k_update_pending", "k_fp4_fake_quant")),
    ("FP8 linears (attention, shared expert, Engram)", ("k_fp8_gemv", "k_act_quant")),
    ("MoE routed experts (FP4)", ("k_fp4_gemv", "k_swiglu", "k_moe_sum")),
    ("head, router, BF16 projections", ("k_bf16_linear", "k_route")),
    ("mHC", ("k_hc_",)),
    ("norms", ("k_rmsnorm",)),
    ("Engram", ("k_engram",)),
    ("embedding, head, sampling", ("k_embed", "k_gather_rows", "k_sample", "k_head")),
]
TIME = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--bw", type=float, required=True, help="measured copy bandwidth, GB/s")
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    h = rows[head]
    k, m, v, u = (h.index(x) for x in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
    t, b, n = collections.defaultdict(float), collections.defaultdict(float), collections.Counter()
    for r in rows[head + 1:]:
        name = r[k].split("(")[0].replace("(anonymous namespace)::", "").split("::")[-1]
        name = name.replace("void ", "")
        val = float(r[v].replace(",", ""))
        if r[m] == "gpu__time_duration.sum":
            t[name] += val * TIME[r[u]]
            n[name] += 1
        else:
            b[name] += val * BYTES.get(r[u], 1)
    total = sum(t.values())
    print(f"serialized kernel time {total / 1e3:.2f} ms, DRAM read {sum(b.values()) / 1e9:.2f} GB")
    print(f"{'kernel':34s} {'launches':>8s} {'us':>9s} {'share':>6s} {'GB/s':>7s} {'% bw':>5s}")
    for name, us in sorted(t.items(), key=lambda x: -x[1]):
        gbs = b[name] / 1e3 / us if us else 0
        print(f"{name[-34:]:34s} {n[name]:8d} {us:9.0f} {100 * us / total:5.1f}% {gbs:7.0f} {100 * gbs / args.bw:4.0f}%")
    print()
    comp_t, comp_b = collections.defaultdict(float), collections.defaultdict(float)
    for name, us in t.items():
        c = next((c for c, prefixes in COMPONENTS if name.startswith(prefixes)), "other")
        comp_t[c] += us
        comp_b[c] += b[name]
    print(f"{'component':48s} {'ms':>7s} {'share':>6s} {'GB read':>8s} {'GB/s':>7s} {'% bw':>5s}")
    for c, us in sorted(comp_t.items(), key=lambda x: -x[1]):
        gbs = comp_b[c] / 1e3 / us if us else 0
        print(f"{c:48s} {us / 1e3:7.2f} {100 * us / total:5.1f}% {comp_b[c] / 1e9:8.3f} {gbs:7.0f} {100 * gbs / args.bw:4.0f}%")


if __name__ == "__main__":
    main()
