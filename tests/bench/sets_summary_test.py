#!/usr/bin/env python3
"""scripts/sets_summary.py on hand-made `kernel-check.sh sets` and `pair` logs: the means and
differences from the first setting, a run whose result row is missing counted as missing, and --best
naming a setting only when it beats the reference by more than the margin."""
from script_run import run_on_csv

ROW = "     8192     1      {step:.3f}      {gpu:.3f}    12.929     3.017     47.0%    153.0      0.013\n"


def sets_log(runs):
    """runs: [(setting, round, gpu ms or None)] as kernel-check.sh sets prints them."""
    out = ""
    for name, rnd, gpu in runs:
        out += f"== [{name}] (round {rnd}): --contexts 8192 --batches 1 --steps 30 --warmup 3\n"
        if gpu is not None:
            out += ROW.format(step=gpu + 0.1, gpu=gpu)
        else:
            out += "terminate called after throwing an instance of 'std::runtime_error'\n"
    return out


def run(text, *args):
    return run_on_csv("sets_summary.py", text, *args)


def main():
    log = sets_log([("defaults", 1, 6.40), ("A=1", 1, 6.37), ("B=1 C=2", 1, 6.50),
                    ("defaults", 2, 6.42), ("A=1", 2, 6.39), ("B=1 C=2", 2, None)])
    p = run(log)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [l.split()[0] for l in lines] == ["defaults", "A=1", "B=1"], lines
    assert "6.400 / 6.420" in lines[0] and "mean 6.4100" in lines[0] and lines[0].endswith("+0.000"), lines[0]
    assert "6.370 / 6.390" in lines[1] and "mean 6.3800" in lines[1] and lines[1].endswith("-0.030"), lines[1]
    assert "6.500 / —" in lines[2] and "mean 6.5000" in lines[2] and lines[2].endswith("+0.090"), lines[2]
    p = run(log, "--best", "0.01")
    assert p.stdout.splitlines()[-1] == "A=1", p.stdout
    p = run(log, "--best", "0.05")  # A=1 is only 0.03 better
    assert p.stdout.splitlines()[-1] == "", repr(p.stdout)
    pair = ("== .next80/base/bench_decode (round 1): batch 1 at 8K\n" + ROW.format(step=6.5, gpu=6.47) +
            "== .next80/new/bench_decode (round 1): batch 1 at 8K\n" + ROW.format(step=6.5, gpu=6.44))
    lines = run(pair).stdout.splitlines()
    assert lines[0].startswith(".next80/base/bench_decode") and lines[1].endswith("-0.030"), lines
    p = run("nothing here\n")
    assert p.returncode != 0 and "no runs found" in p.stderr, (p.returncode, p.stderr)
    print("sets_summary: ok")


if __name__ == "__main__":
    main()
