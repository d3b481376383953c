#!/usr/bin/env python3
"""Which kernels issue global loads before their dependency wait (session 18, docs/perf.md v32).

ptxas moves `griddepcontrol.wait` (SASS: ACQBULK) up within its basic block, so a load written before
pdl_wait() in the source may still be issued after it. This reads `cuobjdump -sass` output (a file, or
`-` for stdin) and prints, per kernel that waits, for each of its waits (a kernel with several code
paths may have one a path) the global loads (LDG, LDGSTS) that can run before it — reached backwards
through the control flow (BRA targets, fall-through, EXIT) without crossing another wait — then the
kernel's name; --expect NAME=MIN (repeatable) fails unless every kernel whose demangled name contains
NAME has a wait with at least MIN loads before it.

  scripts/wait_loads.py build/src/backend/cuda/libdsuf_backend_cuda.a --grep bf16_linear --expect k_bf16_linear=20
  cuobjdump -sass build-gpu/bin/bench_decode | scripts/wait_loads.py - --expect k_hc_mix=1

A binary, object or library (ELF or ar archive) is read through `cuobjdump -sass`: $CUOBJDUMP, else
cuobjdump on PATH, else the one pip's nvidia-cuda-cuobjdump puts beside this interpreter (with
nvidia-cuda-nvdisasm, which it runs; `make pydeps` installs both; this machine's CUDA toolkit has
neither). The CTest cuda_wait_loads runs
this on the CUDA backend's library with the kernels' expectations (tests/backend/CMakeLists.txt).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys


def demangle(names):
    """The demangled names (one c++filt run for all; the names as they are without c++filt)."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                             check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        out = []
    if len(out) != len(names):
        out = list(names)
    return [re.sub(r"\(anonymous namespace\)::|dsuf::cuda::", "", n) for n in out]


INS = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def waits_of(body):
    """body: [(address, predicated, opcode, operands)] of one kernel; the loads before each wait."""
    index = {addr: i for i, (addr, *_) in enumerate(body)}

    def target(op, args):  # a BRA's target instruction index, or None
        m = re.search(r"0x([0-9a-f]+)\s*$", args.strip()) if op.startswith("BRA") else None
        return index.get(int(m.group(1), 16)) if m else None

    leaders = {0}
    for i, (_, _, op, args) in enumerate(body):
        if op.startswith(("BRA", "EXIT")):
            leaders.add(i + 1)
            if target(op, args) is not None:
                leaders.add(target(op, args))
    starts = sorted(x for x in leaders if x < len(body))
    blocks = list(zip(starts, starts[1:] + [len(body)]))
    block_of = {a: k for k, (a, _) in enumerate(blocks)}
    preds = {k: set() for k in range(len(blocks))}
    for k, (a, b) in enumerate(blocks):
        _, pred, op, args = body[b - 1]
        t = target(op, args)
        succ = [] if t is None else [block_of[t]]
        if pred or not (op.startswith("EXIT") or t is not None):  # falls through
            succ.append(k + 1)
        for s in succ:
            if s < len(blocks):
                preds[s].add(k)
    wait = lambda i: body[i][2] == "ACQBULK"

    def back(lo, hi):  # loads in body[lo:hi] after its last wait, and whether it has none
        n, j = 0, hi - 1
        while j >= lo and not wait(j):
            n += body[j][2].startswith(("LDG", "LDGSTS"))
            j -= 1
        return n, j < lo

    out = []
    for k, (a, b) in enumerate(blocks):
        for i in (i for i in range(a, b) if wait(i)):
            n, open_ = back(a, i)  # this block, back to its start or an earlier wait
            seen, todo = {k}, list(preds[k]) if open_ else []
            while todo:  # then the blocks that can run before it, each back to its last wait
                p = todo.pop()
                if p in seen:
                    continue
                seen.add(p)
                m, open_ = back(*blocks[p])
                n += m
                if open_:
                    todo.extend(preds[p])
            out.append(n)
    return out


def kernels(lines):
    """{kernel: [(address, predicate ('' when none), opcode, operands)]} in file order."""
    out, cur = {}, None
    for line in lines:
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = INS.match(line)
        if cur is not None and m:
            cur.append((int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return out


def count(lines):
    """{kernel: [loads that can run before each of its waits]} in file order ([]: never waits)."""
    return {k: waits_of(v) for k, v in kernels(lines).items()}


def cuobjdump():
    """The cuobjdump to run (see the module note), or exit with a clear error."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found:
        try:
            import nvidia  # nvidia-cuda-cuobjdump: nvidia/cu*/bin/cuobjdump
            hits = [h for d in nvidia.__path__ for h in sorted(glob.glob(os.path.join(d, "cu*", "bin", "cuobjdump")))]
            found = hits[-1] if hits else None
        except ImportError:
            found = None
    if not found:
        sys.exit("wait_loads: no cuobjdump (set CUOBJDUMP, put it on PATH, or "
                 "`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`)")
    return found


def read_sass(path):
    """SASS text: stdin for -, a text file as it is, a binary through cuobjdump -sass."""
    if path == "-":
        return sys.stdin.read()
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x7fELF") or head.startswith(b"!<arch>"):
        tool = cuobjdump()  # it runs nvdisasm, which pip puts beside it
        env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))
        p = subprocess.run([tool, "-sass", path], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            sys.exit(f"wait_loads: cuobjdump -sass {path} failed: {p.stderr.strip()}")
        return p.stdout
    with open(path) as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass", help="cuobjdump -sass output, - for stdin, or a CUDA binary, object or library")
    ap.add_argument("--grep", default="", help="only kernels whose demangled name contains this")
    ap.add_argument("--expect", action="append", default=[], metavar="NAME=MIN")
    a = ap.parse_args()
    text = read_sass(a.sass)
    waiting = {k: v for k, v in count(text.splitlines()).items() if v}
    rows = list(zip(demangle(list(waiting)), waiting.values()))
    if not rows:
        print("wait_loads: no kernel with a dependency wait in the input", file=sys.stderr)
        return 1
    for name, waits in rows:
        if a.grep in name:
            print(f"{','.join(map(str, waits)):>12}  {name}")
    bad = 0
    for e in a.expect:
        sub, _, low = e.partition("=")
        hits = [(n, max(v)) for n, v in rows if sub in n]
        if not hits:
            print(f"expect {e}: no waiting kernel matches", file=sys.stderr)
            bad += 1
        for n, pre in hits:
            if pre < int(low or 1):
                print(f"expect {e}: {n} loads {pre} before its wait", file=sys.stderr)
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
