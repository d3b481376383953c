#!/usr/bin/env python3
"""Summary of `scripts/kernel-check.sh sets` (or `pair`) output: each setting's gpu ms per round, its
mean and its difference from the first setting (the reference: the defaults in `sets`, binary A in
`pair`), in the order the settings first appear.

Usage: scripts/sets_summary.py LOG [--best MARGIN]
With --best, the last line is the setting whose mean is lowest if it beats the reference by more than
MARGIN ms, else empty (a script can act on it: run the suite with that setting, say). The runs are
`== [SETTING] (round R): ...` (sets) or `== BINARY (round R): ...` (pair), each followed by
bench_decode's result row: context, batch, step ms, gpu ms, ...; a run whose row is missing (a crash, a
timeout) is counted as missing, not as a number.
"""
import argparse
import re
import sys

RUN = re.compile(r"^== (?:\[(?P<set>.*)\]|(?P<bin>\S+)) \(round (?P<round>\d+)\)")


def parse(lines):
    """[(setting, [gpu ms or None per round])] in first-appearance order."""
    order, runs, cur = [], {}, None
    for line in lines:
        m = RUN.match(line)
        if m:
            cur = m.group("set") if m.group("set") is not None else m.group("bin")
            if cur not in runs:
                order.append(cur)
                runs[cur] = []
            runs[cur].append(None)
            continue
        f = line.split()
        if cur is not None and len(f) >= 4 and f[0].isdigit() and f[1].isdigit():
            try:
                runs[cur][-1] = float(f[3])
            except ValueError:
                continue
            cur = None
    return [(k, runs[k]) for k in order]


def mean(values):
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--best", type=float, default=None, metavar="MARGIN")
    args = ap.parse_args()
    with open(args.log, encoding="utf-8", errors="replace") as f:
        sets = parse(f)
    if not sets:
        sys.exit(f"{args.log}: no runs found")
    ref = mean(sets[0][1])
    width = max(len(k) for k, _ in sets)
    for k, values in sets:
        m = mean(values)
        rounds = " / ".join("—" if v is None else f"{v:.3f}" for v in values)
        delta = "" if m is None or ref is None else f"{m - ref:+.3f}"
        print(f"{k:<{width}}  {rounds}  mean {'—' if m is None else f'{m:.4f}'}  {delta}")
    if args.best is not None:
        scored = [(mean(v), k) for k, v in sets[1:] if mean(v) is not None]
        best = min(scored) if scored else None
        print(best[1] if best and ref is not None and best[0] < ref - args.best else "")


if __name__ == "__main__":
    main()
