#!/usr/bin/env python3
"""scripts/wait_loads.py on a hand-made SASS listing: the loads before each wait counted from the start
of its path, kernels that never wait left out, and --expect failing when no wait of a kernel has
enough loads before it."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SASS = """
		Function : k_early
        /*0000*/                   LDG.E.128.CONSTANT R4, desc[UR6][R2.64] ;
        /*0010*/              @!P0 LDG.E.128.CONSTANT R8, desc[UR6][R2.64+0x10] ;
        /*0020*/              @P2 BRA 0x50 ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR6][R2.64+0x20] ;
        /*0040*/                   BRA 0x60 ;
        /*0050*/                   LDG.E R20, desc[UR6][R2.64+0x30] ;
        /*0060*/                   ACQBULK ;
        /*0070*/                   LDG.E.128 R12, desc[UR6][R6.64] ;
        /*0080*/              @P1 EXIT ;
        /*0090*/                   LDG.E R16, desc[UR6][R6.64+0x4] ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   LDG.E R16, desc[UR6][R6.64+0x8] ;
        /*00c0*/                   LDG.E R16, desc[UR6][R6.64+0xc] ;
        /*00d0*/                   ACQBULK ;
		Function : k_late
        /*0000*/                   ACQBULK ;
        /*0010*/                   LDG.E.128.CONSTANT R4, desc[UR6][R2.64] ;
        /*0020*/                   LDS.128 R8, [R2] ;
		Function : k_nowait
        /*0000*/                   LDG.E R4, desc[UR6][R2.64] ;
"""


def run(*args):
    with tempfile.NamedTemporaryFile("w", suffix=".sass", delete=False) as f:
        f.write(SASS)
        path = f.name
    try:
        return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "wait_loads.py"), path, *args],
                              capture_output=True, text=True)
    finally:
        os.unlink(path)


def main():
    p = run()
    assert p.returncode == 0, p.stderr
    rows = [l.split() for l in p.stdout.splitlines()]
    # k_early's first wait: the two loads of its block's predecessors' common start, the cp.async of
    # one arm and the load of the other (4: both arms reach it); its second wait: the two loads after
    # the unconditional EXIT (nothing falls through into them), not the first path's after its wait.
    assert rows == [["4,2", "k_early"], ["0", "k_late"]], rows
    assert run("--expect", "k_early=4").returncode == 0
    p = run("--expect", "k_early=5")
    assert p.returncode == 1 and "k_early loads 4 before its wait" in p.stderr, p.stderr
    p = run("--expect", "k_late=1")
    assert p.returncode == 1 and "k_late loads 0" in p.stderr, p.stderr
    p = run("--expect", "k_nowait=1")
    assert p.returncode == 1 and "no waiting kernel matches" in p.stderr, p.stderr
    assert run("--grep", "late").stdout.split() == ["0", "k_late"]
    print("wait_loads: ok")


if __name__ == "__main__":
    main()
