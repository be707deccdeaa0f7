#!/usr/bin/env python3
"""dev/bench_train.cu's Llama 3 numbers against counts made here from the shape
alone: the roofline of Llama 3.2 1B at 16 x 2048 (its published parameter count,
the matmul and attention FLOPs, AdamW's bytes, every bound = max(FLOPs / 989
TFLOP/s, bytes / 4.8 TB/s) and their sum), one timed step of a small Llama
(finite, positive, tokens/s = B x T / ms); the same program's step of a small
GPT-2 (the descriptor picks the family); bad arguments as one "error:" line.
Not its speed.

Usage: test/test_bench_llama3.py [BENCH_TRAIN]   (default build/cpu/bench_train)
"""
import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # test/checks.py
from checks import Checks  # noqa: E402

check = Checks()
FAMILIES = ["matmuls (cuBLASLt)", "attention forward", "attention backward", "rope forward + backward",
            "rmsnorm forward (+ residual)", "rmsnorm backward", "swiglu forward + backward", "classifier",
            "encoder forward + backward", "AdamW + global norm + zeroing"]
SMALL = "llama3:L=2,C=64,H=4,KV=2,F=192,V=256"
GPT2_SMALL = "L=2,C=64,H=4,V=256,maxT=64"


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


def close(a, b, rel=1e-4):
    return math.isfinite(a) and abs(a - b) <= rel * abs(b)


def parse_roofline(out):
    """{family: (GFLOP, GB, bound ms)} and (step bound, rest bound) of the printed table."""
    rows = {}
    for line in out.split("\n"):
        num = r"\s+([-+0-9.eE]+|nan|-?inf)"
        m = re.match(r"  (\S.*?)" + num * 3 + "$", line)
        if m:
            rows[m.group(1)] = tuple(float(x) for x in m.groups()[1:])
    m = re.search(r"bound of the step: (\S+) ms; outside matmuls and attention: (\S+) ms", out)
    return rows, (float(m.group(1)), float(m.group(2))) if m else None


def check_roofline(out, B, T, L, C, H, KV, F, Vp, n, what):
    rows, totals = parse_roofline(out)
    check(f"{what}: one row per family, in order", list(rows) == FAMILIES)
    if list(rows) != FAMILIES or totals is None:
        return
    check(f"{what}: every number finite, bytes and bound > 0, FLOPs >= 0",
          all(all(math.isfinite(x) for x in r) and r[0] >= 0 and r[1] > 0 and r[2] > 0 for r in rows.values()))
    check(f"{what}: every bound = max(GFLOP / 989 TFLOP/s, GB / 4.8 TB/s)",
          all(close(r[2], max(r[0] / 989, r[1] / 4.8), 1e-3) for r in rows.values()))
    HS = C // H
    QKV = C + 2 * KV * HS
    matmul_weights = L * (C * QKV + C * C + C * 2 * F + F * C) + C * Vp
    check(f"{what}: matmul GFLOP = 6 x B x T x their weights",
          close(rows["matmuls (cuBLASLt)"][0], 6 * B * T * matmul_weights / 1e9))
    causal = B * H * T * T / 2 * HS * 2  # FLOPs of one causal product, all layers' heads: times L
    check(f"{what}: attention forward GFLOP = 2 causal products per layer",
          close(rows["attention forward"][0], L * 2 * causal / 1e9))
    check(f"{what}: attention backward GFLOP = 7 causal products per layer",
          close(rows["attention backward"][0], L * 7 * causal / 1e9))
    check(f"{what}: AdamW GB = 38 bytes per parameter", close(rows["AdamW + global norm + zeroing"][1], 38 * n / 1e9))
    check(f"{what}: only matmuls and attention have FLOPs",
          all(r[0] == 0 for f, r in rows.items() if not f.startswith(("matmuls", "attention"))))
    bounds = [r[2] for r in rows.values()]
    rest = sum(r[2] for f, r in rows.items() if not f.startswith(("matmuls", "attention")))
    check(f"{what}: the step's bound is the sum of the families'", close(totals[0], sum(bounds), 1e-3))
    check(f"{what}: outside matmuls and attention is the rest's sum", close(totals[1], rest, 1e-3))


def main():
    bench = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "cpu", "bench_train")
    # Llama 3.2 1B from its shape: 16 layers, C 2048, 32 heads, 8 KV heads, F 8192, V 128256 (= its padded rows), tied
    rc, out, err = run([bench, "--roofline", "llama3.2-1b", "16", "2048"])
    check("--roofline llama3.2-1b 16 2048: exit 0", rc == 0)
    check("llama3.2-1b: 1235814400 parameters (Meta's Llama-3.2-1B)", "tied, 1235814400 parameters" in out)
    check("--roofline: no step is timed", "ms/step" not in out)
    check_roofline(out, 16, 2048, 16, 2048, 32, 8, 8192, 128256, 1235814400, "llama3.2-1b 16x2048")

    B, T = 2, 32
    rc, out, err = run([bench, SMALL, str(B), str(T), "1"])
    check("small Llama, one step: exit 0", rc == 0)
    m = re.search(r"step B=2 T=32, \S+, CPU runtime .*?: (\S+) ms/step, (\S+) tok/s, (\S+) TFLOP/s", out)
    check("small Llama: a step line on the CPU runtime", m is not None)
    if m:
        ms, tok_s = float(m.group(1)), float(m.group(2))
        check("small Llama: ms/step finite and > 0", math.isfinite(ms) and ms > 0)
        check("small Llama: tok/s = B x T / ms/step", close(tok_s, B * T / ms * 1e3, 0.01))
    mem = re.search(r"peak device memory: (\S+) MiB", out)
    check("small Llama: peak device memory > 0", mem is not None and float(mem.group(1)) > 0)
    n_small = 256 * 64 + 2 * (64 + (64 + 2 * 2 * 16) * 64 + 64 * 64 + 64 + 2 * 192 * 64 + 192 * 64) + 64 + 256 * 64
    check_roofline(out, B, T, 2, 64, 4, 2, 192, 256, n_small, "small Llama 2x32")

    # the same program, a GPT-2 descriptor: GPT-2's step and its families (layernorm, no RoPE)
    rc, out, err = run([bench, GPT2_SMALL, str(B), str(T), "1"])
    check("small GPT-2, one step: exit 0", rc == 0)
    # wte, wpe; per layer 2 layernorms, qkv, attproj, fc, fcproj (weights and biases); the final layernorm
    n_gpt2 = 256 * 64 + 64 * 64 + 2 * (4 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 2 * 64 * 256 + 256 + 64) + 2 * 64
    check(f"small GPT-2: its model line ({n_gpt2} parameters, B=2 T=32) and a step line",
          re.search(rf"^model {re.escape(GPT2_SMALL)} \({n_gpt2} parameters\), B=2 T=32, .*: \S+ ms/step", out, re.M)
          is not None)
    rows, totals = parse_roofline(out)
    check("small GPT-2: GPT-2's roofline (layernorm rows, no RoPE)",
          "layernorm forward (+ residual)" in rows and "rope forward + backward" not in rows and totals is not None)

    for args, words in [(["llama3:L=2"], ["llama3:L=2"]), ([SMALL, "0"], ["usage"]),
                        (["--roofline", "llama3.2-1b", "16", "2048", "1"], ["usage"]),
                        ([SMALL + ",T=32", "1", "33"], ["T=33", "32"]), ([GPT2_SMALL, "1", "65"], ["T=65", "64"]),
                        (["--roofline", "d12"], ["--roofline", "d12", "Llama 3"])]:
        rc, out, err = run([bench, *args])
        lines = err.strip().split("\n")
        check(f"{args}: one error line naming {words}, exit 1",
              rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and all(w in lines[0] for w in words))
    check.tally("test_bench_llama3")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
