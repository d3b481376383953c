#!/usr/bin/env python3
"""The chain of kernels that sets a decode step's time, from bench_decode --timeline's CSV.

Usage: scripts/critical_path.py timeline.csv [--step N] [--eps US] [--top N]

Reads the records (step, stream, start_us, end_us, name) of one step (default: the middle one) and
walks back from the record that ends last: a record's predecessor on the chain is the record, on
any stream, that ends last at or before its start (+ eps µs; ties go to the same stream). That is
the latency chain only when each kernel starts as soon as its inputs are ready — true with PDL off
(DSUF_PDL=0: each kernel's start follows its predecessor's end); with PDL on a kernel starts early
and the walk is meaningless. Prints the chain's length against the step's span and, per kernel
name, the time on the chain (its records' durations there) and the gaps before them (launch
latency, waits) — what to shorten first.
"""
import argparse
import csv
import sys
from collections import defaultdict


def load(path):
    with open(path, newline="") as f:
        return [
            {"step": int(r["step"]), "stream": r["stream"], "start": float(r["start_us"]), "end": float(r["end_us"]),
             "name": r["name"]}
            for r in csv.DictReader(f)
        ]


def chain(records, eps):
    """Records of the chain, first to last."""
    recs = sorted(records, key=lambda r: r["end"])
    cur = recs[-1]
    out = [cur]
    while True:
        limit = cur["start"] + eps
        best = None
        for r in recs:
            if r is cur or r["end"] > limit or r["end"] <= r["start"] and r["end"] == 0:
                continue
            if r["start"] >= cur["start"]:
                continue  # a predecessor starts before the record it feeds
            if best is None or r["end"] > best["end"] + 1e-9 or (
                    abs(r["end"] - best["end"]) <= 1e-9 and r["stream"] == cur["stream"]):
                best = r
        if best is None:
            return list(reversed(out))
        out.append(best)
        cur = best


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--eps", type=float, default=0.5, help="µs a start may precede its predecessor's end")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv[1:])
    records = load(a.csv)
    if not records:
        print("no records in", a.csv, file=sys.stderr)
        return 1
    steps = sorted({r["step"] for r in records})
    step = a.step if a.step is not None else steps[len(steps) // 2]
    mine = [r for r in records if r["step"] == step and not r["name"].startswith("memcpy")]
    if not mine:
        print("no kernel records in step", step, file=sys.stderr)
        return 1
    # The step proper: from its first kernel after the host's idle time (k_embed) to its last.
    embeds = [r for r in mine if r["name"] == "k_embed"]
    t0 = min(r["start"] for r in (embeds or mine))
    mine = [r for r in mine if r["start"] >= t0 - 1e-9]
    path = chain(mine, a.eps)
    span = max(r["end"] for r in mine) - t0
    busy = defaultdict(float)
    gaps = defaultdict(float)
    count = defaultdict(int)
    prev_end = None
    for r in path:
        busy[r["name"]] += r["end"] - r["start"]
        count[r["name"]] += 1
        if prev_end is not None:
            gaps[r["name"]] += max(0.0, r["start"] - prev_end)
        prev_end = r["end"]
    on = sum(busy.values())
    gap = sum(gaps.values())
    print(f"step {step}: span {span:.1f} µs; chain of {len(path)} records: {on:.1f} µs in kernels + "
          f"{gap:.1f} µs of gaps, from {path[0]['name']} at {path[0]['start'] - t0:.1f} µs")
    print(f"{'kernel':<44} {'on chain':>8} {'µs':>9} {'gaps µs':>8} {'% span':>7}")
    for name in sorted(busy, key=lambda n: -(busy[n] + gaps[n]))[:a.top]:
        print(f"{name[:44]:<44} {count[name]:>8} {busy[name]:>9.1f} {gaps[name]:>8.1f} "
              f"{100 * (busy[name] + gaps[name]) / span:>6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
