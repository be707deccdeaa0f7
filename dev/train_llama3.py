"""
Reference Llama 3 in PyTorch: the model the C++/CUDA Llama kernels
(llmc/kernels/rmsnorm.cuh, llmc/kernels/rope.cuh, llmc/kernels/swiglu.cuh) will be compared against.

Written independently of the C++ side, in the style of dev/train_gpt2.py (whose
deterministic init, token makers and file writers it shares): plain PyTorch
autograd, every piece written out:
  - RMSNorm (no mean, no bias), eps from the config
  - RoPE with transformers' rotate_half pairing (element i with i + HS/2), the
    cos/sin table computed in double and rounded once to fp32 (as rope_table
    in llmc/kernels/rope.cuh), with Llama 3.1's frequency scaling
  - grouped-query attention: NKV key/value heads, NH / NKV query heads per kv head
  - SwiGLU MLP on a fused [gate | up] projection
  - no biases anywhere; the LM head tied to the embedding or separate

    python3 dev/train_llama3.py --check            # self-checks of the model (PASS/FAIL lines, a tally)
    python3 dev/train_llama3.py --out DIR          # DIR/llama3_*_debug.bin and llama3_*_train.bin (test/ref/)
    python3 dev/train_llama3.py --init-preview     # first init values of each tensor

The debug files have dev/train_gpt2.py's debug layout (tokens, logits, loss,
then the gradients in param_names order), the train files its train layout
(K AdamW steps of A micro-batches, or Muon + AdamW steps for small_muon:
losses, norms, learning rates, the final parameters); test/model/test_llama3.cu
reads them. dev/check_llama3_vs_hf.py checks
this model against transformers' LlamaForCausalLM with the same weights.
Without torch: one `error:` line, exit 1.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_mode  # noqa: E402

# Determinism (reference_mode.py) when run as the program that writes and checks its files; a
# program that imports this module for its model keeps torch's defaults, or pins them itself.
if __name__ == "__main__":
    reference_mode.pin_env()  # before torch is imported

import argparse
import math
from dataclasses import dataclass, replace

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print(f"error: dev/train_llama3.py needs torch and numpy ({e}); pip install torch numpy", file=sys.stderr)
    sys.exit(1)

from train_gpt2 import (DOC_LENGTHS, HParams, MuonAdamW, debug_state, doc_tokens, normal_fp32,  # noqa: E402
                        report_train, tokens, train, write_debug, write_train)

# -----------------------------------------------------------------------------
# the model


@dataclass(frozen=True)
class LlamaConfig:
    max_seq_len: int        # maxT: rows of the RoPE table
    vocab_size: int         # V
    padded_vocab_size: int  # Vp: rows of wte (padded rows are 0)
    num_layers: int         # L
    num_heads: int          # NH query heads
    num_kv_heads: int       # NKV key/value heads; divides NH
    channels: int           # C = NH * HS
    ffn_hidden: int         # F: SwiGLU width (gate and up are F each)
    tied: bool = True       # LM head = wte, else its own lmheadw
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    # Llama 3.1 rope_scaling; rope_factor = 1 leaves the frequencies alone
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192

    @property
    def head_size(self):
        return self.channels // self.num_heads

    def validate(self):
        if self.channels % self.num_heads or self.num_heads % self.num_kv_heads or self.head_size % 2:
            raise ValueError(f"channels {self.channels}, heads {self.num_heads}, kv heads {self.num_kv_heads}: "
                             "NH must divide C, NKV must divide NH, and the head size must be even")


def param_names(cfg):
    """The parameter tensors in file order; lmheadw only when the head is untied."""
    names = ["wte", "attnnormw", "qkvw", "attprojw", "mlpnormw", "fcw", "fcprojw", "normfw"]
    return names if cfg.tied else names + ["lmheadw"]


def param_shapes(cfg):
    L, C, F_, Vp, HS = cfg.num_layers, cfg.channels, cfg.ffn_hidden, cfg.padded_vocab_size, cfg.head_size
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * HS
    shapes = {
        "wte": (Vp, C),
        "attnnormw": (L, C),
        "qkvw": (L, qkv, C),            # rows [q: NH*HS | k: NKV*HS | v: NKV*HS]
        "attprojw": (L, C, C),
        "mlpnormw": (L, C),
        "fcw": (L, 2 * F_, C),          # rows [gate: F | up: F], as llmc/kernels/swiglu.cuh takes them
        "fcprojw": (L, C, F_),
        "normfw": (C,),
        "lmheadw": (Vp, C),
    }
    return {n: shapes[n] for n in param_names(cfg)}


def num_parameters(cfg):
    return sum(math.prod(s) for s in param_shapes(cfg).values())


def rope_frequencies(cfg):
    """f_i = theta^(-2i/HS) with Llama 3.1's scaling, in double (the rule: llmc/kernels/rope.cuh)."""
    HS, orig = cfg.head_size, cfg.rope_original_max_position
    lo, hi, factor = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_factor
    out = []
    for i in range(HS // 2):
        f = cfg.rope_theta ** (-2.0 * i / HS)
        wavelen = 2 * math.pi / f
        if wavelen < orig / hi:
            out.append(f)
        elif wavelen > orig / lo:
            out.append(f / factor)
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def rope_table(cfg):
    """(maxT, HS/2) cos and sin of p f_i, computed in double, rounded once to fp32."""
    f = np.array(rope_frequencies(cfg), dtype=np.float64)
    angle = np.arange(cfg.max_seq_len, dtype=np.float64)[:, None] * f[None, :]
    return torch.from_numpy(np.cos(angle).astype(np.float32)), torch.from_numpy(np.sin(angle).astype(np.float32))


def apply_rope(x, cos, sin):
    """x (B, H, T, HS); cos, sin (B, 1, T, HS/2) for each token's position. Pairs (i, i + HS/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def doc_starts(idx, V):
    """start[b, t]: the last position p <= t with p == 0 or idx[b, p] == V-1 (a document's first token)."""
    t = torch.arange(idx.shape[1])
    starts = torch.where((idx == V - 1) | (t == 0), t, torch.zeros_like(idx))
    return torch.cummax(starts, dim=1).values


class Llama(nn.Module):
    """Llama 3 with its weights as stacked tensors (one per kind, layers along dim 0)."""

    def __init__(self, cfg, init_tensors, docs=False):
        """docs: documents (each starting at token V-1) attend only within themselves and
        their RoPE positions restart at 0 at each start (document-relative positions)."""
        super().__init__()
        cfg.validate()
        self.cfg, self.docs = cfg, docs
        for name in param_names(cfg):
            setattr(self, name, nn.Parameter(init_tensors[name].clone()))
        cos, sin = rope_table(cfg)
        self.register_buffer("rope_cos", cos)
        self.register_buffer("rope_sin", sin)
        T = cfg.max_seq_len
        self.register_buffer("causal", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def params(self):
        return [getattr(self, name) for name in param_names(self.cfg)]

    def forward(self, idx, sdpa=False):
        """idx (B,T) int64 -> logits (B,T,Vp) fp32. sdpa=True: torch's fused attention (a cross-check)."""
        cfg = self.cfg
        B, T = idx.shape
        C, NH, NKV, HS, eps = cfg.channels, cfg.num_heads, cfg.num_kv_heads, cfg.head_size, cfg.norm_eps
        t = torch.arange(T)
        if self.docs:
            start = doc_starts(idx, cfg.vocab_size)
            pos = t[None, :] - start                                               # (B,T)
            mask = (self.causal[:T, :T] & (t[None, None, :] >= start[:, :, None]))[:, None]  # (B,1,T,T)
        else:
            pos = t[None, :].expand(B, T)
            mask = self.causal[:T, :T]
        cos, sin = self.rope_cos[pos][:, None], self.rope_sin[pos][:, None]       # (B,1,T,HS/2)
        x = F.embedding(idx, self.wte)
        for l in range(cfg.num_layers):
            h = rms_norm(x, self.attnnormw[l], eps)
            q, k, v = F.linear(h, self.qkvw[l]).split([NH * HS, NKV * HS, NKV * HS], dim=2)
            q = apply_rope(q.view(B, T, NH, HS).transpose(1, 2), cos, sin)      # (B,NH,T,HS)
            k = apply_rope(k.view(B, T, NKV, HS).transpose(1, 2), cos, sin)     # (B,NKV,T,HS)
            v = v.view(B, T, NKV, HS).transpose(1, 2)
            # query head h reads kv head h // (NH / NKV)
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
                att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
                y = att @ v
            x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), self.attprojw[l])
            h = rms_norm(x, self.mlpnormw[l], eps)
            gate, up = F.linear(h, self.fcw[l]).split(cfg.ffn_hidden, dim=2)
            x = x + F.linear(F.silu(gate) * up, self.fcprojw[l])
        x = rms_norm(x, self.normfw, eps)
        return F.linear(x, self.wte if cfg.tied else self.lmheadw)

    def loss_sum(self, logits, targets):
        """Sum of cross-entropy over the targets that are not -1, on the first V columns."""
        V = self.cfg.vocab_size
        return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1), ignore_index=-1, reduction="sum")


# -----------------------------------------------------------------------------
# initialization: dev/train_gpt2.py's normal_fp32 (reproducible exactly in C++)


def init_std(cfg, name):
    """None for the norm weights (all 1)."""
    if name in ("wte", "qkvw", "fcw", "lmheadw"):
        return 0.02
    if name in ("attprojw", "fcprojw"):
        return 0.02 / math.sqrt(2 * cfg.num_layers)  # residual projections
    return None


def init_params(cfg, seed):
    out = {}
    for k, (name, shape) in enumerate(param_shapes(cfg).items()):
        n, std = math.prod(shape), init_std(cfg, name)
        a = normal_fp32(seed, k, n, std) if std is not None else np.ones(n, np.float32)
        t = torch.from_numpy(a.reshape(shape))
        if name in ("wte", "lmheadw"):
            t[cfg.vocab_size:] = 0  # padded vocabulary rows
        out[name] = t
    return out


def init_preview(cfg, seed, n=4):
    print(f"init preview: seed {seed}, {cfg}")
    for k, name in enumerate(param_names(cfg)):
        std = init_std(cfg, name)
        vals = normal_fp32(seed, k, n, std) if std is not None else np.ones(n, np.float32)
        print(f"  {k:2d} {name:9s} " + " ".join(f"{v:+.9e}(0x{int(b):08x})" for v, b in zip(vals, vals.view(np.uint32))))


# -----------------------------------------------------------------------------
# the cases

SMALL = LlamaConfig(max_seq_len=64, vocab_size=250, padded_vocab_size=256, num_layers=2, num_heads=4,
                    num_kv_heads=2, channels=64, ffn_hidden=96)
SMALL_SEED = 1337
MHA = replace(SMALL, num_kv_heads=SMALL.num_heads)  # one kv head per query head
# The steps' norms lie within 4% of each other (0.78 .. 0.81), too close for a
# clip between them that a C++ run within tolerance would also take; 0.5 clips
# every step, so the clipping path is in every step.
SMALL_HP = HParams(lr=1e-3, warmup=2, final_frac=0.1, weight_decay=0.1, grad_clip=0.5)
DECAYED = ("wte", "qkvw", "attprojw", "fcw", "fcprojw", "lmheadw")  # the matrices; not the norm weights


# Muon + AdamW (--optimizer muon, --muon-lr 0.02 and --muon-wd 0 as the trainer's
# defaults), AdamW's settings of SMALL_HP (the same clip: it clips every step here too)
MUON_HP = replace(SMALL_HP, muon_lr=0.02, muon_weight_decay=0.0)


def make_optimizer(model, hp, exclude=()):
    """exclude: tensors another optimizer updates (Muon's)."""
    decay = [getattr(model, n) for n in param_names(model.cfg) if n in DECAYED and n not in exclude]
    no_decay = [getattr(model, n) for n in param_names(model.cfg) if n not in DECAYED and n not in exclude]
    groups = [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps, foreach=False, fused=False)


def llama3_muon_blocks(cfg):
    """Llama's Muon matrices (docs/muon.md's table), as row blocks of one layer's
    tensor: q, k, v of qkvw apart, gate and up of fcw apart, the others whole."""
    C, F_, KV = cfg.channels, cfg.ffn_hidden, cfg.num_kv_heads * cfg.head_size
    return {"qkvw": (C, KV, KV), "attprojw": (C,), "fcw": (F_, F_), "fcprojw": (C,)}


def muon_optimizer(model, hp):
    return MuonAdamW(model, hp, llama3_muon_blocks(model.cfg), lambda exclude: make_optimizer(model, hp, exclude))


# (tag, config, documents, token seed): one batch's logits, loss and gradients
DEBUG_CASES = (("small", SMALL, False, 1), ("untied", replace(SMALL, tied=False), False, 2), ("docs", SMALL, True, 3),
               ("mha", MHA, False, 4), ("mha_untied", replace(MHA, tied=False), False, 5))
# (tag, config, token seed, hyper-parameters, optimizer maker): K steps of A micro-batches
TRAIN_CASES = (("small", SMALL, 6, SMALL_HP, make_optimizer), ("untied", replace(SMALL, tied=False), 7, SMALL_HP,
               make_optimizer), ("mha", MHA, 8, SMALL_HP, make_optimizer),
               ("small_muon", SMALL, 6, MUON_HP, muon_optimizer))


def generate(out):
    os.makedirs(out, exist_ok=True)
    written = []
    for tag, cfg, docs, seed in DEBUG_CASES:
        rng = np.random.RandomState(seed)
        x, y = doc_tokens(rng, cfg.vocab_size, 4, 32, DOC_LENGTHS) if docs else tokens(rng, cfg.vocab_size, 4, 32)
        logits, loss, grads = debug_state(Llama(cfg, init_params(cfg, SMALL_SEED), docs=docs), x, y)
        name = f"llama3_{tag}_debug.bin"
        write_debug(os.path.join(out, name), x, y, logits, loss, grads)
        print(f"wrote {os.path.join(out, name)}: {num_parameters(cfg)} parameters, loss {loss:.6f}")
        written.append(name)
    K, A, B, T = 5, 2, 4, 32
    for tag, cfg, seed, hp, optimizer in TRAIN_CASES:
        rng = np.random.RandomState(seed)
        xs, ys = np.zeros((K, A, B, T), np.int32), np.zeros((K, A, B, T), np.int32)
        for s in range(K):
            for mb in range(A):
                xs[s, mb], ys[s, mb] = tokens(rng, cfg.vocab_size, B, T)
        model = Llama(cfg, init_params(cfg, SMALL_SEED))
        losses, norms, lrs = train(model, hp, xs, ys, optimizer(model, hp))
        name = f"llama3_{tag}_train.bin"
        write_train(os.path.join(out, name), hp, num_parameters(cfg), SMALL_SEED, xs, ys, losses, norms, lrs,
                    [p.detach() for p in model.params()])
        report_train(name, losses, norms, lrs, hp)
        written.append(name)
    return written


# -----------------------------------------------------------------------------
# self-check


def check():
    tally = [0, 0]  # passed, failed

    def expect(cond, what):
        print(("PASS " if cond else "FAIL ") + what)
        tally[not cond] += 1

    cfg = SMALL
    init = init_params(cfg, SMALL_SEED)
    # non-unit norm weights, so that a norm weight applied in the wrong place shows
    g = torch.Generator().manual_seed(5)
    for name in ("attnnormw", "mlpnormw", "normfw"):
        init[name] = 1 + 0.3 * torch.randn(init[name].shape, generator=g)
    model = Llama(cfg, init)
    rng = np.random.RandomState(1)
    x, _ = tokens(rng, cfg.vocab_size, 2, 32)
    xt = torch.from_numpy(x).long()
    with torch.no_grad():
        ref = model(xt)
        diff = float((model(xt, sdpa=True) - ref).abs().max())
    expect(diff < 1e-5, f"explicit attention = SDPA, GQA NH={cfg.num_heads} NKV={cfg.num_kv_heads} (max diff {diff:.1e})")

    # GQA: the same model with every kv head written out once per query head (NKV = NH)
    full_cfg = replace(cfg, num_kv_heads=cfg.num_heads)
    HS, NH, NKV = cfg.head_size, cfg.num_heads, cfg.num_kv_heads
    full = dict(init)
    q, k, v = init["qkvw"].split([NH * HS, NKV * HS, NKV * HS], dim=1)
    rep = lambda w: w.view(cfg.num_layers, NKV, HS, -1).repeat_interleave(NH // NKV, dim=1).reshape(cfg.num_layers, NH * HS, -1)
    full["qkvw"] = torch.cat([q, rep(k), rep(v)], dim=1)
    with torch.no_grad():
        diff = float((Llama(full_cfg, full)(xt) - ref).abs().max())
    expect(diff < 1e-5, f"GQA = multi-head attention with each kv head repeated for its query heads (max diff {diff:.1e})")

    # RoPE: a rotation (norms kept), relative (q.k depends on the position difference only)
    cos, sin = model.rope_cos, model.rope_sin
    qv, kv = torch.randn(1, 1, 1, HS, generator=g), torch.randn(1, 1, 1, HS, generator=g)
    rot = lambda x, p: apply_rope(x, cos[p][None, None, None], sin[p][None, None, None])
    dots = [float((rot(qv, p + 7) * rot(kv, p)).sum()) for p in (0, 9, 40)]
    norm_diff = abs(float(rot(qv, 33).norm()) - float(qv.norm()))
    expect(max(dots) - min(dots) < 1e-5 and norm_diff < 1e-5,
           f"RoPE keeps norms ({norm_diff:.1e}) and q.k depends on p_q - p_k only (spread {max(dots) - min(dots):.1e})")
    f = rope_frequencies(cfg)
    expect(f[0] == 1.0 and abs(f[-1] - cfg.rope_theta ** (-(HS - 2) / HS) / cfg.rope_factor) < 1e-18,
           "Llama 3.1 scaling: the fastest frequency kept, the slowest divided by the factor")

    # documents: each run alone (positions from 0) gives the same logits
    docs_model = Llama(cfg, init, docs=True)
    rng = np.random.RandomState(6)
    x, _ = doc_tokens(rng, cfg.vocab_size, 2, 32, DOC_LENGTHS)
    xt = torch.from_numpy(x).long()
    with torch.no_grad():
        got = docs_model(xt)
        alone = torch.zeros_like(got)
        for b in range(xt.shape[0]):
            starts = [t for t in range(xt.shape[1]) if t == 0 or int(xt[b, t]) == cfg.vocab_size - 1]
            for s0, s1 in zip(starts, starts[1:] + [xt.shape[1]]):
                alone[b, s0:s1] = model(xt[b:b + 1, s0:s1])[0]
    diff = float((got - alone).abs().max())
    expect(diff < 1e-5, f"document positions and mask: each document run alone gives the same logits (max diff {diff:.1e})")

    # untied head: lmheadw = wte gives the tied model
    untied_cfg = replace(cfg, tied=False)
    untied = dict(init, lmheadw=init["wte"].clone())
    x, _ = tokens(np.random.RandomState(1), cfg.vocab_size, 2, 32)
    with torch.no_grad():
        diff = float((Llama(untied_cfg, untied)(torch.from_numpy(x).long()) - ref).abs().max())
    expect(diff == 0.0, f"untied head holding wte's values = the tied model (max diff {diff:.1e})")
    print(f"train_llama3: {tally[0]} passed, {tally[1]} failed")
    return tally[1] == 0


def main():
    reference_mode.pin_torch(torch)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", metavar="DIR", help="write the debug states into DIR")
    ap.add_argument("--check", action="store_true", help="self-checks of the model")
    ap.add_argument("--init-preview", action="store_true", help="print the first values of every init tensor")
    args = ap.parse_args()
    if args.init_preview:
        init_preview(SMALL, SMALL_SEED)
    if args.check and not check():
        sys.exit(1)
    if args.out:
        try:
            generate(args.out)
        except OSError as e:
            print(f"error: {args.out}: {e.strerror or e}", file=sys.stderr)
            sys.exit(1)
    if not (args.init_preview or args.check or args.out):
        ap.error("nothing to do: give --check, --out DIR or --init-preview")


if __name__ == "__main__":
    main()
