#!/usr/bin/env python3
"""scripts/ncu_source.py on a hand-made SASS source page: a straight stretch, a three-instruction loop
run ten times as often, an exit; the loop must be one segment with its shares of the samples and of
the executed instructions, the stall reasons their shares, and a file that is not the source page
must be refused."""
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
    print("ncu_source: ok")


if __name__ == "__main__":
    main()
