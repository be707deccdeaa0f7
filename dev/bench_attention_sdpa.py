#!/usr/bin/env python3
"""PyTorch's fused attention at the shapes of dev/bench_attention.cu, printing
the same lines ("attention sdpa ..." next to "attention llmc ...").

usage: python3 dev/bench_attention_sdpa.py [B[,B...]] [T] [NH] [HS] [iters]
       (defaults: B = 16, 32, 64; T=1024 NH=12 HS=64, 20 iters)

torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) in
bf16 on the GPU, q, k, v shaped (B, NH, T, HS), uniform in [-1, 1) from a fixed
seed (not the same values as bench_attention: the means it prints are a
sanity check, not comparable). The flash backend is requested; if it refuses,
the default choice runs, with a note. The backend that ran is read from the
autograd node of the output.

Timing, with torch.cuda.Event, after one warm-up forward and backward:
  forward:  `iters` calls with autograd on (as in training: the kernel also
            writes the log-sum-exp the backward needs);
  backward: `iters` torch.autograd.grad calls on one forward's graph, kept with
            retain_graph=True: the backward kernels alone, no forward and no
            subtraction of two noisy timings;
  forward+backward: the sum of the two, as in bench_attention.
FLOP convention (as bench_attention): forward 2*B*NH*T^2*HS (two matmuls,
causal half of T x T), backward 2.5x forward (five matmuls); nominal, whatever
the kernel recomputes.

Without torch or a CUDA device: prints `SKIP bench_attention_sdpa: <reason>`
and exits 0.
"""
import contextlib
import sys

USAGE = "usage: bench_attention_sdpa.py [B[,B...]] [T] [NH] [HS] [iters]"


def positive(s):
    if not s.isdigit() or int(s) <= 0:
        sys.exit(f"error: '{s}': not a positive integer ({USAGE})")
    return int(s)


def parse_args(argv):
    if len(argv) > 5:
        sys.exit(f"error: {USAGE}")
    Bs = [positive(b) for b in argv[0].split(",")] if argv else [16, 32, 64]
    T, NH, HS, iters = [positive(a) for a in argv[1:]] + [1024, 12, 64, 20][len(argv[1:]):]
    return Bs, T, NH, HS, iters


def skip(reason):
    print(f"SKIP bench_attention_sdpa: {reason}")
    sys.exit(0)


def flash_or_default(torch, F, q, k, v):
    """A context that selects the flash backend if it takes this input, else the default, and a note."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext, "default (torch.nn.attention.sdpa_kernel not in this torch)"
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION), "flash requested"
    except RuntimeError as e:
        return contextlib.nullcontext, f"default (flash refused: {str(e).splitlines()[0]})"


def time_ms(torch, f, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        f()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def mean_abs_finite(torch, x, what):
    if not torch.isfinite(x).all():
        sys.exit(f"error: sdpa: {what} has NaN or infinite values")
    return x.float().abs().mean().item()


def print_line(B, T, NH, HS, name, flop, ms):
    print(f"attention sdpa B={B} T={T} NH={NH} HS={HS} {name:<16} {flop:.3e} FLOP {ms:9.3f} ms "
          f"{flop / (ms * 1e-3) / 1e12:8.2f} TFLOP/s")


def bench_shape(torch, F, B, T, NH, HS, iters):
    g = torch.Generator(device="cuda").manual_seed(1337)
    rand = lambda: (torch.rand(B, NH, T, HS, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    q, k, v = (rand().requires_grad_() for _ in range(3))
    dout = rand()
    backend, note = flash_or_default(torch, F, q, k, v)
    with backend():
        attend = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = attend()  # warm-up, and the graph the timed backward calls reuse
        grad = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        grads = grad()
        fwd_ms = time_ms(torch, attend, iters)
        bwd_ms = time_ms(torch, grad, iters)
    print(f"backend B={B}: {note}; ran {type(out.grad_fn).__name__}")
    means = [mean_abs_finite(torch, x, name) for x, name in zip((out, *grads), ("out", "dq", "dk", "dv"))]
    print(f"check B={B}: out, dq, dk, dv finite; mean |out| {means[0]:.6e}, "
          f"|dq| {means[1]:.6e}, |dk| {means[2]:.6e}, |dv| {means[3]:.6e}")
    fwd_flop = 2.0 * B * NH * T * T * HS
    print_line(B, T, NH, HS, "forward", fwd_flop, fwd_ms)
    print_line(B, T, NH, HS, "backward", 2.5 * fwd_flop, bwd_ms)
    print_line(B, T, NH, HS, "forward+backward", 3.5 * fwd_flop, fwd_ms + bwd_ms)


def main():
    Bs, T, NH, HS, iters = parse_args(sys.argv[1:])
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # not installed, or a broken install
        skip(f"torch not importable ({e})")
    if not torch.cuda.is_available():
        skip(f"no CUDA device (torch {torch.__version__})")
    print(f"device: {torch.cuda.get_device_name()}, bf16, {iters} iters per pass, torch {torch.__version__}")
    for B in Bs:
        bench_shape(torch, F, B, T, NH, HS, iters)


if __name__ == "__main__":
    main()
