#!/usr/bin/env python3
"""Per-kernel table of one decode step from Nsight Compute's CSV (ncu --csv --page details).

Usage: scripts/ncu_table.py step.csv [--markdown]
Groups the profiled launches by kernel name (template arguments kept, parameters dropped) and
prints, sorted by total time: launches, total and mean duration (µs), and the launch-weighted
means of DRAM throughput, compute (SM) throughput and achieved occupancy (%), with the share of
the profiled total; with dram__bytes_read.sum profiled (kernel-check.sh step), the bytes each kernel
read from DRAM and their rate instead (the sums over its launches). Durations are ncu's (each kernel alone, caches and clocks as configured), not
the time in place: compare with bench_decode --timeline for that.
"""
import csv
import sys
from collections import defaultdict

UNIT_B = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
WANTED = {"Duration": "dur", "DRAM Throughput": "dram", "Compute (SM) Throughput": "sm", "Achieved Occupancy": "occ",
          # the same as raw metrics (ncu --metrics ...)
          "gpu__time_duration.sum": "dur", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram",
          "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm",
          "sm__warps_active.avg.pct_of_peak_sustained_active": "occ", "dram__bytes_read.sum": "bytes"}


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not CSV rows
    launches = {}  # ID -> (name, {metric: value})
    for row in csv.DictReader(lines):
        name = row.get("Kernel Name", "")
        for noise in ("void ", "(anonymous namespace)::", "dsuf::cuda::", "<unnamed>::", "unnamed>::"):
            name = name.replace(noise, "")
        name = name.split("(")[0].strip()
        metric, value = row.get("Metric Name", ""), number(row.get("Metric Value", ""))
        if not name or metric not in WANTED or value is None:
            continue
        if WANTED[metric] == "dur":
            value *= UNIT_US.get(row.get("Metric Unit", "").strip(), 1.0)
        elif WANTED[metric] == "bytes":
            value *= UNIT_B.get(row.get("Metric Unit", "").strip(), 1.0)
        launches.setdefault(row["ID"], (name, {}))[1][WANTED[metric]] = value
    if not launches:
        print("no launches with a Duration in", argv[1], file=sys.stderr)
        return 1
    agg = defaultdict(lambda: {"n": 0, "dur": 0.0, "dram": 0.0, "sm": 0.0, "occ": 0.0, "bytes": 0.0})
    for name, m in launches.values():
        a = agg[name]
        a["n"] += 1
        a["dur"] += m.get("dur", 0.0)
        for k in ("dram", "sm", "occ", "bytes"):
            a[k] += m.get(k, 0.0)
    total = sum(a["dur"] for a in agg.values())
    if total <= 0:
        print("no launches with a Duration in", argv[1], file=sys.stderr)
        return 1
    print(f"{len(launches)} launches, {total:.1f} µs in all (each kernel alone)\n")
    if any("bytes" in m for _, m in launches.values()):
        read = sum(a["bytes"] for a in agg.values())
        print(f"DRAM read: {read / 1e9:.3f} GB in all, {read / total / 1e3:.0f} GB/s over the summed time\n")
        print("| kernel | launches | total µs | share | mean µs | DRAM MB read | GB/s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, a in sorted(agg.items(), key=lambda kv: -kv[1]["dur"]):
            n = a["n"]
            rate = a["bytes"] / a["dur"] / 1e3 if a["dur"] > 0 else 0.0
            print(f"| `{name}` | {n} | {a['dur']:.1f} | {100 * a['dur'] / total:.1f} % | {a['dur'] / n:.2f} | "
                  f"{a['bytes'] / 1e6:.1f} | {rate:.0f} |")
        return 0
    print("| kernel | launches | total µs | share | mean µs | DRAM % | SM % | occupancy % |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, a in sorted(agg.items(), key=lambda kv: -kv[1]["dur"]):
        n = a["n"]
        print(f"| `{name}` | {n} | {a['dur']:.1f} | {100 * a['dur'] / total:.1f} % | {a['dur'] / n:.2f} | "
              f"{a['dram'] / n:.1f} | {a['sm'] / n:.1f} | {a['occ'] / n:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
