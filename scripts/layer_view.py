#!/usr/bin/env python3
"""One decoder layer of a decode step in place, from bench_decode --timeline's CSV.

Usage: scripts/layer_view.py timeline.csv [--step N] [--layer L] [--median]

A layer starts with its attention site's collapse (the 2L-th k_collapse_norm launch of the step in
start order, counting from 0) and ends where layer L + 1's starts; the head's collapse (the last
one) closes the last layer. Prints every record of the step that starts in that span — start and end
in µs from the layer's first collapse, duration, stream, name — in start order, then the span. With
PDL on, a kernel's start is its launch (its blocks wait at griddepcontrol.wait); the ends are what
the chain is read from (docs/perf.md v23–v25 read the layers this way).

--median: layer L's records, each with the median start and end (from its layer's first collapse)
over the step's layers that launch the same kernels as many times (an indexer layer's medians come
from the indexer layers, the others' from the others), the k-th launch of a kernel matched with the
k-th — one layer's jitter out of the reading (docs/perf.md v46 read its in-place numbers so).
"""
import argparse
import statistics
import sys

from critical_path import load  # the timeline CSV's records (scripts/ is the first import path)


def layer_records(records, step, layer):
    rows = sorted((r for r in records if r["step"] == step), key=lambda r: r["start"])
    collapses = [i for i, r in enumerate(rows) if r["name"].startswith("k_collapse_norm")]
    if 2 * layer >= len(collapses):
        raise SystemExit(f"step {step} has {len(collapses)} collapses: no layer {layer}")
    first = collapses[2 * layer]
    last = collapses[2 * layer + 2] if 2 * layer + 2 < len(collapses) else len(rows)
    return rows[first:last], rows[first]["start"]


def keyed(rows):
    """Each record keyed by (name, its occurrence among the layer's records of that name)."""
    seen = {}
    out = []
    for r in rows:
        k = seen.get(r["name"], 0)
        seen[r["name"]] = k + 1
        out.append(((r["name"], k), r))
    return out


def print_medians(records, step, layer, rows):
    n_layers = sum(1 for r in records if r["step"] == step and r["name"].startswith("k_collapse_norm")) // 2
    shape = sorted(k for k, _ in keyed(rows))
    times = {}  # key -> [(start, end)] from each layer's first collapse
    like = []
    for l in range(n_layers):
        lrows, t0 = layer_records(records, step, l)
        if sorted(k for k, _ in keyed(lrows)) != shape:
            continue
        like.append(l)
        for key, r in keyed(lrows):
            times.setdefault(key, []).append((r["start"] - t0, r["end"] - t0))
    print(f"step {step}, layer {layer}'s {len(rows)} records: medians over {len(like)} of {n_layers} layers "
          f"with the same launches")
    print(f"{'start':>8} {'end':>8} {'µs':>7}  stream  name")
    for key, r in keyed(rows):
        ts = times[key]
        s, e = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
        d = statistics.median(t[1] - t[0] for t in ts)
        print(f"{s:8.1f} {e:8.1f} {d:7.1f}  {r['stream']:>6}  {key[0][:80]}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, help="default: the middle step")
    ap.add_argument("--layer", type=int, default=20)
    ap.add_argument("--median", action="store_true", help="medians over the step's layers of the same records")
    a = ap.parse_args()
    records = load(a.csv)
    steps = sorted({r["step"] for r in records})
    if not steps:
        raise SystemExit("no records")
    step = a.step if a.step is not None else steps[len(steps) // 2]
    rows, t0 = layer_records(records, step, a.layer)
    if a.median:
        return print_medians(records, step, a.layer, rows)
    print(f"step {step}, layer {a.layer}: {len(rows)} records")
    print(f"{'start':>8} {'end':>8} {'µs':>7}  stream  name")
    for r in rows:
        print(f"{r['start'] - t0:8.1f} {r['end'] - t0:8.1f} {r['end'] - r['start']:7.1f}  {r['stream']:>6}  {r['name'][:80]}")
    print(f"span: {max(r['end'] for r in rows) - t0:.1f} µs to the last end")


if __name__ == "__main__":
    sys.exit(main())
