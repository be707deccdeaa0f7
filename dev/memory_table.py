#!/usr/bin/env python3
"""The largest micro-batch B per rank at T = 8192 for Llama 3.1 8B on 8 ranks and 70B on 64 ranks,
on 80 GiB and 141 GiB devices, for every ZeRO stage and recompute level the trainer offers: each
cell is the trainer's own `--memory-plan 1 -b auto` (llmc/run/run.h's plan_auto_batch: the plan
the allocation reads, nothing allocated), run under mpirun on the CPU build with the device size
given by CPUCUDA_DEVICE_MEMORY_MB. The stages and levels are read from the trainer's --help.

    python3 dev/memory_table.py [--trainer build/cpu/train_llama3] [--quick]   (make memory-table)

Prints one progress line per plan and the Markdown table of docs/memory.md; --quick plans 8B only.
"""
import argparse
import os
import re
import subprocess
import sys

DEVICES = [("80 GiB", 81920), ("141 GiB", 144384)]
MODELS = [("llama3.1-8b", 8), ("llama3.1-70b", 64)]
T = 8192


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def choices(trainer, flag):
    """The values a flag takes, from its --help line: `-z <0|1|2>`."""
    out = subprocess.run([trainer, "--help"], capture_output=True, text=True).stdout
    m = re.search(r"^\s*" + re.escape(flag) + r" <([0-9|]+)>", out, re.M)
    if not m:
        fail(f"{trainer} --help: no line for {flag} <...>")
    return [int(v) for v in m.group(1).split("|")]


def plan(trainer, model, ranks, zero, recompute, device_mb):
    """(B, total MiB) that -b auto plans, or (0, the error line)."""
    env = dict(os.environ, CPUCUDA_DEVICE_MEMORY_MB=str(device_mb), CPUCUDA_DEVICE_COUNT=str(ranks),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-x", "CPUCUDA_WORKERS=1", "-np", str(ranks), trainer,
           "-e", model, "--memory-plan", "1", "-b", "auto", "-t", str(T), "-z", str(zero), "-r", str(recompute)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    text = p.stdout + p.stderr
    b = re.search(r"^-b auto: B=(\d+)", text, re.M)
    total = re.search(r"^\s+total\s+([0-9.]+) MiB", text, re.M)
    if p.returncode == 0 and b and total:
        return int(b.group(1)), float(total.group(1))
    err = re.search(r"^error: (.*)$", text, re.M)
    if not err:
        fail("%s: no plan and no error line (exit %d):\n%s" % (" ".join(cmd), p.returncode, text[-2000:]))
    if "not even B=1 fits" not in err.group(1):
        fail("%s: %s" % (" ".join(cmd), err.group(1)))
    return 0, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default="build/cpu/train_llama3")
    ap.add_argument("--quick", action="store_true", help="8B only")
    a = ap.parse_args()
    if not os.access(a.trainer, os.X_OK):
        fail(f"{a.trainer} is not built (make {a.trainer})")
    zeros, levels = choices(a.trainer, "-z"), choices(a.trainer, "-r")
    rows = []
    for model, ranks in MODELS[:1] if a.quick else MODELS:
        for zero in zeros:
            # a lower -r keeps more activations and a smaller device holds less: where B = 1 does not
            # fit, it does not fit there either, and is not planned again
            too_big = {mb: False for _, mb in DEVICES}
            cells_of = {}
            for r in sorted(levels, reverse=True):
                cells = []
                for name, mb in sorted(DEVICES, key=lambda d: -d[1]):
                    larger_refused = any(too_big[m] for _, m in DEVICES if m >= mb)
                    B, total = (0, None) if larger_refused else plan(a.trainer, model, ranks, zero, r, mb)
                    too_big[mb] = B == 0
                    print(f"{model} on {ranks} ranks, -z {zero} -r {r}, {name}: "
                          + (f"B = {B} ({total:,.0f} MiB)" if B else "not even B = 1")
                          + (" (a larger device or -r refused it)" if larger_refused else ""), flush=True)
                    cells.append((mb, f"{B} ({total:,.0f})" if B else "-"))
                cells_of[r] = [c for _, c in sorted(cells)]
            for r in levels:
                rows.append([f"`{model}`, {ranks}", str(zero), str(r)] + cells_of[r])
    head = ["model, ranks", "ZeRO", "`-r`"] + [f"largest B on {n} (its total MiB)" for n, _ in DEVICES]
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
