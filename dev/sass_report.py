#!/usr/bin/env python3
"""SASS facts of the sm_90 build: one row per kernel (__global__ function).

Compiles train_gpt.cu and train_llama3.cu, or the --source FILE.cu given (one
or more times), with nvcc for sm_90 as a single-GPU build (no MPI, no NCCL)
into a temporary folder, with -c: the SASS is that of the linked program, and
a probe .cu without main() works too. --built PROG (one or more times) reads a
program the Makefile already built instead (build/gpu/check/X, whose rule keeps
ptxas -v's report beside it as PROG.ptxas; its sm_90 part is used), so that
make test compiles each trainer once. The rows of all the sources make one
table. From ptxas -v: registers, spills, stack frame, static shared memory; from
cuobjdump -elf: the __launch_bounds__ block size (EIATTR_MAX_THREADS); from
cuobjdump -sass: counts of tensor-core, ldmatrix, cp.async and 16-byte global
instructions.

--check then asserts, one PASS/FAIL line each, ending "sass_report: N passed,
M failed" (exit 1 on failure): there is at least one kernel whose name contains
"attention"; each uses tensor cores (HMMA/HGMMA > 0) and cp.async (LDGSTS > 0);
none at HS = 64 or 128 spills; each has an innermost loop (a backward
branch's address range, if the code at its target flows back to it) that issues
HMMAs, and every such loop at HS = 64 or 128 runs at most --max-per-mma N
instructions per HMMA (default MAX_PER_MMA; the issue budget that keeps the
tensor cores fed is 7). Names are matched as displayed: demangled, with
no namespaces or parameters. Convention: HS is a kernel's FIRST INTEGER TEMPLATE
ARGUMENT (attention_forward_kernel<64>, attn_fwd<bf16, 64, true>: HS 64); a
kernel whose HS can't be found is checked for spills anyway. Every other kernel
whose first template argument is 4 or 8 (a 16-byte Packed access, see
llmc/kernels/cuda_common.h) must issue LDG.128, must not spill, and must not store 2
bytes at a time (STG.U16: a Packed store split by the compiler).

cuobjdump and the nvdisasm it runs for -sass: $CUOBJDUMP/$NVDISASM, $CUDA_HOME/bin,
PATH, or the pip wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm
(nvidia/cu13/bin/). Without them --check prints a SKIP line and a 0/0 tally
(exit 0); --tools prints where they are (exit 1 if not found).
"""
import argparse
import collections
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
ARCH = "sm_90"
FLAGS = ["-O3", "-std=c++17", "-I.", f"-arch={ARCH}", "-Xptxas", "-v"]  # the sm_90 build, without MPI
# sm_90 limits for the occupancy column
REGS_PER_SM, REG_UNIT, THREADS_PER_SM, BLOCKS_PER_SM = 65536, 256, 2048, 32
NAME_W = 40
COLS = [("regs", 4), ("spill", 6), ("stack", 5), ("smem", 6), ("thr", 5), ("blk/SM", 6), ("MMA", 5),
        ("LDSM", 5), ("LDGSTS", 6), ("LDG128", 6), ("STG128", 6), ("STG16", 5), ("instrs", 7), ("I/MMA", 5)]
DEFAULT_SOURCES = ["train_gpt.cu", "train_llama3.cu"]
# instructions per HMMA in every HS 64/128 attention loop: the issue budget that keeps the tensor
# cores fed (issue 24's target); the worst loop, the document-masked forward's at HS 64, runs 6.4
MAX_PER_MMA = 7
SKIP_TOOLS = "SKIP sass report: cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"


def die(msg):
    print(f"error: {msg}")
    sys.exit(1)


def find_tool(name):
    """$NAME, $CUDA_HOME/bin, PATH, then the pip wheels' nvidia/*/bin."""
    env = os.environ.get(name.upper())
    candidates = [env] if env else []
    candidates += [os.path.join(CUDA_HOME, "bin", name), shutil.which(name)]
    spec = importlib.util.find_spec("nvidia")
    for d in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(glob.glob(os.path.join(d, "*", "bin", name)))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def default_nvcc():
    candidates = (os.environ.get("NVCC"), os.path.join(CUDA_HOME, "bin", "nvcc"), "/usr/local/cuda/bin/nvcc")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), "nvcc")


def compile_source(nvcc, src, out_dir, index=0):
    """Compiles src to the object kernels<index>.o in out_dir; returns (object path, ptxas log)."""
    obj = os.path.join(out_dir, f"kernels{index}.o")
    p = subprocess.run([nvcc] + FLAGS + ["-c", src, "-o", obj], capture_output=True, text=True)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        tail = "\n".join(log.strip().splitlines()[-15:])
        die(f"nvcc failed on {src} (exit {p.returncode}):\n{tail}")
    return obj, log


def parse_ptxas(log):
    """{mangled: {regs, stack, spill, smem}} for every sm_90 entry function (a log of a build for
    several architectures names the one each entry is compiled for; the others' are skipped)."""
    kernels, entry, arch_ok = {}, None, True
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'(?: for '(\w+)')?", line):
            arch_ok = m.group(2) in (None, ARCH)
            entry = kernels.setdefault(m.group(1), dict(regs=0, stack=0, spill=0, smem=0)) if arch_ok else None
        elif m := re.search(r"Function properties for (\S+)", line):
            entry = kernels.get(m.group(1)) if arch_ok else None  # None for a non-inlined device function
        elif entry is not None and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                                                   r"(\d+) bytes spill loads", line)):
            entry["stack"], entry["spill"] = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        elif entry is not None and (m := re.search(r"Used (\d+) registers", line)):
            entry["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            entry["smem"] = int(s.group(1)) if s else 0
    return kernels


def cuobjdump(tool, flag, obj, nvdisasm):
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    p = subprocess.run([tool, flag, "-arch", ARCH, obj], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        die(f"cuobjdump {flag} failed: {(p.stdout + p.stderr).strip()[-500:]}")
    return p.stdout


def parse_max_threads(elf):
    """{mangled: threads} from each kernel's .nv.info EIATTR_MAX_THREADS (or REQNTID)."""
    threads, kernel, want = {}, None, False
    for line in elf.splitlines():
        if line.startswith("."):
            m = re.match(r"\.nv\.info\.(\S+)$", line)
            kernel = m.group(1) if m else None
        elif kernel and re.search(r"EIATTR_(MAX_THREADS|REQNTID)\b", line):
            want = True
        elif want and line.strip().startswith("Value:"):
            x, y, z = (int(v, 16) for v in line.split()[1:4])
            threads[kernel], want = x * y * z, False
    return threads


def count_sass(sass):
    """{mangled: Counter} of instruction classes per function."""
    counts, cur = {}, None
    for line in sass.splitlines():
        if m := re.match(r"\s*Function : (\S+)", line):
            cur = counts.setdefault(m.group(1), collections.Counter())
        elif cur is not None and (m := re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)):
            parts = m.group(1).split(".")
            op = parts[0]
            if op == "NOP":
                continue  # padding after the last branch
            cur["instrs"] += 1
            cur["MMA"] += op in ("HMMA", "HGMMA")
            cur["LDSM"] += op == "LDSM"
            cur["LDGSTS"] += op == "LDGSTS"
            cur["LDG128"] += op == "LDG" and "128" in parts
            cur["STG128"] += op == "STG" and "128" in parts
            cur["STG16"] += op == "STG" and ("U16" in parts or "S16" in parts)
    return counts


def mma_loops(sass):
    """{mangled: [(instrs, hmma)]}: the innermost loops that issue HMMAs, one pair per loop.

    A loop is the address range [target, branch] of a backward branch (BRA whose target is at or
    before it) that the target's code reaches again: the jump back from out-of-line code (the
    BRA.DIV fallback that reconverges a warp before a shuffle) is no loop. Innermost means no other
    HMMA-issuing loop lies inside its range. NOPs not counted."""
    code, cur = {}, None
    for line in sass.splitlines():
        if m := re.match(r"\s*Function : (\S+)", line):
            cur = code.setdefault(m.group(1), [])
        elif cur is not None and (m := re.match(r"\s*/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)",
                                               line)):
            op = m.group(3).split(".")[0]
            if op != "NOP":
                t = re.search(r"\b0x([0-9a-f]+)", m.group(4)) if op == "BRA" else None
                cur.append((int(m.group(1), 16), op, int(t.group(1), 16) if t else None,
                            bool(m.group(2)) or m.group(3) not in ("BRA", "EXIT")))
    loops = {}
    for fn, ins in code.items():
        ranges = {(t, a) for a, op, t, _ in ins if t is not None and t <= a and reaches(ins, t, a)}
        with_mma = [(lo, hi) for lo, hi in ranges if any(lo <= a <= hi and op == "HMMA" for a, op, _, _ in ins)]
        inner = [r for r in with_mma if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in with_mma)]
        loops[fn] = [(sum(lo <= a <= hi for a, *_ in ins), sum(lo <= a <= hi and op == "HMMA" for a, op, *_ in ins))
                     for lo, hi in sorted(inner)]
    return loops


def reaches(ins, start, goal):
    """Whether control flow from address `start` reaches the instruction at `goal`. Successors: the
    next instruction (except after an unpredicated BRA or EXIT; BRA.DIV is conditional) and a branch
    target."""
    index = {a: i for i, (a, *_) in enumerate(ins)}
    todo, seen = [index.get(start)], set()
    while todo:
        i = todo.pop()
        if i is None or i in seen or i >= len(ins):
            continue
        seen.add(i)
        a, op, t, falls_through = ins[i]
        if a == goal:
            return True
        if falls_through:
            todo.append(i + 1)
        if t is not None:
            todo.append(index.get(t))
    return False


def per_mma(loops):
    """The worst instructions-per-HMMA over a kernel's innermost HMMA loops (0.0: none)."""
    return max((n / k for n, k in loops), default=0.0)


def split_top(s, sep):
    """Splits s at sep where not inside <> or ()."""
    out, depth, start, i = [], 0, 0, 0
    while i < len(s):
        if depth == 0 and s.startswith(sep, i):
            out.append(s[start:i])
            start = i = i + len(sep)
            continue
        depth += (s[i] in "<(") - (s[i] in ">)")
        i += 1
    return out + [s[start:]]


def short_name(demangled):
    """'void ns::k<64>(float*, int)' -> 'k<64>': no return type, namespaces or parameters."""
    name = demangled[5:] if demangled.startswith("void ") else demangled
    return split_top(split_top(name, "(")[0], "::")[-1]


def template_args(name):
    return split_top(name[name.index("<") + 1:name.rindex(">")], ",") if "<" in name else []


def head_size(name):
    """The first integer template argument (the HS convention), else None."""
    for arg in template_args(name):
        if m := re.fullmatch(r"\s*(-?\d+)[uUlL]*\s*", arg):  # c++filt: 64, 64u, 64l, 64ul
            return int(m.group(1))
    return None


def fit(name, width):
    """Shortens to width, keeping the template arguments (they tell instantiations apart)."""
    if len(name) <= width:
        return name
    base, targs = (name[:name.index("<")], name[name.index("<"):]) if "<" in name else (name, "")
    inner = targs[1:-1]
    while len(targs) > width // 2 and "<" in inner:  # nested template arguments collapse first
        inner = re.sub(r"<[^<>]*>", "\0", inner)
        targs = "<" + inner.replace("\0", "<..>") + ">"
    keep = max(width - len(targs) - 2, 4)
    return (base[:keep] + ".." + targs)[:width]


def demangle(names):
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def blocks_per_sm(regs, threads):
    """Blocks per SM that registers and threads allow (registers per warp rounded up to 256)."""
    if not threads:
        return "n/a"
    warps = -(-threads // 32)
    reg_warps = REGS_PER_SM // (-(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT)
    return str(min(reg_warps // warps, THREADS_PER_SM // (warps * 32), BLOCKS_PER_SM))


def make_row(ptxas, name, threads, counts, loops):
    row = dict(ptxas, name=name, thr=threads or "n/a", loops=loops)
    row["I/MMA"] = f"{per_mma(loops):.1f}" if loops else "-"
    row["blk/SM"] = blocks_per_sm(ptxas["regs"], threads)
    row.update({c: counts.get(c, 0) for c in ("MMA", "LDSM", "LDGSTS", "LDG128", "STG128", "STG16", "instrs")})
    return row


def print_table(rows, src):
    print(f"# sm_90 SASS of {src}: regs per thread; spill = spill store+load bytes; stack = frame bytes;")
    print("# smem = STATIC shared bytes (ptxas; dynamic smem is a launch parameter, not included);")
    print("# thr = __launch_bounds__ block size; blk/SM = blocks per SM allowed by registers and threads alone;")
    print("# MMA = HMMA+HGMMA, LDSM = ldmatrix, LDGSTS = cp.async, LDG128/STG128 = 16-byte global loads/stores;")
    print("# STG16 = 2-byte global stores;")
    print("# instrs = SASS instructions (NOPs not counted); I/MMA = instructions per HMMA of the worst innermost")
    print("# loop that issues HMMAs (loop = backward-branch range that flows back to the branch; '-': no such loop).")
    print(f"{'kernel':<{NAME_W}}" + "".join(f" {c:>{w}}" for c, w in COLS))
    for r in rows:
        print(f"{fit(r['name'], NAME_W):<{NAME_W}}" + "".join(f" {str(r[c]):>{w}}" for c, w in COLS))
    for r in rows:
        if "attention" in r["name"]:
            for i, (n, k) in enumerate(r["loops"]):
                print(f"# {r['name']}: HMMA loop {i}: {n} instructions / {k} HMMA = {n / k:.1f} per HMMA")


def check(rows, max_per_mma):
    results = []
    attn = [r for r in rows if "attention" in r["name"]]
    results.append((bool(attn), f"{len(attn)} attention kernel(s) found (need at least one)"))
    for r in attn:
        n, hs = r["name"], head_size(r["name"])
        results.append((r["MMA"] > 0, f"{n}: tensor cores (HMMA/HGMMA {r['MMA']} > 0)"))
        results.append((r["LDGSTS"] > 0, f"{n}: cp.async (LDGSTS {r['LDGSTS']} > 0)"))
        results.append((bool(r["loops"]), f"{n}: an innermost loop issues HMMAs ({len(r['loops'])} found)"))
        if r["loops"] and hs in (64, 128, None):
            worst = per_mma(r["loops"])
            results.append((worst <= max_per_mma,
                            f"{n}: instructions per HMMA in its loops {worst:.1f} <= {max_per_mma:g}"))
        if hs in (64, 128, None):
            results.append((r["spill"] == 0, f"{n}: no spills (HS {'?' if hs is None else hs}: {r['spill']} bytes)"))
    # the memory-bound kernels' 16-byte instantiations (Packed<T, N> with N = 8 bf16 or 4 fp32, the first
    # template argument) must issue 16-byte loads, none of them may spill, and none may store 2 bytes at a
    # time (a Packed store the compiler split, having lost its alignment)
    packed = [r for r in rows if "attention" not in r["name"] and head_size(r["name"]) in (4, 8)]
    results.append((bool(packed), f"{len(packed)} kernel(s) with 16-byte accesses found (need at least one)"))
    for r in packed:
        results.append((r["LDG128"] > 0 and r["spill"] == 0 and r["STG16"] == 0,
                        f"{r['name']}: 16-byte loads (LDG.128 {r['LDG128']} > 0), no spills ({r['spill']} bytes), "
                        f"no 2-byte stores (STG.U16 {r['STG16']})"))
    for ok, msg in results:
        print(("PASS " if ok else "FAIL ") + msg)
    failed = sum(not ok for ok, _ in results)
    print(f"sass_report: {len(results) - failed} passed, {failed} failed")
    return failed == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvcc", help="default: $NVCC, $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc, PATH")
    ap.add_argument("--source", action="append",
                    help="a .cu to report on, may be repeated (default: " + " and ".join(DEFAULT_SOURCES) + ")")
    ap.add_argument("--built", action="append", metavar="PROG",
                    help="a program built with -Xptxas -v whose report is PROG.ptxas, may be repeated (instead of --source)")
    ap.add_argument("--check", action="store_true", help="assert the attention kernels' SASS facts")
    ap.add_argument("--max-per-mma", type=float, default=MAX_PER_MMA, metavar="N",
                    help="with --check, assert at most N instructions per HMMA in every attention HMMA loop "
                         f"at HS 64 and 128 (default {MAX_PER_MMA:g})")
    ap.add_argument("--tools", action="store_true", help="print where cuobjdump and nvdisasm are")
    args = ap.parse_args()
    tools = {t: find_tool(t) for t in ("cuobjdump", "nvdisasm")}
    if args.tools:
        for t, path in tools.items():
            print(f"{t}: {path or 'not found'}")
        sys.exit(0 if all(tools.values()) else 1)
    if not all(tools.values()):
        if args.check:
            print(SKIP_TOOLS + "\nsass_report: 0 passed, 0 failed")
            sys.exit(0)
        die("cuobjdump or nvdisasm not found: python3 -m pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    nvcc = shutil.which(args.nvcc or default_nvcc())
    if not nvcc and not args.built:
        die(f"nvcc not found ({args.nvcc or default_nvcc()}): pass --nvcc PATH or set NVCC or CUDA_HOME")
    if args.built and args.source:
        die("--built and --source: give one or the other")
    sources = args.built or args.source or DEFAULT_SOURCES
    for src in sources + [f"{b}.ptxas" for b in args.built or []]:
        if not os.path.isfile(src):
            die(f"no such file: {src}")
    rows, seen = [], set()
    with tempfile.TemporaryDirectory(prefix="sass_report.") as tmp:
        for i, src in enumerate(sources):
            if args.built:
                obj = src
                with open(f"{src}.ptxas") as f:
                    log = f.read()
            else:
                obj, log = compile_source(nvcc, src, tmp, i)
            elf = cuobjdump(tools["cuobjdump"], "-elf", obj, tools["nvdisasm"])
            sass = cuobjdump(tools["cuobjdump"], "-sass", obj, tools["nvdisasm"])
            kernels, threads, counts = parse_ptxas(log), parse_max_threads(elf), count_sass(sass)
            loops = mma_loops(sass)
            if not kernels:
                die(f"ptxas -v reported no {ARCH} entry functions for {src}")
            names = demangle(list(kernels))
            rows += [make_row(k, short_name(names[m]), threads.get(m), counts.get(m, {}), loops.get(m, []))
                     for m, k in kernels.items() if m not in seen]  # a kernel two sources share: one row
            seen.update(kernels)
    rows.sort(key=lambda r: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", r["name"])])
    print_table(rows, ", ".join(sources))
    if args.check:
        sys.exit(0 if check(rows, args.max_per_mma) else 1)


if __name__ == "__main__":
    main()
