"""
The same training step as dev/bench_train.cu, in PyTorch on a GPU: the GPT-2 of
dev/train_gpt2.py (its model class; its attention's boolean mask replaced by
is_causal=True so that SDPA may take its flash or cuDNN kernel), bf16 autocast,
fused AdamW, torch.compile where it works, and it says which SDPA backend ran. Prints ms per step, tok/s
and MFU in the line format of bench_train, so that test/gpu_check.sh can print
the ratio of the two.

    python3 dev/bench_train_torch.py [descriptor] [B] [T] [steps] [peak TFLOP/s]
    python3 dev/bench_train_torch.py d12 64 1024 10 989

Without torch or a CUDA device it prints a SKIP line and exits 0.
"""
import os
import sys
import time

DESCRIPTORS = {"d12": (12, 12, 768), "d24": (24, 16, 1024), "d36": (36, 20, 1280), "d48": (48, 25, 1600)}


def skip(reason):
    print(f"SKIP bench_train_torch: {reason}")
    sys.exit(0)


class CausalF:
    """torch.nn.functional with SDPA's mask argument replaced by is_causal=True (the mask is causal)."""

    def __init__(self, F):
        self._F = F

    def __getattr__(self, name):
        return getattr(self._F, name)

    def scaled_dot_product_attention(self, q, k, v, attn_mask=None, **kw):
        return self._F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)


def attention_backend(torch, B, NH, T, HS):
    """The fastest SDPA backend that takes a causal bf16 forward+backward at these shapes, as (context, name)."""
    import contextlib
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext, "default (torch.nn.attention.sdpa_kernel not in this torch)"
    q = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            return (lambda b=backend: sdpa_kernel(b)), name.lower()
        except RuntimeError:
            continue
    return contextlib.nullcontext, "default (flash, cuDNN and efficient refused)"


def main():
    args = sys.argv[1:]
    descriptor = args[0] if len(args) > 0 else "d12"
    try:
        B, T, steps = (int(a) for a in (args[1:4] + ["64", "1024", "10"][len(args[1:4]):]))
        peak = float(args[4]) if len(args) > 4 else 989.0
    except ValueError:
        print("error: usage: bench_train_torch.py [descriptor] [B] [T] [steps] [peak TFLOP/s]", file=sys.stderr)
        sys.exit(1)
    if descriptor not in DESCRIPTORS or min(B, T, steps) <= 0:
        print(f"error: bench_train_torch: bad arguments {args} (descriptor in {sorted(DESCRIPTORS)})", file=sys.stderr)
        sys.exit(1)
    try:
        import torch
    except ImportError as e:
        skip(f"torch not importable ({e})")
    if not torch.cuda.is_available():
        skip("no CUDA device")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train_gpt2 as ref  # the reference model; it pins CPU determinism on import, undone here

    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(os.cpu_count() or 1)
    torch.backends.cuda.matmul.allow_tf32 = True
    L, NH, C = DESCRIPTORS[descriptor]
    cfg = ref.GPTConfig(max_seq_len=1024, vocab_size=50257, padded_vocab_size=50304, num_layers=L, num_heads=NH,
                        channels=C)
    if T > cfg.max_seq_len:
        print(f"error: bench_train_torch: T={T} over maxT={cfg.max_seq_len}", file=sys.stderr)
        sys.exit(1)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(42)
    init = {}
    for name, shape in ref.param_shapes(cfg).items():  # GPT-2's init: N(0, 0.02), layernorm weights 1, biases 0
        if name.endswith("b"):
            init[name] = torch.zeros(shape, device=dev)
        elif name in ("ln1w", "ln2w", "lnfw"):
            init[name] = torch.ones(shape, device=dev)
        else:
            init[name] = torch.randn(shape, device=dev, generator=gen) * 0.02
    ref.F = CausalF(ref.F)
    backend_ctx, backend = attention_backend(torch, B, NH, T, C // NH)
    model = ref.GPT(cfg, init).to(dev)
    nparams = ref.num_parameters(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    x = torch.randint(0, cfg.vocab_size, (B, T), device=dev, generator=gen)
    y = torch.randint(0, cfg.vocab_size, (B, T), device=dev, generator=gen)

    def step_with(net):
        def step(x, y):
            with backend_ctx(), torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model.loss_sum(net(x, sdpa=True), y) / (B * T)
            loss.backward()
            return loss
        return step

    how = "torch.compile"
    try:
        step = step_with(torch.compile(model))
        step(x, y)  # compiles here; any failure falls back to eager
    except Exception as e:  # noqa: BLE001 (whatever the compiler raises, eager is the fallback)
        how = f"eager (torch.compile failed: {type(e).__name__})"
        step = step_with(model)
    opt.zero_grad(set_to_none=True)
    for _ in range(2):  # warm-up
        step(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) * 1000 / steps
    if not torch.isfinite(loss):
        print(f"error: bench_train_torch: loss {loss.item()} is not finite", file=sys.stderr)
        sys.exit(1)
    tok_s = B * T / (step_ms / 1000)
    tflops = (6.0 * nparams + 6.0 * L * C * T) * tok_s / 1e12  # bench_train's count
    print(f"model {descriptor} ({nparams} parameters), B={B} T={T}, pytorch bf16 autocast, {how}, sdpa {backend}: "
          f"{step_ms:.1f} ms/step, {tok_s:.0f} tok/s, {tflops:.2f} TFLOP/s, MFU {100 * tflops / peak:.1f}% of "
          f"{peak:.0f} TFLOP/s on {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
