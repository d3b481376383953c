#!/usr/bin/env python3
"""scripts/sass_compare.py on hand-made SASS listings: diff tells identical kernels from ones that differ
only in constant-bank offsets and from ones that really differ, and lists one-sided kernels; loop finds
the loop with the most IMMAs (not the bigger loop around it, not the one with fewer) and counts its
instructions per 4 of them."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OLD = """
		Function : k_same
        /*0000*/                   LDG.E R4, desc[UR6][R2.64] ;
        /*0010*/                   EXIT ;
		Function : k_offset
        /*0000*/                   LDC.64 R6, c[0x4][RZ] ;
        /*0010*/                   EXIT ;
		Function : k_changed
        /*0000*/                   SEL R4, R5, RZ, P0 ;
        /*0010*/                   EXIT ;
		Function : k_gone
        /*0000*/                   EXIT ;
"""
NEW = """
		Function : k_same
        /*0000*/                   LDG.E R4, desc[UR6][R2.64] ;
        /*0010*/                   EXIT ;
		Function : k_offset
        /*0000*/                   LDC.64 R6, c[0x4][0x8] ;
        /*0010*/                   EXIT ;
		Function : k_changed
        /*0000*/                   MOV R4, R5 ;
        /*0010*/                   NOP ;
        /*0020*/                   EXIT ;
		Function : k_new
        /*0000*/                   EXIT ;
"""
LOOPS = """
		Function : k_mma
        /*0000*/                   IMAD R1, R2, R3, RZ ;
        /*0010*/                   IMMA.16832.S8.U8 R4, R8.ROW, R12.COL, RZ ;
        /*0020*/              @P0 BRA 0x10 ;
        /*0030*/                   PRMT R4, R5, R6, R7 ;
        /*0040*/                   IMMA.16832.S8.U8 R4, R8.ROW, R12.COL, RZ ;
        /*0050*/                   IMMA.16832.S8.U8 R4, R8.ROW, R12.COL, R4 ;
        /*0060*/                   PRMT R4, R5, R6, R7 ;
        /*0070*/                   IMMA.16832.S8.U8 R4, R8.ROW, R12.COL, R4 ;
        /*0080*/                   IMMA.16832.S8.U8 R4, R8.ROW, R12.COL, R4 ;
        /*0090*/                   LOP3.LUT R4, R4, 0x7777, RZ, 0xc0, !PT ;
        /*00a0*/              @P1 BRA 0x30 ;
        /*00b0*/              @P2 BRA 0x0 ;
        /*00c0*/                   EXIT ;
"""


def run(*args, files=()):
    paths = []
    try:
        for text in files:
            with tempfile.NamedTemporaryFile("w", suffix=".sass", delete=False) as f:
                f.write(text)
                paths.append(f.name)
        return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sass_compare.py"), args[0], *paths,
                               *args[1:]], capture_output=True, text=True)
    finally:
        for p in paths:
            os.unlink(p)


def main():
    p = run("diff", files=(OLD, NEW))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "offsets   k_offset" in lines, lines
    assert "differ    2 -> 3  k_changed" in lines, lines
    assert "old only  k_gone" in lines and "new only  k_new" in lines, lines
    assert lines[-1] == "identical 1, constant offsets only 1, different 1, old only 1, new only 1", lines
    p = run("diff", "--grep", "k_same", files=(OLD, NEW))
    assert p.stdout.splitlines() == ["identical 1, constant offsets only 0, different 0, old only 0, new only 0"], p.stdout
    # 0x30..0xa0 holds 4 IMMAs in 8 instructions (density 1/2); 0x0..0xb0 all five in 12 (5/12, less
    # dense); 0x10..0x20 one in 2 (1/2, but fewer than --per): the first is the loop.
    p = run("loop", "--grep", "k_mma", files=(LOOPS,))
    assert p.returncode == 0, p.stderr
    assert "loop 8 instructions, 1 × 4 IMMA: 8.00 a group" in p.stdout, p.stdout
    assert "PRMT 2.00" in p.stdout and "LOP3 1.00" in p.stdout, p.stdout
    # PRMT, 2 a group: the same loop (2 in 8) against the outer one (2 in 12).
    p = run("loop", "--grep", "k_mma", "--unit", "PRMT", "--per", "2", files=(LOOPS,))
    assert "loop 8 instructions, 1 × 2 PRMT: 8.00 a group" in p.stdout, p.stdout
    assert "IMMA 4.00" in p.stdout, p.stdout
    # --per above any loop's count: none qualifies.
    p = run("loop", "--grep", "k_mma", "--per", "6", files=(LOOPS,))
    assert p.returncode == 1, p.stdout
    p = run("loop", "--grep", "k_none", files=(LOOPS,))
    assert p.returncode == 1 and "no kernel matching" in p.stderr, p.stderr
    print("sass_compare_test: ok")


if __name__ == "__main__":
    main()
