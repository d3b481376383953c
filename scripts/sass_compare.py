#!/usr/bin/env python3
"""Kernel SASS, read two ways (session 20, docs/perf.md v34): what a source change did to every kernel,
and what one kernel's main loop spends its instructions on.

  scripts/sass_compare.py diff OLD NEW [--grep S]
      kernel by kernel (by mangled name): identical, the same but for constant-bank offsets (a global's
      address, a parameter appended after the others), or different (with both instruction counts);
      then the kernels only one side has. The check before a GPU call that a change left the kernels
      already checked on the GPU as they were.
  scripts/sass_compare.py loop SASS --grep S [--unit IMMA] [--per 4]
      for each kernel whose demangled name contains S: the loop (a backward branch and its target)
      densest in --unit instructions among those holding at least --per of them, its instructions
      per --per of them (k_fp4_imma: 4 IMMAs a stage) and the opcode mix per the same.

OLD, NEW and SASS are `cuobjdump -sass` output, - for stdin, or a CUDA binary, object or library (read
as scripts/wait_loads.py reads them).
"""
import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wait_loads  # noqa: E402
from wait_loads import demangle, read_sass  # noqa: E402


def kernels(text):
    """{mangled name: [(address, predicate, opcode, operands)]} in file order."""
    return wait_loads.kernels(text.splitlines())


def text_of(body, offsets=False):
    """The instructions without addresses; offsets: constant-bank operands c[b][o] as c[]."""
    ins = [f"{p} {op} {args}" for _, p, op, args in body]
    return [re.sub(r"c\[0x[0-9a-f]+\]\[[^\]]*\]", "c[]", i) for i in ins] if offsets else ins


def diff(old, new, grep):
    a, b = kernels(old), kernels(new)
    names = [n for n in b if n in a]
    shown = dict(zip(names, demangle(names)))
    rows = collections.Counter()
    for n in names:
        if grep not in shown[n]:
            continue
        if text_of(a[n]) == text_of(b[n]):
            rows["identical"] += 1
        elif text_of(a[n], True) == text_of(b[n], True):
            rows["offsets"] += 1
            print(f"offsets   {shown[n]}")
        else:
            rows["differ"] += 1
            print(f"differ    {len(a[n])} -> {len(b[n])}  {shown[n]}")
    for side, only in (("old only", [n for n in a if n not in b]), ("new only", [n for n in b if n not in a])):
        for n in demangle(only):
            if grep in n:
                rows[side] += 1
                print(f"{side}  {n}")
    print(f"identical {rows['identical']}, constant offsets only {rows['offsets']}, different {rows['differ']}, "
          f"old only {rows['old only']}, new only {rows['new only']}")
    return 0


def main_loop(body, unit, per):
    """(first, last) indices of the loop (a backward branch to its target) densest in `unit`
    instructions among those holding at least `per` of them (more of them on a tie), or None. By
    density, not count: a retry stub placed after the code branches back into it, and the span from its
    target to the stub holds the loop's units and more, thinned by everything else in between."""
    index = {addr: i for i, (addr, *_) in enumerate(body)}
    best = None
    for i, (addr, _, op, args) in enumerate(body):
        m = re.search(r"0x([0-9a-f]+)\s*$", args) if op.startswith("BRA") else None
        j = index.get(int(m.group(1), 16)) if m else None
        if j is None or j > i:
            continue
        n = sum(1 for x in body[j:i + 1] if x[2].split(".")[0] == unit)
        key = (n / (i - j + 1), n)
        if n >= per and (best is None or key > best[0]):
            best = (key, j, i)
    return best and best[1:]


def loop(text, grep, unit, per):
    ks = kernels(text)
    found = 0
    for name, shown in zip(ks, demangle(list(ks))):
        if grep not in shown:
            continue
        span = main_loop(ks[name], unit, per)
        if not span:
            continue
        found += 1
        body = ks[name][span[0]:span[1] + 1]
        groups = sum(1 for x in body if x[2].split(".")[0] == unit) / per
        mix = collections.Counter(x[2].split(".")[0] for x in body)
        print(f"{shown}\n  loop {len(body)} instructions, {groups:g} × {per} {unit}: {len(body) / groups:.2f} a group")
        print("  " + " ".join(f"{op} {n / groups:.2f}" for op, n in mix.most_common()))
    if not found:
        print(f"sass_compare: no kernel matching {grep!r} has a loop with {unit}", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("diff")
    d.add_argument("old")
    d.add_argument("new")
    d.add_argument("--grep", default="")
    lp = sub.add_parser("loop")
    lp.add_argument("sass")
    lp.add_argument("--grep", required=True)
    lp.add_argument("--unit", default="IMMA")
    lp.add_argument("--per", type=int, default=4)
    a = ap.parse_args()
    if a.cmd == "diff":
        return diff(read_sass(a.old), read_sass(a.new), a.grep)
    return loop(read_sass(a.sass), a.grep, a.unit, a.per)


if __name__ == "__main__":
    sys.exit(main())
