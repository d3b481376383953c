#!/usr/bin/env python3
"""scripts/ncu_source.py on a hand-made SASS source page: a straight stretch, a three-instruction loop
run ten times as often, an exit; the loop must be one segment with its shares of the samples and of
the executed instructions, the stall reasons their shares, and a file that is not the source page
must be refused. The same page as ncu prints it (fixed-width columns, header cells wrapped over several
lines: what scripts/kernel-check.sh source writes) must read the same."""
from script_run import run_on_csv

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_wait", "stall_long_sb", "stall_wait (Not Issued)"]
ROWS = [  # source, samples, executed, wait, long_sb
    ("LDC R1, c[0x0][0x28]", 2, 4, 1, 1), ("MOV R2, RZ", 0, 4, 0, 0),
    ("FADD R3, R3, R4", 10, 40, 8, 2), ("LDS R4, [R5]", 6, 40, 0, 6), ("@P0 BRA 0x20", 2, 40, 2, 0),
    ("EXIT", 0, 4, 0, 0),
]


def text(first='"Kernel Name","void k_test<1>(int)"'):
    out = [first, ",".join(f'"{h}"' for h in HEADER)]
    for n, (src, sm, ex, wait, lsb) in enumerate(ROWS):
        out.append(",".join(f'"{v}"' for v in (hex(16 * n), src, sm, sm, ex, wait, lsb, wait)))
    return "\n".join(out) + "\n"


def printed():
    """The page as ncu prints it without --csv: a rule, the kernel's name (wrapped), a rule, the header
    cells wrapped at their column's width, the rows."""
    widths = [18, 30] + [6] * (len(HEADER) - 2)
    rule = " ".join("-" * w for w in widths)
    name = "void k_test<1>(int)"
    out = ["==PROF== Disconnected from process 1", rule,
           "Kernel Name".ljust(18) + " " + name[:12], " " * 19 + name[12:], rule]
    cells = [[h[i:i + w] for i in range(0, len(h), w)] for h, w in zip(HEADER, widths)]
    for k in range(max(len(c) for c in cells)):
        out.append(" ".join((c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)))
    for n, (src, sm, ex, wait, lsb) in enumerate(ROWS):
        vals = (hex(0x7f0000000000 + 16 * n), src, sm, sm, ex, wait, lsb, wait)
        out.append(" ".join(str(v).ljust(w) for v, w in zip(vals, widths)))
    return "\n".join(out) + "\n"


def main():
    p = run_on_csv("ncu_source.py", text(), "--top", "1")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "void k_test<1>(int): 6 instructions, 20 samples, 132 warp instructions executed", lines
    assert lines[1] == "stalls: wait 55.0%, long_sb 45.0%", lines
    assert len(lines) == 4, lines  # the header and the one segment asked for: the loop
    row = lines[3].split()
    assert row[:6] == ["2", "4", "3", "40", "90.0%", "90.9%"], row
    assert lines[3].endswith("FADD R3, R3, R4 / FADD R3, R3, R4"), lines[3]
    p = run_on_csv("ncu_source.py", text())
    assert [l.split()[:2] for l in p.stdout.splitlines()[3:]] == [["0", "1"], ["2", "4"], ["5", "5"]], p.stdout
    p = run_on_csv("ncu_source.py", text(first='"Address","Source"'))
    assert p.returncode != 0 and "not ncu's source page" in p.stderr, (p.returncode, p.stderr)
    csv_out = run_on_csv("ncu_source.py", text()).stdout
    p = run_on_csv("ncu_source.py", printed())
    assert p.returncode == 0, p.stderr
    assert p.stdout == csv_out, (p.stdout, csv_out)
    print("ncu_source: ok")


if __name__ == "__main__":
    main()
