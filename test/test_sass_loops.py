#!/usr/bin/env python3
"""dev/sass_report.py's HMMA loops, on hand-written SASS: a backward branch
whose target's code flows back to it is a loop (its instructions per HMMA
counted); the jump back from an out-of-line BRA.DIV fallback (the code that
reconverges a warp before a shuffle, placed after the EXIT) is not, and
neither is one whose range is left by an unpredicated BRA or EXIT. And its
reading of ptxas -v's report of a two-architecture build (build/gpu/check/X.ptxas,
for --built): only the sm_90 entries count.

Usage: test/test_sass_loops.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # test/checks.py
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "dev"))
from checks import Checks  # noqa: E402
import sass_report  # noqa: E402

check = Checks()


def sass(name, body):
    """cuobjdump -sass text of one function from (address, instruction) pairs."""
    lines = [f"\t\tFunction : {name}"]
    lines += [f"        /*{a:04x}*/                   {ins} ;" for a, ins in body]
    return "\n".join(lines) + "\n"


# a loop of 4 instructions, 2 of them HMMA (0x10..0x40), then the exit
LOOP = [(0x00, "MOV R1, R2"), (0x10, "HMMA.16816.F32.BF16 R4, R8, R12, R4"),
        (0x20, "HMMA.16816.F32.BF16 R6, R8, R14, R6"), (0x30, "IADD3 R1, R1, 0x1, RZ"),
        (0x40, "@P0 BRA 0x10"), (0x50, "EXIT")]
# straight-line HMMAs with a BRA.DIV to a fallback after the EXIT that jumps back
DIV = [(0x00, "BRA.DIV UR4, 0x60"), (0x10, "SHFL.BFLY PT, R1, R2, 0x1, 0x1f"),
       (0x20, "HMMA.16816.F32.BF16 R4, R8, R12, R4"), (0x30, "HMMA.16816.F32.BF16 R6, R8, R14, R6"),
       (0x40, "STG.E [R2.64], R4"), (0x50, "EXIT"), (0x60, "WARPSYNC.COLLECTIVE R3, 0x80"),
       (0x70, "SHFL.BFLY P0, R1, R2, 0x1, 0x1f"), (0x80, "BRA 0x20")]
# the same jump back, but the range is left by an unpredicated BRA before it
LEFT = [(0x00, "HMMA.16816.F32.BF16 R4, R8, R12, R4"), (0x10, "BRA 0x40"), (0x20, "MOV R1, R2"),
        (0x30, "BRA 0x00"), (0x40, "EXIT")]

loops = sass_report.mma_loops(sass("loop", LOOP) + sass("div", DIV) + sass("left", LEFT))
check(f"a loop back to its HMMAs is found with 4 instructions / 2 HMMA ({loops['loop']})",
      loops["loop"] == [(4, 2)])
check(f"a BRA.DIV fallback's jump back is no loop ({loops['div']})", loops["div"] == [])
check(f"a backward branch that its target's code never reaches is no loop ({loops['left']})",
      loops["left"] == [])
check("per_mma of the loop is 2.0", sass_report.per_mma(loops["loop"]) == 2.0)

# ptxas -v of an sm_90 + sm_80 build (nvcc's layout): the sm_80 numbers differ, and must not count
PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4kernPf' for 'sm_90'
ptxas info    : Function properties for _Z4kernPf
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 64 bytes smem
ptxas info    : Function properties for _Z1gf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z4kernPf' for 'sm_80'
ptxas info    : Function properties for _Z4kernPf
    16 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compiling entry function '_Z5otherv' for 'sm_80'
ptxas info    : Used 12 registers, used 0 barriers
"""
ptxas = sass_report.parse_ptxas(PTXAS)
check(f"ptxas -v of two architectures: the sm_90 entry's numbers only ({ptxas})",
      ptxas == {"_Z4kernPf": dict(regs=10, stack=8, spill=0, smem=64)})
check.tally("test_sass_loops")
sys.exit(1 if check.failed else 0)
