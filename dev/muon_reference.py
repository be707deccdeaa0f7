#!/usr/bin/env python3
"""An independent implementation of the Muon step of llmc/kernels/muon.cuh (docs/muon.md).

With PyTorch it is Keller Jordan's code (modded-nanogpt's zeropower_via_newtonschulz5
and its Nesterov step); without it, numpy (float64, and a bf16 simulation: every
matmul operand and result rounded to bf16, fp32 accumulation, as the kernels do).

    python3 dev/muon_reference.py            # checks below, one PASS/FAIL line each
    python3 dev/muon_reference.py --torch    # the same, and against Keller Jordan's PyTorch code

Checks: the small-side and large-side Gram give the same O in float64 (the
polynomial identity p(X X^T) X = X p(X^T X)); O's singular values lie in about
[0.7, 1.2] for a random rectangular input; the bf16 iteration's error against
float64 (relative Frobenius) stays under test/kernels/test_muon.cu's bound of
0.03, and each planted mistake (a wrong coefficient, the Gram of one side
applied on the other) moves O by more than that bound.
"""
import argparse
import sys

import numpy as np

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic (modded-nanogpt)
NS_STEPS = 5
NS_EPS = 1e-7
TOL_BF16 = 0.03  # test/kernels/test_muon.cu's TOL_NS for the bf16 build


def to_bf16(x):
    """x (any float array) rounded to the nearest bf16 (ties to even), as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def newton_schulz5(g, coeffs=NS_COEFFS, gram="small", bf16=False):
    """O ~ U V^T of g = U S V^T: X = g / (||g||_F + 1e-7), then 5 times
    A = X X^T, B = b A + c A A, X = a X + B X, on the smaller Gram (X^T when
    rows > cols). gram="large" takes the other side; gram="mixed" (square g)
    is the planted mistake A = X^T X applied on the left. bf16: every operand
    and product rounded to bf16, products accumulated in float32."""
    a, b, c = coeffs
    if bf16:
        rnd, x = to_bf16, to_bf16(g)
        x = to_bf16(x.astype(np.float32) / np.float32(np.sqrt(np.sum(x.astype(np.float32) ** 2)) + NS_EPS))
    else:
        rnd, x = (lambda v: v), np.asarray(g, dtype=np.float64)
        x = x / (np.linalg.norm(x) + NS_EPS)
    rows, cols = x.shape
    flip = {"small": rows > cols, "large": rows < cols, "mixed": False}[gram]
    if flip:
        x = x.T
    for _ in range(NS_STEPS):
        A = rnd(x.T @ x if gram == "mixed" else x @ x.T)
        B = rnd(b * A + c * (A @ A)) if not bf16 else rnd(np.float32(c) * (A @ A) + np.float32(b) * A)
        x = rnd(a * x + B @ x) if not bf16 else rnd(B @ x + np.float32(a) * x)
    return x.T if flip else x


def muon_step(master, momentum, grad, lr, weight_decay, mu=0.95, bf16=False, coeffs=NS_COEFFS):
    """One step on one matrix (rows x cols, [out, in]): m = mu m + g, u = g + mu m,
    W = W (1 - lr wd) - lr sqrt(max(1, rows/cols)) NS5(u). Returns (W, m)."""
    m = mu * momentum + grad
    u = grad + mu * m
    o = newton_schulz5(u, coeffs, bf16=bf16)
    rows, cols = master.shape
    scale = max(1.0, rows / cols) ** 0.5
    return master * (1 - lr * weight_decay) - lr * scale * o, m


def torch_newton_schulz5(g):
    """Keller Jordan's zeropower_via_newtonschulz5 (modded-nanogpt), verbatim in effect."""
    import torch
    a, b, c = NS_COEFFS
    X = torch.as_tensor(g).bfloat16()
    if X.size(-2) > X.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(NS_STEPS):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if g.shape[-2] > g.shape[-1]:
        X = X.mT
    return X.float().numpy().astype(np.float64)


def rel_frobenius(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--torch", action="store_true", help="also compare with Keller Jordan's PyTorch code")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    failed = 0

    def check(ok, what):
        nonlocal failed
        failed += not ok
        print(("PASS " if ok else "FAIL ") + what)

    for rows, cols in [(64, 64), (64, 256), (256, 64)]:
        g = rng.uniform(-1, 1, (rows, cols))
        o = newton_schulz5(g)
        if rows != cols:
            e = rel_frobenius(newton_schulz5(g, gram="large"), o)
            check(e <= 1e-10, f"{rows}x{cols}: the larger Gram gives the same O in float64 ({e:.1e})")
            s = np.linalg.svd(o, compute_uv=False)
            check(s.min() >= 0.6 and s.max() <= 1.25, f"{rows}x{cols}: singular values in [{s.min():.3f}, {s.max():.3f}]")
        e_bf16 = rel_frobenius(newton_schulz5(g, bf16=True), o)
        check(e_bf16 <= TOL_BF16, f"{rows}x{cols}: bf16 iteration vs float64 {e_bf16:.2e} (<= {TOL_BF16})")
        planted = {"c = 2.315": newton_schulz5(g, (3.4445, -4.7750, 2.315)),
                   "a = 3.4454": newton_schulz5(g, (3.4454, -4.7750, 2.0315)),
                   "b = -4.7705": newton_schulz5(g, (3.4445, -4.7705, 2.0315)),
                   "cubic (1.5, -0.5, 0)": newton_schulz5(g, (1.5, -0.5, 0.0))}
        if rows == cols:
            planted["Gram X^T X on the left"] = newton_schulz5(g, gram="mixed")
        for name, op in planted.items():
            e = rel_frobenius(op, o)
            print(f"     planted {name}: moves O by {e:.2e} ({e / TOL_BF16:.1f} x the bf16 bound)")
        if args.torch:
            e = rel_frobenius(torch_newton_schulz5(g), o)
            check(e <= TOL_BF16, f"{rows}x{cols}: Keller Jordan's PyTorch code vs float64 {e:.2e}")
    w, m = muon_step(np.zeros((8, 4)), np.zeros((8, 4)), rng.uniform(-1, 1, (8, 4)), 0.02, 0.1)
    check(np.all(np.isfinite(w)), "muon_step on a tall 8x4: finite")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
