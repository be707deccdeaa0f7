"""
The same training step as dev/bench_train.cu, in PyTorch on a GPU: the GPT-2 of
dev/train_gpt2.py (its model class; its attention's boolean mask replaced by
is_causal=True so that SDPA may take its flash or cuDNN kernel), bf16 autocast,
fused AdamW, torch.compile where it works, and it says which SDPA backend ran. Prints ms per step, tok/s
and MFU in the line format of bench_train, so that test/gpu_check.sh can print
the ratio of the two. llama3.2-1b is dev/bench_train.cu's Llama step: the Llama of
dev/train_llama3.py with its attention as one SDPA call (is_causal, enable_gqa:
no repeated key/value heads).

    python3 dev/bench_train_torch.py [descriptor] [B] [T] [steps] [peak TFLOP/s]
    python3 dev/bench_train_torch.py d12 64 1024 10 989
    python3 dev/bench_train_torch.py llama3.2-1b 8 2048 5 989

Without torch or a CUDA device it prints a SKIP line and exits 0.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_sizes import gpt2_descriptors  # noqa: E402

DESCRIPTORS = gpt2_descriptors()  # {"d12": (L, NH, C), ...}, read from train_gpt.cu
# Meta's Llama-3.2-1B config.json (llmc/formats/llama3_config.h's llama3_named): L, NH, NKV, C, F, V
LLAMA_DESCRIPTORS = {"llama3.2-1b": (16, 32, 8, 2048, 8192, 128256)}


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


def attention_backend(torch, B, NH, NKV, T, HS):
    """The fastest SDPA backend that takes a causal bf16 forward+backward at these shapes (NKV < NH: grouped-query,
    enable_gqa), as (context, name)."""
    import contextlib
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext, "default (torch.nn.attention.sdpa_kernel not in this torch)"
    q = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kv = q[:, :NKV]
    gqa = {"enable_gqa": True} if NKV < NH else {}
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, **gqa).sum().backward()
            return (lambda b=backend: sdpa_kernel(b)), name.lower()
        except RuntimeError:
            continue
    return contextlib.nullcontext, "default (flash, cuDNN and efficient refused)"


def gpt2_model(torch, descriptor, T, dev, gen):
    """(model, parameters, L, C, V, NH, NKV) of GPT-2 at this size; init N(0, 0.02), layernorm weights 1, biases 0."""
    import train_gpt2 as ref  # the reference model; it pins CPU determinism on import, undone in main
    L, NH, C = DESCRIPTORS[descriptor]
    cfg = ref.GPTConfig(max_seq_len=1024, vocab_size=50257, padded_vocab_size=50304, num_layers=L, num_heads=NH,
                        channels=C)
    if T > cfg.max_seq_len:
        print(f"error: bench_train_torch: T={T} over maxT={cfg.max_seq_len}", file=sys.stderr)
        sys.exit(1)
    init = {}
    for name, shape in ref.param_shapes(cfg).items():
        if name.endswith("b"):
            init[name] = torch.zeros(shape, device=dev)
        elif name in ("ln1w", "ln2w", "lnfw"):
            init[name] = torch.ones(shape, device=dev)
        else:
            init[name] = torch.randn(shape, device=dev, generator=gen) * 0.02
    ref.F = CausalF(ref.F)
    return ref.GPT(cfg, init).to(dev), ref.num_parameters(cfg), L, C, cfg.vocab_size, NH, NH


def llama_model(torch, descriptor, T, dev, gen):
    """(model, parameters, L, C, V, NH, NKV) of Llama 3 at this size: dev/train_llama3.py's Llama (RoPE table and mask
    for T positions) whose forward takes SDPA's causal grouped-query kernel; norm weights 1, the rest N(0, 0.02)."""
    import train_llama3 as ref
    F = torch.nn.functional
    L, NH, NKV, C, F_, V = LLAMA_DESCRIPTORS[descriptor]
    cfg = ref.LlamaConfig(max_seq_len=T, vocab_size=V, padded_vocab_size=(V + 127) // 128 * 128, num_layers=L,
                          num_heads=NH, num_kv_heads=NKV, channels=C, ffn_hidden=F_, rope_factor=32.0)
    init = {}
    for name, shape in ref.param_shapes(cfg).items():
        init[name] = (torch.ones(shape) if ref.init_std(cfg, name) is None else
                      torch.randn(shape, device=dev, generator=gen) * 0.02)

    class Llama(ref.Llama):
        def forward(self, idx, sdpa=True):
            B, T = idx.shape
            HS, eps = cfg.head_size, cfg.norm_eps
            cos, sin = self.rope_cos[:T][None, None], self.rope_sin[:T][None, None]  # (1,1,T,HS/2)
            x = F.embedding(idx, self.wte)
            for l in range(L):
                h = ref.rms_norm(x, self.attnnormw[l], eps)
                q, k, v = F.linear(h, self.qkvw[l]).split([NH * HS, NKV * HS, NKV * HS], dim=2)
                q = ref.apply_rope(q.view(B, T, NH, HS).transpose(1, 2), cos, sin)
                k = ref.apply_rope(k.view(B, T, NKV, HS).transpose(1, 2), cos, sin)
                v = v.view(B, T, NKV, HS).transpose(1, 2)
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), self.attprojw[l])
                h = ref.rms_norm(x, self.mlpnormw[l], eps)
                gate, up = F.linear(h, self.fcw[l]).split(F_, dim=2)
                x = x + F.linear(F.silu(gate) * up, self.fcprojw[l])
            return F.linear(ref.rms_norm(x, self.normfw, eps), self.wte)

    return Llama(cfg, init).to(dev), ref.num_parameters(cfg), L, C, V, NH, NKV


def main():
    args = sys.argv[1:]
    descriptor = args[0] if len(args) > 0 else "d12"
    try:
        B, T, steps = (int(a) for a in (args[1:4] + ["64", "1024", "10"][len(args[1:4]):]))
        peak = float(args[4]) if len(args) > 4 else 989.0
    except ValueError:
        print("error: usage: bench_train_torch.py [descriptor] [B] [T] [steps] [peak TFLOP/s]", file=sys.stderr)
        sys.exit(1)
    if descriptor not in {**DESCRIPTORS, **LLAMA_DESCRIPTORS} or min(B, T, steps) <= 0:
        print(f"error: bench_train_torch: bad arguments {args} (descriptor in "
              f"{sorted(DESCRIPTORS) + sorted(LLAMA_DESCRIPTORS)})", file=sys.stderr)
        sys.exit(1)
    try:
        import torch
    except ImportError as e:
        skip(f"torch not importable ({e})")
    if not torch.cuda.is_available():
        skip("no CUDA device")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(42)
    make_model = llama_model if descriptor in LLAMA_DESCRIPTORS else gpt2_model
    model, nparams, L, C, V, NH, NKV = make_model(torch, descriptor, T, dev, gen)
    torch.backends.cuda.matmul.allow_tf32 = True
    backend_ctx, backend = attention_backend(torch, B, NH, NKV, T, C // NH)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    x = torch.randint(0, V, (B, T), device=dev, generator=gen)
    y = torch.randint(0, V, (B, T), device=dev, generator=gen)

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
