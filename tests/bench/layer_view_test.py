#!/usr/bin/env python3
"""scripts/layer_view.py on a hand-made timeline: two layers (four collapses) and the head's collapse;
layer 1 must hold exactly its own records, in start order, times from its first collapse, and a
layer past the last must be refused. --median on a second timeline: three layers of one shape and a
fourth with one more launch; each record's median comes from the three alike."""
from script_run import run_on_csv

ROWS = [  # step, stream, start, end, name
    (0, 1, 0, 5, "k_collapse_norm<4>"),  # another step: ignored
    (1, 1, 10, 16, "k_collapse_norm<4>"), (1, 1, 12, 20, "k_fp8_gemv<1, 1, true, 2>"),
    (1, 1, 30, 36, "k_collapse_norm<4>"), (1, 2, 31, 50, "k_fp4_imma<4, 16, true>"),
    (1, 1, 60, 66.5, "k_collapse_norm<4>"),  # layer 1 begins
    (1, 3, 62, 75, "k_hc_mix<4>"),
    (1, 1, 61, 70, "k_fp8_gemv<4, 1, true, 0>"),
    (1, 1, 80, 86, "k_collapse_norm<4>"),
    (1, 1, 90, 96, "k_collapse_norm<4>"),  # the head's: closes layer 1
    (1, 1, 97, 120, "k_bf16_linear"),
]


ALIKE = [  # three layers of one shape (collapse, linear, collapse), a fourth with a mix too, the head
    (1, 1, 0, 5, "k_collapse_norm<4>"), (1, 1, 1, 9, "k_fp8_gemv"), (1, 1, 10, 14, "k_collapse_norm<4>"),
    (1, 1, 20, 26, "k_collapse_norm<4>"), (1, 1, 21, 31, "k_fp8_gemv"), (1, 1, 32, 35, "k_collapse_norm<4>"),
    (1, 1, 40, 47, "k_collapse_norm<4>"), (1, 1, 42, 50, "k_fp8_gemv"), (1, 1, 51, 60, "k_collapse_norm<4>"),
    (1, 1, 80, 81, "k_collapse_norm<4>"), (1, 1, 81, 99, "k_fp8_gemv"), (1, 2, 82, 90, "k_hc_mix<4>"),
    (1, 1, 91, 92, "k_collapse_norm<4>"),
    (1, 1, 100, 101, "k_collapse_norm<4>"),
]


def run(*args, rows=ROWS):
    text = "step,stream,start_us,end_us,name\n" + "".join(",".join(f'"{v}"' for v in r) + "\n" for r in rows)
    return run_on_csv("layer_view.py", text, *args)


def main():
    p = run("--step", "1", "--layer", "1")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "step 1, layer 1: 4 records", lines
    body = [l.split() for l in lines[2:-1]]
    assert [b[4] for b in body] == ["k_collapse_norm<4>", "k_fp8_gemv<4,", "k_hc_mix<4>", "k_collapse_norm<4>"], body
    assert body[0][:3] == ["0.0", "6.5", "6.5"] and body[1][:4] == ["1.0", "10.0", "9.0", "1"], body
    assert body[2][3] == "3" and body[3][:2] == ["20.0", "26.0"], body
    assert lines[-1] == "span: 26.0 µs to the last end", lines
    p = run("--step", "1", "--layer", "0")
    assert p.stdout.splitlines()[0] == "step 1, layer 0: 4 records", p.stdout
    p = run("--step", "1", "--layer", "3")
    assert p.returncode != 0 and "no layer 3" in p.stderr, (p.returncode, p.stderr)
    p = run("--step", "1", "--layer", "1", "--median", rows=ALIKE)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "step 1, layer 1's 3 records: medians over 3 of 4 layers with the same launches", lines
    body = [l.split() for l in lines[2:]]
    assert [b[:3] for b in body] == [["0.0", "6.0", "6.0"], ["1.0", "10.0", "8.0"], ["11.0", "15.0", "4.0"]], body
    assert [b[4] for b in body] == ["k_collapse_norm<4>", "k_fp8_gemv", "k_collapse_norm<4>"], body
    p = run("--step", "1", "--layer", "3", "--median", rows=ALIKE)
    assert p.stdout.splitlines()[0] == "step 1, layer 3's 4 records: medians over 1 of 4 layers with the same launches"
    print("layer_view: ok")


if __name__ == "__main__":
    main()
