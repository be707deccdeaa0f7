"""
The CPU build's training step next to PyTorch's on the same CPU, in one run:
this project's d12 step in the bf16 build (build/cpu) and the fp32 build
(build/cpu-fp32), and PyTorch's step in fp32 and under bf16 autocast, with the
same weights (one checkpoint that all load), the same batch, the same B, T and
thread count. They take turns, one step each per round, so that load from other
programs on the machine falls on all of them alike; it prints the median ms per
step of each and, on PyTorch's lines, each build's speed relative to it
(PyTorch's ms / ours: above 1x, ours is faster).

PyTorch runs at its own defaults, as a user who installs it gets it: none of
the reference mode's settings (dev/reference_mode.py) are made; the first line
says torch's version, the CPU code paths it picked, its fp32 matmul precision,
and any such variable the environment sets.

    python3 dev/bench_cpu_vs_torch.py [descriptor] [B] [T] [rounds] [threads]
    python3 dev/bench_cpu_vs_torch.py d12 4 64 5 2

PyTorch's model is GPT-2 as PyTorch code usually writes it: one nn.Linear-style
weight per layer (views of the checkpoint's tensors), SDPA causal attention,
tanh GELU, AdamW (fused where this torch has it for the CPU); on a torch
before 2.0 the attention written out, and a torch that cannot autocast to bf16
on the CPU is left out, saying so. The project's
programs are `bench_train --serve` (make build/cpu/bench_train
build/cpu-fp32/bench_train); a missing one is left out, saying so. Without
torch it prints a SKIP line and exits 0.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_sizes import gpt2_descriptors  # noqa: E402

DESCRIPTORS = gpt2_descriptors()  # {"d12": (L, NH, C), ...}, read from train_gpt.cu
BUILDS = [("ours bf16", "build/cpu/bench_train"), ("ours fp32", "build/cpu-fp32/bench_train")]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message):
    print(f"error: bench_cpu_vs_torch: {message}", file=sys.stderr)
    sys.exit(1)


def parse_args(args):
    if len(args) > 5:
        fail(f"at most 5 arguments, got {len(args)} (usage: [descriptor] [B] [T] [rounds] [threads])")
    descriptor = args[0] if args else "d12"
    if descriptor not in DESCRIPTORS:
        fail(f"descriptor {descriptor!r} is not one of {sorted(DESCRIPTORS)}")
    defaults = [4, 64, 5, os.cpu_count() or 1]
    numbers = []
    for name, text, default in zip(("B", "T", "rounds", "threads"), args[1:] + [None] * 4, defaults):
        try:
            value = default if text is None else int(text)
        except ValueError:
            fail(f"{name}={text!r} is not an integer")
        if value <= 0:
            fail(f"{name}={value} must be positive")
        numbers.append(value)
    B, T, rounds, threads = numbers
    if T > 1024:
        fail(f"T={T} over the model's maxT=1024")
    return descriptor, B, T, rounds, threads


def write_inputs(ref, torch, cfg, B, T, folder):
    """The checkpoint (GPT-2's init: N(0, 0.02), residual projections scaled,
    layernorm weights 1, biases 0) and the B*T+1 token ids; returns their
    paths and the fp32 tensors."""
    gen = torch.Generator().manual_seed(42)
    tensors = {}
    for name, shape in ref.param_shapes(cfg).items():
        std = ref.init_std(cfg, name)
        if std is not None:
            tensors[name] = torch.randn(shape, generator=gen) * std
        else:
            tensors[name] = torch.full(shape, 1.0 if name in ("ln1w", "ln2w", "lnfw") else 0.0)
    tensors["wte"][cfg.vocab_size:] = 0
    model_path = os.path.join(folder, "model.bin")
    ref.write_model(model_path, cfg, tensors)
    tokens = torch.randint(0, cfg.vocab_size, (B * T + 1,), generator=gen, dtype=torch.int32)
    tokens_path = os.path.join(folder, "tokens.bin")
    with open(tokens_path, "wb") as f:
        f.write(tokens.numpy().astype("<i4").tobytes())
    return model_path, tokens_path, tensors, tokens.long()


class Ours:
    """A `bench_train --serve` process: one training step per request."""

    def __init__(self, name, binary, model_path, tokens_path, B, T, threads):
        self.name = name
        env = dict(os.environ, CPUCUDA_WORKERS=str(threads))
        self.proc = subprocess.Popen([binary, "--serve", model_path, str(B), str(T), tokens_path], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            self.close()
            fail(f"{binary} --serve did not start (exit status {self.proc.returncode})")

    def step_ms(self):
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        words = self.proc.stdout.readline().split()
        if len(words) < 2 or words[0] != "ms":
            self.close()
            fail(f"{self.name}: no step time (exit status {self.proc.returncode})")
        return float(words[1])

    def close(self):
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


class Torch:
    """PyTorch's step on the same weights and batch, at torch's own defaults: fp32, or with the forward under
    bf16 autocast (the weights, gradients and optimizer in fp32, as PyTorch's mixed precision runs)."""

    def __init__(self, torch, cfg, tensors, tokens, B, T, autocast):
        import torch.nn.functional as F
        self.torch, self.F, self.cfg, self.B, self.T = torch, F, cfg, B, T
        self.autocast = autocast
        self.name = "pytorch bf16" if autocast else "pytorch fp32"
        self.params = {}
        for name, t in tensors.items():
            if t.dim() >= 2 and t.shape[0] == cfg.num_layers and name not in ("wte", "wpe"):
                self.params[name] = [torch.nn.Parameter(t[l].clone()) for l in range(cfg.num_layers)]
            else:
                self.params[name] = torch.nn.Parameter(t.clone())
        flat = [p for v in self.params.values() for p in (v if isinstance(v, list) else [v])]
        kwargs = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        try:
            self.opt = torch.optim.AdamW(flat, fused=True, **kwargs)
            self.fused = "fused AdamW"
        except (TypeError, RuntimeError, ValueError):  # no fused argument, or no fused CPU kernel in this torch
            self.opt = torch.optim.AdamW(flat, **kwargs)
            self.fused = "AdamW"
        self.sdpa = hasattr(F, "scaled_dot_product_attention")
        self.x = tokens[:-1].view(B, T)
        self.y = tokens[1:].view(B, T)
        self.step_ms()  # warm-up

    def attention(self, q, k, v):
        if self.sdpa:
            return self.F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.shape[2]  # torch before 2.0: the product, mask and softmax written out
        att = (q @ k.transpose(-2, -1)) * (1.0 / q.shape[-1] ** 0.5)
        mask = self.torch.ones(T, T, dtype=self.torch.bool).tril()
        return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v

    def gelu(self, x):
        try:
            return self.F.gelu(x, approximate="tanh")
        except TypeError:  # torch before 1.12
            return 0.5 * x * (1.0 + self.torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))

    def loss(self):
        F, p, cfg, B, T = self.F, self.params, self.cfg, self.B, self.T
        C, NH = cfg.channels, cfg.num_heads
        x = F.embedding(self.x, p["wte"]) + p["wpe"][:T]
        for l in range(cfg.num_layers):
            h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
            q, k, v = F.linear(h, p["qkvw"][l], p["qkvb"][l]).split(C, dim=2)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = self.attention(q, k, v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, p["attprojw"][l], p["attprojb"][l])
            h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
            h = self.gelu(F.linear(h, p["fcw"][l], p["fcb"][l]))
            x = x + F.linear(h, p["fcprojw"][l], p["fcprojb"][l])
        x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
        logits = F.linear(x, p["wte"])[..., :cfg.vocab_size]
        return F.cross_entropy(logits.reshape(-1, cfg.vocab_size).float(), self.y.reshape(-1))

    def step_ms(self):
        t0 = time.perf_counter()
        if self.autocast:
            with self.torch.autocast("cpu", dtype=self.torch.bfloat16):
                loss = self.loss()
        else:
            loss = self.loss()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) * 1000

    def describe(self):
        return ("eager, " + ("bf16 autocast" if self.autocast else "fp32") + ", "
                + ("SDPA" if self.sdpa else "attention written out (no SDPA)") + ", " + self.fused)

    def close(self):
        pass


def torch_settings(torch):
    """What decides torch's speed here: its version, the CPU code paths it picked, its fp32 matmul precision,
    and any reference-mode variable the caller's environment sets (reference_mode.py), which slows it down."""
    get_capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    capability = get_capability() if get_capability else "unknown (torch before 2.0)"
    get_precision = getattr(torch, "get_float32_matmul_precision", None)
    precision = get_precision() if get_precision else "highest (torch before 1.12)"
    line = (f"pytorch {torch.__version__}: CPU capability {capability}, fp32 matmul precision {precision}, "
            f"{torch.get_num_threads()} threads")
    pinned = [f"{k}={os.environ[k]}" for k in ("MKL_CBWR", "ATEN_CPU_CAPABILITY") if k in os.environ]
    if pinned:
        line += " (set in the environment: " + ", ".join(pinned) + ": not torch's defaults)"
    return line


def torch_runners(torch, cfg, tensors, tokens, B, T):
    """fp32, and bf16 autocast where this torch runs it on the CPU (a failure is reported, not fatal)."""
    runners = [Torch(torch, cfg, tensors, tokens, B, T, autocast=False)]
    try:
        runners.append(Torch(torch, cfg, tensors, tokens, B, T, autocast=True))
    except (RuntimeError, TypeError, AttributeError) as e:
        print(f"pytorch bf16: autocast on the CPU failed, left out ({type(e).__name__}: {str(e).splitlines()[0]})")
    return runners


def main():
    descriptor, B, T, rounds, threads = parse_args(sys.argv[1:])
    try:
        import torch
    except ImportError as e:
        print(f"SKIP bench_cpu_vs_torch: torch not importable ({e})")
        return
    sys.path.insert(0, os.path.join(ROOT, "dev"))
    import train_gpt2 as ref  # the model's shapes and file writer; imported, it leaves torch at its defaults

    torch.set_num_threads(threads)
    print(torch_settings(torch), flush=True)
    L, NH, C = DESCRIPTORS[descriptor]
    cfg = ref.GPTConfig(max_seq_len=1024, vocab_size=50257, padded_vocab_size=50304, num_layers=L, num_heads=NH,
                        channels=C)
    runners = []
    with tempfile.TemporaryDirectory() as folder:
        model_path, tokens_path, tensors, tokens = write_inputs(ref, torch, cfg, B, T, folder)
        for name, binary in BUILDS:
            path = os.path.join(ROOT, binary)
            if os.access(path, os.X_OK):
                runners.append(Ours(name, path, model_path, tokens_path, B, T, threads))
            else:
                print(f"{name}: {binary} not built, left out (make {binary})")
        ours = len(runners)
        runners += torch_runners(torch, cfg, tensors, tokens, B, T)
        del tensors
        times = {r.name: [] for r in runners}
        try:
            for i in range(rounds):
                for r in runners:
                    times[r.name].append(r.step_ms())
                print(f"round {i + 1}: " + ", ".join(f"{name} {ms[-1]:.0f} ms" for name, ms in times.items()),
                      flush=True)
        finally:
            for r in runners:
                r.close()
    report(times, runners[:ours], runners[ours:], descriptor, B, T, rounds, threads)


def report(times, ours, torches, descriptor, B, T, rounds, threads):
    """One line per system; on each of PyTorch's lines, each build's speed relative to it (its ms / ours: above
    1x, ours is faster)."""
    print(f"{descriptor} B={B} T={T}, {threads} threads, {rounds} rounds (one step each, taking turns)")
    for r in torches:
        print(f"  {r.name}: {r.describe()}")
    for name, ms in times.items():
        median = statistics.median(ms)
        line = f"  {name:14s} {median:10.1f} ms/step (median; min {min(ms):.1f}, max {max(ms):.1f})"
        if ours and name not in [r.name for r in ours]:
            line += "  ours relative: " + " / ".join(
                f"{r.name.replace('ours ', '')} {median / statistics.median(times[r.name]):.2f}x" for r in ours)
        print(line)


if __name__ == "__main__":
    main()
