#!/usr/bin/env python3
"""scripts/critical_path.py on a hand-made timeline whose chain is known: a side-stream kernel (B)
longer than the main stream's (A) is the one the last kernel (C) waited for."""
import sys

from script_run import run_on_csv

ROWS = [  # step, stream, start, end, name
    (0, 1, 0, 5, "k_embed"), (0, 1, 6, 9, "k_a"),  # step 0: not the middle one
    (1, 1, 0, 0.9, "memcpy HtoD"),
    (1, 1, 100, 110, "k_embed"),
    (1, 1, 111, 120, "k_a"),
    (1, 2, 111, 130, "k_b"),
    (1, 1, 131, 140, "k_c"),
    (2, 1, 0, 5, "k_embed"),
]


def main():
    text = "step,stream,start_us,end_us,name\n" + "".join(f'{r[0]},{r[1]},{r[2]},{r[3]},"{r[4]}"\n' for r in ROWS)
    out = run_on_csv("critical_path.py", text, check=True).stdout
    print(out)
    first = out.splitlines()[0]
    ok = True
    for want in ("step 1:", "span 40.0 µs", "chain of 3 records: 38.0 µs in kernels + 2.0 µs of gaps",
                 "from k_embed at 0.0 µs"):
        if want not in first:
            print("missing:", want)
            ok = False
    names = [line.split()[0] for line in out.splitlines()[2:]]
    if names != ["k_b", "k_embed", "k_c"]:
        print("chain kernels:", names, "expected k_b, k_embed, k_c (k_a is beside the chain)")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
