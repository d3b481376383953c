#!/usr/bin/env python3
"""Where a kernel's time goes, from Nsight Compute's SASS source view as CSV.

Usage: scripts/ncu_source.py source.csv [--top N]
The page: `ncu --import K.ncu-rep --page source --print-source sass --csv` of one kernel profiled with
the SourceCounters section (its first line names the kernel, its second is the header), or the same
page as ncu prints it without --csv — what `scripts/kernel-check.sh source` writes: fixed-width
columns under a rule of dashes, each header cell wrapped over several lines. Prints the
kernel, its instructions, warp-stall samples and executed warp instructions; the stall reasons with
the most samples; then the segments with the most samples — a segment is a run of consecutive
instructions executed equally often (a loop's body, a straight stretch between branches), so a
loop shows as one row: its first and last instruction index, length, how often each instruction
ran, its share of the samples and of the executed instructions, its first instruction and the one
with the most samples. Session 25 read k_attention_pv this way (docs/perf.md v39).
"""
import argparse
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def count(text):
    try:
        return int(float(text.replace(",", ""))) if text else 0
    except ValueError:
        return 0


def load_fixed(text):
    """(kernel name, header, rows) of ncu's printed (fixed-width) source page, or None if it is not one.
    The last rule of dashes before the first instruction row gives the columns; a header cell is the
    concatenation of its slices of the lines between that rule and the first row."""
    lines = text.split("\n")
    first = next((n for n, l in enumerate(lines) if l.startswith("0x")), None)
    rules = [n for n, l in enumerate(lines[:first or 0]) if l.startswith("---") and set(l) <= {"-", " "}]
    if first is None or not rules:
        return None
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[rules[-1]])]
    header = ["".join(l[a:b] for l in lines[rules[-1] + 1:first]).strip() for a, b in spans]
    header = [" ".join(h.split()) for h in header]
    name_at = next((n for n, l in enumerate(lines[:rules[-1]]) if l.startswith("Kernel Name")), None)
    kernel = "?"
    if name_at is not None:
        a = spans[1][0] if len(spans) > 1 else len("Kernel Name")
        parts = [lines[name_at][a:].strip()]
        for l in lines[name_at + 1:]:
            if l.startswith("---") or not l.startswith(" "):
                break
            parts.append(l.strip())
        kernel = "".join(parts)
    rows = [[l[a:b].strip() for a, b in spans] for l in lines[first:] if l.startswith("0x")]
    return kernel, header, rows


def load(path):
    """(kernel name, header, rows) of the page (CSV or printed)."""
    with open(path, newline="") as f:
        text = f.read()
    if not text.startswith('"'):
        fixed = load_fixed(text)
        if fixed is not None:
            kernel, header, rows = fixed
            for col in ("Source", SAMPLES, EXECUTED):
                if col not in header:
                    raise SystemExit(f"{path}: no column {col!r} (profile with --section SourceCounters)")
            return kernel, header, rows
    lines = list(csv.reader(text.splitlines()))
    if len(lines) < 2 or not lines[0] or lines[0][0] != "Kernel Name":
        raise SystemExit(f"{path}: not ncu's source page (its first line should name the kernel)")
    header = lines[1]
    for col in ("Source", SAMPLES, EXECUTED):
        if col not in header:
            raise SystemExit(f"{path}: no column {col!r} (profile with --section SourceCounters)")
    return lines[0][1] if len(lines[0]) > 1 else "?", header, [r for r in lines[2:] if len(r) == len(header)]


def segments(rows, ix):
    """Runs of consecutive rows with the same executed count: dicts with start, end, executed (a row),
    samples (summed) and the first and busiest rows' source."""
    out = []
    for n, r in enumerate(rows):
        ex, sm = count(r[ix[EXECUTED]]), count(r[ix[SAMPLES]])
        if out and out[-1]["executed"] == ex:
            seg = out[-1]
            seg["end"] = n
            seg["samples"] += sm
            if sm > seg["top_samples"]:
                seg["top_samples"], seg["top"] = sm, r[ix["Source"]].strip()
        else:
            out.append({"start": n, "end": n, "executed": ex, "samples": sm, "first": r[ix["Source"]].strip(),
                        "top_samples": sm, "top": r[ix["Source"]].strip()})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=12, help="segments to list (default 12)")
    a = ap.parse_args()
    kernel, header, rows = load(a.csv)
    ix = {h: i for i, h in enumerate(header)}
    samples = sum(count(r[ix[SAMPLES]]) for r in rows)
    executed = sum(count(r[ix[EXECUTED]]) for r in rows)
    print(f"{kernel}: {len(rows)} instructions, {samples} samples, {executed} warp instructions executed")
    if samples == 0:
        raise SystemExit("no samples (profile with --section SourceCounters)")
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    totals = sorted(((sum(count(r[ix[s]]) for r in rows), s) for s in stalls), reverse=True)
    print("stalls: " + ", ".join(f"{s[6:]} {100.0 * v / samples:.1f}%" for v, s in totals[:8] if v > 0))
    segs = sorted(segments(rows, ix), key=lambda s: -s["samples"])[: a.top]
    print(f"{'first':>6} {'last':>6} {'len':>5} {'runs':>8} {'samples':>8} {'executed':>8}  first / busiest")
    for s in sorted(segs, key=lambda s: s["start"]):
        n = s["end"] - s["start"] + 1
        print(f"{s['start']:6d} {s['end']:6d} {n:5d} {s['executed']:8d} {100.0 * s['samples'] / samples:7.1f}% "
              f"{100.0 * s['executed'] * n / max(executed, 1):7.1f}%  {s['first'][:40]} / {s['top'][:40]}")


if __name__ == "__main__":
    sys.exit(main())
