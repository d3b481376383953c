#!/usr/bin/env python3
"""One decoder layer of a decode step in place, from bench_decode --timeline's CSV.

Usage: scripts/layer_view.py timeline.csv [--step N] [--layer L]

A layer starts with its attention site's collapse (the 2L-th k_collapse_norm launch of the step in
start order, counting from 0) and ends where layer L + 1's starts; the head's collapse (the last
one) closes the last layer. Prints every record of the step that starts in that span — start and end
in µs from the layer's first collapse, duration, stream, name — in start order, then the span. With
PDL on, a kernel's start is its launch (its blocks wait at griddepcontrol.wait); the ends are what
the chain is read from (docs/perf.md v23–v25 read the layers this way).
"""
import argparse
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, help="default: the middle step")
    ap.add_argument("--layer", type=int, default=20)
    a = ap.parse_args()
    records = load(a.csv)
    steps = sorted({r["step"] for r in records})
    if not steps:
        raise SystemExit("no records")
    step = a.step if a.step is not None else steps[len(steps) // 2]
    rows, t0 = layer_records(records, step, a.layer)
    print(f"step {step}, layer {a.layer}: {len(rows)} records")
    print(f"{'start':>8} {'end':>8} {'µs':>7}  stream  name")
    for r in rows:
        print(f"{r['start'] - t0:8.1f} {r['end'] - t0:8.1f} {r['end'] - r['start']:7.1f}  {r['stream']:>6}  {r['name'][:80]}")
    print(f"span: {max(r['end'] for r in rows) - t0:.1f} µs to the last end")


if __name__ == "__main__":
    sys.exit(main())
