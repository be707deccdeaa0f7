#!/usr/bin/env python3
"""What Muon (llmc/kernels/muon.cuh, docs/muon.md) costs per optimizer step, per model:
the bytes each rank sends and the Newton-Schulz FLOPs, from the model shapes in
the code (GPT-2's d12..d48 descriptors of train_gpt.cu, Llama 3.2 1B's published
size of llmc/formats/llama3_config.h; read from the sources, not restated here).

Muon takes the hidden 2-D matrices, each as its own matrix ([out, in], as the
Hugging Face tensors are): per layer GPT-2's q, k, v (the three C x C row blocks
of qkvw), attn proj C x C, fc 4C x C, fc proj C x 4C; Llama's q C x C, k and v
KV*HS x C, o C x C, gate and up F x C, down C x F. Embeddings, the head and the
norm/bias vectors stay with AdamW and are left out of every column.

Bytes sent per rank per step, N ranks, ring collectives (a collective over S
bytes sends (N-1)/N S per rank), P = Muon's parameters:
  all-reduce   fp32 gradients all-reduced:             2 (N-1)/N 4P
  ZeRO-1       fp32 reduce-scatter + bf16 all-gather:  (N-1)/N (4P + 2P)
  owner        each matrix orthogonalised on one owner rank (llmc/step/params.h's
               plan_muon_owners: the per-layer slices of Muon's tensors, in
               buffer order, cut into N runs of about equal elements); its
               gradient reduced to the owner (ZeRO-1; under ZeRO-0 it is
               all-reduced as AdamW's), the owner's new bf16 weights broadcast
               to the others; a ring reduce or broadcast of S bytes sends
               (N-1)/N S per rank: (N-1)/N (4P + 2P), of which the bf16 weights
               (N-1)/N 2P ("owner bf16"): ZeRO-1's bytes
Newton-Schulz FLOPs of an R x C matrix, s = min(R, C), l = max(R, C), per
step 5 x (A = X X^T: 2 s^2 l, A A: 2 s^3, B X: 2 s^2 l) = 5 (4 s^2 l + 2 s^3);
"1 GPU" is every matrix on one GPU, "owner" the most loaded rank. The ms are an
estimate at an assumed rate (default 400 TFLOP/s, dense bf16 on an H100), not a
measurement.

    python3 dev/muon_costs.py            # the table (Markdown), N = 8
    python3 dev/muon_costs.py -N 4 --tflops 600
"""
import argparse
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS_STEPS = 5


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def sources():
    """The trainers and llmc's headers (any subfolder): where the sizes are defined."""
    paths = glob.glob(os.path.join(ROOT, "*.cu")) + glob.glob(os.path.join(ROOT, "llmc", "**", "*.h"), recursive=True)
    return {p: open(p, encoding="utf-8").read() for p in sorted(paths)}


def find(pattern, what):
    """The matches of pattern in the one source file that has them."""
    hits = [(p, m) for p, text in sources().items() for m in [re.findall(pattern, text)] if m]
    if len(hits) != 1:
        fail(f"{what}: found in {len(hits)} source files, not 1 (the pattern {pattern!r} needs updating)")
    return hits[0][1]


def gpt2_models():
    """{"d12": (L, C), ...} from train_gpt.cu's descriptor table {"d12", 12, 768}."""
    rows = find(r'\{"(d\d+)",\s*(\d+),\s*(\d+)\}', "GPT-2's d12..d48 sizes")
    return {name: (int(L), int(C)) for name, L, C in rows}


def llama_model(name):
    """(L, C, H, KV, F) of a published Llama size, from llama3_named."""
    rows = find(r'name == "' + re.escape(name) + r'"\)\s*\{\s*n\.L = (\d+), n\.C = (\d+), n\.H = (\d+), n\.F = (\d+)',
                f"{name}'s size")
    kv = find(r"\bn\.KV = (\d+);", "the published models' KV heads")
    L, C, H, F = map(int, rows[0])
    return L, C, H, int(kv[0]), F


def gpt2_slices(L, C):
    """Muon's slices in buffer order (a layer's part of a tensor: its matrices)."""
    return [[(C, C)] * 3] * L + [[(C, C)]] * L + [[(4 * C, C)]] * L + [[(C, 4 * C)]] * L  # qkv, proj, fc, fc proj


def llama_slices(L, C, H, KV, F):
    kvc = KV * (C // H)
    return [[(C, C), (kvc, C), (kvc, C)]] * L + [[(C, C)]] * L + [[(F, C), (F, C)]] * L + [[(C, F)]] * L


def ns_flops(r, c):
    s, l = min(r, c), max(r, c)
    return NS_STEPS * (4 * s * s * l + 2 * s ** 3)


def owners(slices, n):
    """The slices to n ranks as plan_muon_owners cuts them: a slice goes to the run of about
    P/n elements its middle falls in; (elements, flops) of each rank."""
    sizes = [sum(r * c for r, c in s) for s in slices]
    total, before = sum(sizes), 0
    load = [[0, 0] for _ in range(n)]
    for s, size in zip(slices, sizes):
        k = min(n - 1, (before + size // 2) * n // total)
        load[k][0] += size
        load[k][1] += sum(ns_flops(r, c) for r, c in s)
        before += size
    return load


def row(name, slices, n, tflops):
    mats = [m for s in slices for m in s]
    P = sum(r * c for r, c in mats)
    load = owners(slices, n)
    M = max(l[0] for l in load)
    f_all = sum(ns_flops(r, c) for r, c in mats)
    f_max = max(l[1] for l in load)
    mb = lambda b: b / 1e6
    return {
        "model": name,
        "matrices": len(mats),
        "P (M)": P / 1e6,
        "all-reduce MB": mb(2 * (n - 1) / n * 4 * P),
        "ZeRO-1 MB": mb((n - 1) / n * 6 * P),
        "owner bf16 MB": mb((n - 1) / n * 2 * P),
        "owner MB": mb((n - 1) / n * 6 * P),
        "largest share / (P/N)": M / (P / n),
        "NS TFLOP 1 GPU": f_all / 1e12,
        "NS ms 1 GPU": f_all / (tflops * 1e12) * 1e3,
        "NS TFLOP owner": f_max / 1e12,
        "NS ms owner": f_max / (tflops * 1e12) * 1e3,
    }


def table(n, tflops):
    rows = [row(name, gpt2_slices(L, C), n, tflops) for name, (L, C) in gpt2_models().items()]
    rows.append(row("llama3.2-1b", llama_slices(*llama_model("llama3.2-1b")), n, tflops))
    return rows


def markdown(rows):
    keys = list(rows[0])
    def fmt(v):
        if not isinstance(v, float):
            return str(v)
        return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description="Muon's bytes and Newton-Schulz FLOPs per step (estimates)")
    p.add_argument("-N", type=int, default=8, help="ranks (default 8)")
    p.add_argument("--tflops", type=float, default=400.0, help="assumed dense bf16 rate (default 400, an H100)")
    a = p.parse_args()
    if a.N < 1 or not a.tflops > 0:
        fail("-N must be >= 1 and --tflops > 0")
    print(f"N = {a.N} ranks; MB = 1e6 bytes sent per rank per step; ms at an assumed {a.tflops:g} TFLOP/s "
          f"(an estimate)\n")
    print(markdown(table(a.N, a.tflops)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
