#!/usr/bin/env python3
"""scripts/ncu_table.py on a hand-made Nsight Compute CSV (the shape `kernel-check.sh step` writes:
--csv --page details with gpu__time_duration.sum and dram__bytes_read.sum): launches grouped by
kernel with ncu's name decorations dropped, units converted, rows sorted by total time."""
from script_run import run_on_csv

HEAD = '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
GEMV = "unnamed>::k_fp8_gemv<2, 1, 1, 0>(const unsigned char *, long)"
ROWS = [  # ID, kernel, metric, unit, value
    (0, GEMV, "gpu__time_duration.sum", "usecond", "12.50"),
    (0, GEMV, "dram__bytes_read.sum", "Mbyte", "40.00"),
    (1, "void dsuf::cuda::(anonymous namespace)::k_route(int)", "gpu__time_duration.sum", "nsecond", "6,000"),
    (1, "void dsuf::cuda::(anonymous namespace)::k_route(int)", "dram__bytes_read.sum", "Kbyte", "12.00"),
    (2, GEMV, "gpu__time_duration.sum", "usecond", "7.50"),
    (2, GEMV, "dram__bytes_read.sum", "Gbyte", "0.02"),
]


def main():
    text = "==PROF== Connected to process 1 (bench_decode)\n" + HEAD  # ncu's messages are not rows
    text += "".join(",".join(f'"{v}"' for v in (r[0], 1) + r[1:]) + "\n" for r in ROWS)
    out = run_on_csv("ncu_table.py", text, check=True).stdout
    lines = out.splitlines()
    rows = [l for l in lines if l.startswith("| `")]
    assert lines[0].startswith("3 launches, 26.0 µs in all"), out
    # 40 MB + 20 MB + 12 KB over 26 µs
    assert "DRAM read: 0.060 GB in all, 2308 GB/s" in out, out
    assert rows[0] == "| `k_fp8_gemv<2, 1, 1, 0>` | 2 | 20.0 | 76.9 % | 10.00 | 60.0 | 3000 |", rows
    assert rows[1] == "| `k_route` | 1 | 6.0 | 23.1 % | 6.00 | 0.0 | 2 |", rows
    print("ok")


if __name__ == "__main__":
    main()
