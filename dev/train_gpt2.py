"""
Reference GPT-2 in PyTorch: writes the files in test/ref/ that the C++/CUDA
tests compare against.

It is written independently of the C++ trainer on purpose: same model, same
file formats, but plain PyTorch autograd and torch.optim.AdamW (and, for
--optimizer muon, a Muon of its own: MuonAdamW), so that an agreement between
the two says something.

    python3 dev/train_gpt2.py                 # writes test/ref/ (default)
    python3 dev/train_gpt2.py --out DIR       # writes DIR/
    python3 dev/train_gpt2.py --check [DIR]   # re-reads DIR (default test/ref),
                                              # regenerates, compares bytes
    python3 dev/train_gpt2.py --init-preview  # first init values of each tensor

What the C++ side must reproduce exactly (bit for bit) is the initialization
(init_params below, pure Python with the math module) and the file layouts
(write_* below). Everything else (logits, losses, gradients, trained weights)
is compared with tolerances.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_mode  # noqa: E402

# Determinism (reference_mode.py) when run as the program that writes and checks test/ref/; a
# program that imports this module for its model keeps torch's defaults, or pins them itself.
if __name__ == "__main__":
    reference_mode.pin_env()  # before torch is imported

import argparse
import hashlib
import math
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# file format constants (llm.c's, plus our trajectory file)

MODEL_MAGIC = 20240326
MODEL_VERSION_FP32 = 3
MODEL_VERSION_BF16 = 5
DEBUG_MAGIC = 20240327
DEBUG_VERSION = 2
TRAIN_MAGIC = 20261129
TRAIN_VERSION = 1
HEADER_INTS = 256  # 1024 bytes

# -----------------------------------------------------------------------------
# the model


@dataclass
class GPTConfig:
    max_seq_len: int        # maxT
    vocab_size: int         # V: the real vocabulary; the loss sees these columns
    padded_vocab_size: int  # Vp: rows of wte (V rounded up; padded rows are 0)
    num_layers: int         # L
    num_heads: int          # NH
    channels: int           # C


# The 16 parameter tensors, in the order of the checkpoint, the gradients of the
# debug state and the final weights of the trajectory file.
PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
# the tensors with weight decay: the matrices (embeddings included)
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def param_shapes(cfg):
    V, Vp, maxT = cfg.vocab_size, cfg.padded_vocab_size, cfg.max_seq_len
    L, C = cfg.num_layers, cfg.channels
    return {
        "wte": (Vp, C), "wpe": (maxT, C),
        "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
        "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C),
        "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
        "lnfw": (C,), "lnfb": (C,),
    }


def num_parameters(cfg):
    return sum(math.prod(s) for s in param_shapes(cfg).values())


class GPT(nn.Module):
    """GPT-2 with its weights as the 16 stacked tensors of llm.c (one tensor per
    kind, layers stacked along dim 0), so that the parameter order is the file
    order and the gradients come out in that layout too."""

    def __init__(self, cfg, init_tensors, docs=False):
        """docs: documents (each starting at token V-1, and at position 0) are
        kept apart: attention is causal within each one, and position ids
        restart at each (the trainer's --doc-mask 1 --doc-positions 1)."""
        super().__init__()
        self.cfg = cfg
        self.docs = docs
        for name in PARAM_NAMES:
            setattr(self, name, nn.Parameter(init_tensors[name].clone()))
        T = cfg.max_seq_len
        self.register_buffer("causal", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def params(self):
        return [getattr(self, name) for name in PARAM_NAMES]

    def forward(self, idx, sdpa=False):
        """idx (B,T) int64 -> logits (B,T,Vp) fp32, over every padded column.
        sdpa=True swaps in torch's fused attention (only --check uses it, to
        cross-check the explicit one)."""
        cfg = self.cfg
        B, T = idx.shape
        C, NH = cfg.channels, cfg.num_heads
        HS = C // NH
        t = torch.arange(T)
        if self.docs:
            # start[b, t]: the last position p <= t with p == 0 or idx[b, p] == V-1
            starts = torch.where((idx == cfg.vocab_size - 1) | (t == 0), t, torch.zeros_like(idx))
            start = torch.cummax(starts, dim=1).values                      # (B,T)
            mask = self.causal[:T, :T] & (t[None, None, :] >= start[:, :, None])  # (B,T,T): key >= its query's start
            mask = mask[:, None]                                            # (B,1,T,T)
            x = F.embedding(idx, self.wte) + self.wpe[t - start]
        else:
            mask = self.causal[:T, :T]
            x = F.embedding(idx, self.wte) + self.wpe[:T]
        for l in range(cfg.num_layers):
            # attention
            h = F.layer_norm(x, (C,), self.ln1w[l], self.ln1b[l], eps=1e-5)
            qkv = F.linear(h, self.qkvw[l], self.qkvb[l])  # (B,T,3C): [q | k | v]
            q, k, v = qkv.split(C, dim=2)
            # inside each of q, k, v the heads are contiguous: column = head*HS + d
            q = q.view(B, T, NH, HS).transpose(1, 2)  # (B,NH,T,HS)
            k = k.view(B, T, NH, HS).transpose(1, 2)
            v = v.view(B, T, NH, HS).transpose(1, 2)
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))  # (B,NH,T,T)
                att = att.masked_fill(~mask, float("-inf"))
                att = torch.softmax(att, dim=-1)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + F.linear(y, self.attprojw[l], self.attprojb[l])
            # MLP
            h = F.layer_norm(x, (C,), self.ln2w[l], self.ln2b[l], eps=1e-5)
            f = F.gelu(F.linear(h, self.fcw[l], self.fcb[l]), approximate="tanh")
            x = x + F.linear(f, self.fcprojw[l], self.fcprojb[l])
        x = F.layer_norm(x, (C,), self.lnfw, self.lnfb, eps=1e-5)
        return F.linear(x, self.wte)  # tied LM head, all Vp columns

    def loss_sum(self, logits, targets):
        """Sum of per-token cross-entropy over the targets that are not -1; only
        the first V logit columns take part (the padded ones get no gradient)."""
        V = self.cfg.vocab_size
        return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1),
                               ignore_index=-1, reduction="sum")


# -----------------------------------------------------------------------------
# initialization: reproducible exactly in C++ (see the module docstring)

MASK64 = (1 << 64) - 1


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def normal_fp32(seed, k, n, std):
    """n draws of N(0, std^2) for tensor number k, rounded to fp32 once.
    Element i depends only on (seed, k, i): Box-Muller on two splitmix64 hashes,
    all in double; u1 is in (0, 1] so the log is finite."""
    s = splitmix64((seed * 16 + k) & MASK64)
    out = [0.0] * n
    two_pi = 2 * math.pi
    for i in range(n):
        h1 = splitmix64((s + 2 * i) & MASK64)
        h2 = splitmix64((s + 2 * i + 1) & MASK64)
        u1 = ((h1 >> 11) + 1) * 2.0**-53
        u2 = (h2 >> 11) * 2.0**-53
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(two_pi * u2)
        out[i] = std * z
    # one rounding double -> fp32 (round to nearest even)
    return np.array(out, dtype=np.float64).astype(np.float32)


def init_std(cfg, name):
    """Standard deviation of a randomly drawn tensor; None for the LayerNorm
    weights (1) and the biases (0), which draw nothing."""
    if name in ("wte", "wpe", "qkvw", "fcw"):
        return 0.02
    if name in ("attprojw", "fcprojw"):
        return 0.02 / math.sqrt(2 * cfg.num_layers)  # residual projections, GPT-2's scaling
    return None


def init_params(cfg, seed):
    """name -> fp32 torch tensor, in PARAM_NAMES order."""
    out = {}
    for k, (name, shape) in enumerate(param_shapes(cfg).items()):
        n = math.prod(shape)
        std = init_std(cfg, name)
        if std is not None:
            a = normal_fp32(seed, k, n, std)
        else:
            a = np.full(n, 1.0 if name in ("ln1w", "ln2w", "lnfw") else 0.0, np.float32)
        t = torch.from_numpy(a.reshape(shape))
        if name == "wte":
            t[cfg.vocab_size:] = 0  # padded vocabulary rows: drawn, then zeroed
        out[name] = t
    return out


def init_preview(cfg, seed, n=4, file=sys.stdout):
    """Prints the first n values of every init tensor (value and fp32 bits),
    for cross-checking the C++ init. Draws only those n, so it is fast at any
    size (element i depends on (seed, k, i) alone)."""
    print(f"init preview: seed {seed}, L={cfg.num_layers} C={cfg.channels} "
          f"V={cfg.vocab_size} Vp={cfg.padded_vocab_size} maxT={cfg.max_seq_len}", file=file)
    for k, name in enumerate(PARAM_NAMES):
        std = init_std(cfg, name)
        if std is not None:
            vals = normal_fp32(seed, k, n, std)
        else:
            vals = np.full(n, 1.0 if name in ("ln1w", "ln2w", "lnfw") else 0.0, np.float32)
        text = " ".join(f"{v:+.9e}(0x{int(b):08x})" for v, b in zip(vals, vals.view(np.uint32)))
        print(f"  {k:2d} {name:9s} {text}", file=file)


# -----------------------------------------------------------------------------
# file writers and readers (little-endian throughout)


def header(*ints, floats=None):
    """256 int32; ints go into slots 0.., floats (slot -> value) as fp32 bits."""
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:len(ints)] = ints
    for slot, value in (floats or {}).items():
        h[slot] = np.array([value], dtype="<f4").view("<i4")[0]
    return h.tobytes()


def f32(t):
    return np.ascontiguousarray(t.detach().cpu().numpy(), dtype="<f4").tobytes()


def i32(t):
    return np.ascontiguousarray(np.asarray(t), dtype="<i4").tobytes()


def bf16_bits(a):
    """fp32 -> bf16, round to nearest even, as uint16 bits (no NaNs here)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def write_model(path, cfg, tensors, bf16=False):
    version = MODEL_VERSION_BF16 if bf16 else MODEL_VERSION_FP32
    with open(path, "wb") as f:
        f.write(header(MODEL_MAGIC, version, cfg.max_seq_len, cfg.vocab_size,
                       cfg.num_layers, cfg.num_heads, cfg.channels, cfg.padded_vocab_size))
        for name in PARAM_NAMES:
            a = tensors[name].detach().numpy()
            f.write(bf16_bits(a).tobytes() if bf16 else f32(tensors[name]))


def write_debug(path, x, y, logits_v, loss, grads):
    B, T = x.shape
    with open(path, "wb") as f:
        f.write(header(DEBUG_MAGIC, DEBUG_VERSION, B, T))
        f.write(i32(x))
        f.write(i32(y))
        f.write(f32(logits_v))  # (B,T,V): unpadded
        f.write(np.array([loss], dtype="<f4").tobytes())
        for g in grads:
            f.write(f32(g))


def write_train(path, hp, num_params, seed, xs, ys, losses, norms, lrs, final_params):
    K, A, B, T = xs.shape
    floats = {16: hp.lr, 17: hp.beta1, 18: hp.beta2, 19: hp.eps, 20: hp.weight_decay, 21: hp.grad_clip,
              22: hp.final_frac}
    # slot 9: the optimizer (0 AdamW, 1 Muon + AdamW), Muon's settings in 23..25 (all 0 for AdamW)
    if hp.muon_lr > 0:
        floats.update({23: hp.muon_lr, 24: hp.muon_weight_decay, 25: hp.muon_momentum})
    with open(path, "wb") as f:
        f.write(header(TRAIN_MAGIC, TRAIN_VERSION, B, T, A, K, hp.warmup, num_params, seed, int(hp.muon_lr > 0),
                       floats=floats))
        f.write(i32(xs))
        f.write(i32(ys))
        f.write(np.array(losses, dtype="<f4").tobytes())
        f.write(np.array(norms, dtype="<f4").tobytes())
        f.write(np.array(lrs, dtype="<f4").tobytes())
        for p in final_params:
            f.write(f32(p))


class Reader:
    """Sequential reader that insists on consuming the file exactly."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0

    def take(self, dtype, count):
        nbytes = np.dtype(dtype).itemsize * count
        if self.pos + nbytes > len(self.buf):
            raise ValueError(f"{self.path}: truncated (need {self.pos + nbytes} bytes, "
                             f"have {len(self.buf)})")
        a = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += nbytes
        return a

    def header(self):
        return self.take("<i4", HEADER_INTS)

    def done(self):
        if self.pos != len(self.buf):
            raise ValueError(f"{self.path}: {len(self.buf) - self.pos} trailing bytes")


def header_float(h, slot):
    return float(np.array([h[slot]], dtype="<i4").view("<f4")[0])


def read_model(path):
    r = Reader(path)
    h = r.header()
    assert h[0] == MODEL_MAGIC, f"{path}: bad magic {h[0]}"
    assert h[1] in (MODEL_VERSION_FP32, MODEL_VERSION_BF16), f"{path}: bad version {h[1]}"
    cfg = GPTConfig(max_seq_len=int(h[2]), vocab_size=int(h[3]), num_layers=int(h[4]),
                    num_heads=int(h[5]), channels=int(h[6]), padded_vocab_size=int(h[7]))
    tensors = {}
    for name, shape in param_shapes(cfg).items():
        n = math.prod(shape)
        if h[1] == MODEL_VERSION_BF16:
            bits = r.take("<u2", n).astype(np.uint32) << 16
            a = bits.view(np.float32)
        else:
            a = r.take("<f4", n)
        tensors[name] = torch.from_numpy(a.reshape(shape))
    r.done()
    return cfg, int(h[1]), tensors


def read_debug(path, cfg):
    r = Reader(path)
    h = r.header()
    assert h[0] == DEBUG_MAGIC and h[1] == DEBUG_VERSION, f"{path}: bad header {h[:2]}"
    B, T = int(h[2]), int(h[3])
    d = {"B": B, "T": T}
    d["x"] = r.take("<i4", B * T).reshape(B, T)
    d["y"] = r.take("<i4", B * T).reshape(B, T)
    d["logits"] = r.take("<f4", B * T * cfg.vocab_size).reshape(B, T, cfg.vocab_size)
    d["loss"] = float(r.take("<f4", 1)[0])
    d["grads"] = {name: r.take("<f4", math.prod(s)).reshape(s)
                  for name, s in param_shapes(cfg).items()}
    r.done()
    return d


def read_train(path, cfg):
    r = Reader(path)
    h = r.header()
    assert h[0] == TRAIN_MAGIC and h[1] == TRAIN_VERSION, f"{path}: bad header {h[:2]}"
    B, T, A, K = (int(v) for v in h[2:6])
    d = {"B": B, "T": T, "A": A, "K": K, "warmup": int(h[6]), "num_params": int(h[7]),
         "seed": int(h[8]), "muon": int(h[9])}
    for slot, key in zip(range(16, 26), ["lr", "beta1", "beta2", "eps", "weight_decay",
                                         "grad_clip", "final_frac", "muon_lr", "muon_weight_decay",
                                         "muon_momentum"]):
        d[key] = header_float(h, slot)
    assert d["num_params"] == num_parameters(cfg), f"{path}: num_params {d['num_params']}"
    d["x"] = r.take("<i4", K * A * B * T).reshape(K, A, B, T)
    d["y"] = r.take("<i4", K * A * B * T).reshape(K, A, B, T)
    d["losses"] = r.take("<f4", K)
    d["norms"] = r.take("<f4", K)
    d["lrs"] = r.take("<f4", K)
    d["params"] = {name: r.take("<f4", math.prod(s)).reshape(s)
                   for name, s in param_shapes(cfg).items()}
    r.done()
    return d


# -----------------------------------------------------------------------------
# one debug batch, and a short training run with gradient accumulation


DOC_LENGTHS = [5, 1, 23, 9, 40, 2, 14, 70, 3, 11]  # shorter than a 16-row step, a tile, longer than a row


def debug_state(model, x, y):
    """Forward/backward of one batch with the mean loss over its unmasked
    targets: the logits (first V columns), the loss and the gradients."""
    model.zero_grad(set_to_none=True)
    xt, yt = torch.from_numpy(x).long(), torch.from_numpy(y).long()
    logits = model(xt)
    count = int((yt != -1).sum())
    loss = model.loss_sum(logits, yt) / count
    loss.backward()
    grads = [p.grad.clone() for p in model.params()]
    return logits[..., :model.cfg.vocab_size].detach(), loss.item(), grads


@dataclass
class HParams:
    lr: float = 1e-3
    warmup: int = 2
    final_frac: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    # Muon for the blocks' hidden matrices (muon_lr > 0; the trainer's --optimizer muon):
    # its lr follows lr's schedule as lr_t * muon_lr / lr, as --muon-lr does
    muon_lr: float = 0.0
    muon_weight_decay: float = 0.0
    muon_momentum: float = 0.95


def lr_at(hp, step, max_steps):
    """Linear warmup over hp.warmup steps, then cosine down to lr*final_frac."""
    if step < hp.warmup:
        return hp.lr * (step + 1) / hp.warmup
    ratio = (step - hp.warmup) / (max_steps - hp.warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    lr_min = hp.lr * hp.final_frac
    return lr_min + coeff * (hp.lr - lr_min)


def make_optimizer(model, hp, exclude=()):
    # weight decay on the matrices (wte, wpe, qkvw, attprojw, fcw, fcprojw),
    # none on LayerNorm weights and biases. Chosen by name: the layers are
    # stacked, so a bias here is 2-D too. exclude: tensors another optimizer
    # updates (Muon's).
    decay = [getattr(model, n) for n in PARAM_NAMES if n in DECAYED and n not in exclude]
    no_decay = [getattr(model, n) for n in PARAM_NAMES if n not in DECAYED and n not in exclude]
    groups = [{"params": decay, "weight_decay": hp.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps,
                             foreach=False, fused=False)


# -----------------------------------------------------------------------------
# Muon, from its definition (docs/muon.md; Keller Jordan's post): SGD with
# Nesterov momentum whose update is replaced by a Newton-Schulz approximation of
# the nearest semi-orthogonal matrix, for the blocks' hidden matrices; AdamW for
# every other tensor.

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # (a, b, c) of the quintic a s + b s^3 + c s^5
NS_STEPS = 5
NS_EPS = 1e-7
# Planted mistakes (--plant; the C++ tests must tell their trajectories from the right one):
#   "b":    b = -4.7705, two digits swapped;
#   "side": a tall X (R > C) iterated on its smaller side, X^T, and not transposed back: the
#           C x R result's elements read as R x C, what a kernel that keeps the wrong side's
#           layout writes. (The Gram of the other side in a square X's step diverges to NaN:
#           no trajectory to compare with. The larger side's Gram is the same polynomial,
#           only slower: no trajectory shows it, test_muon's guard bytes do.)
PLANTS = ("b", "side")


def newton_schulz(u, dtype=torch.float32, plant=None):
    """u (R, C) -> X ~ U V^T for u = U S V^T: X = u / (||u||_F + eps), then, on
    the smaller Gram side (X^T when R > C), NS_STEPS times
        A = X X^T,  B = b A + c A A,  X = a X + B X
    (every singular value s -> a s + b s^3 + c s^5). dtype: the operands and each
    product's one rounding (fp32 accumulation): fp32, or bf16 as the bf16 trainer
    and torch.optim.Muon compute it."""
    a, b, c = NS_COEFFICIENTS
    if plant == "b":
        b = -4.7705
    x = u.to(dtype).float()
    x = (x / (x.norm() + NS_EPS)).to(dtype).float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(NS_STEPS):
        A = (x @ x.T).to(dtype).float()
        B = (b * A + c * (A @ A)).to(dtype).float()
        x = (a * x + B @ x).to(dtype).float()
    if tall and plant == "side":
        return x.reshape(u.shape)
    return x.T if tall else x


def muon_step(w, g, m, lr, weight_decay, mu, dtype=torch.float32, plant=None):
    """One Muon step of the R x C matrix w (in place) from its gradient g (already
    clipped) and its momentum m (in place):
        m = mu m + g,  u = g + mu m  (Nesterov),  X = newton_schulz(u),
        w = w (1 - lr wd) - lr sqrt(max(1, R/C)) X."""
    m.mul_(mu).add_(g)
    X = newton_schulz(g + mu * m, dtype, plant)
    R, C = w.shape
    w.mul_(1 - lr * weight_decay).add_(X, alpha=-lr * math.sqrt(max(1.0, R / C)))


# GPT-2's Muon matrices (docs/muon.md's table): a layer's tensor cut into these
# row blocks, each one matrix: q, k and v of qkvw apart, the others whole.
def gpt2_muon_blocks(cfg):
    C = cfg.channels
    return {"qkvw": (C, C, C), "attprojw": (C,), "fcw": (4 * C,), "fcprojw": (C,)}


class MuonAdamW:
    """train()'s optimizer for --optimizer muon: Muon (muon_step, lr_t * muon_lr
    / lr) for each matrix of `blocks` ({tensor: row blocks of one layer}, every
    tensor [L, rows, cols]), torch.optim.AdamW (adamw_for(exclude)) for the other
    tensors. Muon's weight decay applies to every one of its matrices (they are all
    decayed matrices in the trainers' tables)."""

    def __init__(self, model, hp, blocks, adamw_for, dtype=torch.float32, plant=None):
        self.model, self.hp, self.dtype, self.plant = model, hp, dtype, plant
        self.adamw = adamw_for(tuple(blocks))
        self.param_groups = self.adamw.param_groups  # train() sets AdamW's lr here
        self.matrices = []  # (tensor, layer, first row, end row)
        for name, rows in blocks.items():
            p = getattr(model, name)
            assert sum(rows) == p.shape[1], f"{name}: blocks {rows} do not cover {p.shape[1]} rows"
            for layer in range(p.shape[0]):
                starts = np.cumsum((0,) + tuple(rows))
                self.matrices += [(p, layer, int(r0), int(r1)) for r0, r1 in zip(starts[:-1], starts[1:])]
        self.momentum = [torch.zeros(r1 - r0, p.shape[2]) for p, _, r0, r1 in self.matrices]

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)  # Muon's tensors too

    @torch.no_grad()
    def step(self):
        self.adamw.step()
        hp = self.hp
        lr = self.param_groups[0]["lr"] * hp.muon_lr / hp.lr
        for (p, layer, r0, r1), m in zip(self.matrices, self.momentum):
            muon_step(p[layer, r0:r1], p.grad[layer, r0:r1], m, lr, hp.muon_weight_decay, hp.muon_momentum,
                      self.dtype, self.plant)


def train(model, hp, xs, ys, opt=None):
    """xs, ys: (K, A, B, T). Each step accumulates A microbatches; every
    microbatch's loss is divided by the number of unmasked targets of the whole
    step (G), so the step is exactly one big batch's mean loss, however the
    masked targets fall across microbatches. opt: the model's AdamW (GPT-2's
    make_optimizer when None)."""
    K, A = xs.shape[:2]
    opt = make_optimizer(model, hp) if opt is None else opt
    losses, norms, lrs = [], [], []
    for step in range(K):
        lr = lr_at(hp, step, K)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        G = int((ys[step] != -1).sum())  # global count, over all A microbatches
        step_loss = 0.0
        for mb in range(A):
            xt = torch.from_numpy(xs[step, mb]).long()
            yt = torch.from_numpy(ys[step, mb]).long()
            loss_mb = model.loss_sum(model(xt), yt) / G
            loss_mb.backward()  # .grad += across microbatches
            step_loss += loss_mb.item()
        # pre-clip global norm; scale grads by min(1, clip / (norm + 1e-6))
        norm = torch.nn.utils.clip_grad_norm_(model.params(), hp.grad_clip, foreach=False)
        opt.step()
        losses.append(step_loss)
        norms.append(float(norm))
        lrs.append(lr)
    return losses, norms, lrs


# -----------------------------------------------------------------------------
# the cases


SMALL = GPTConfig(max_seq_len=64, vocab_size=250, padded_vocab_size=256,
                  num_layers=2, num_heads=4, channels=64)
SMALL_SEED = 1337
VOCAB = GPTConfig(max_seq_len=16, vocab_size=50257, padded_vocab_size=50304,
                  num_layers=1, num_heads=1, channels=16)
VOCAB_SEED = 4242

# grad_clip is chosen per trajectory from the printed norms so that the clip
# acts on some steps and not on others, with every norm at least ~4% away from
# the threshold (so a C++ run within tolerance takes the same branch). The
# masked batches have fewer targets per step, hence larger norms, and no single
# value does both. The value is in each file's header (slot 21).
SMALL_HP = HParams(lr=1e-3, warmup=2, final_frac=0.1, weight_decay=0.1, grad_clip=1.05)
DOCS_HP = HParams(lr=1e-3, warmup=2, final_frac=0.1, weight_decay=0.1, grad_clip=1.10)
# Muon (--optimizer muon, --muon-lr 0.02 as the trainers' default) with AdamW's
# settings of SMALL_HP for the other tensors; --muon-wd 0.1 (not the default 0) so
# that the decay of Muon's matrices is in the trajectory.
MUON_HP = HParams(lr=1e-3, warmup=2, final_frac=0.1, weight_decay=0.1, grad_clip=1.04, muon_lr=0.02,
                  muon_weight_decay=0.1)
MASKED_HP = HParams(lr=1e-3, warmup=2, final_frac=0.1, weight_decay=0.1, grad_clip=1.45)


def tokens(rng, V, B, T):
    """B rows of T+1 tokens -> inputs and next-token targets, as in a data loader."""
    seq = rng.randint(0, V, size=(B, T + 1)).astype(np.int32)
    return seq[:, :-1].copy(), seq[:, 1:].copy()


def doc_tokens(rng, V, rows, T, lengths):
    """rows of T+1 tokens cut from one stream of documents, as the data loader
    cuts packed shards: each document is token V-1 followed by random tokens
    below V-1, with lengths cycling through `lengths`, so documents cross
    row (and micro-batch) boundaries."""
    stream, k = [], 0
    while len(stream) < rows * T + 1:
        n = lengths[k % len(lengths)]
        stream += [V - 1] + rng.randint(0, V - 1, size=n - 1).tolist()
        k += 1
    seq = np.array([stream[r * T:r * T + T + 1] for r in range(rows)], np.int32)
    return seq[:, :-1].copy(), seq[:, 1:].copy()


def mask_exact(rng, y, n_masked):
    """Sets exactly n_masked targets of y (any shape) to -1, chosen at random."""
    flat = y.reshape(-1)
    flat[rng.choice(flat.size, size=n_masked, replace=False)] = -1


def report_train(tag, losses, norms, lrs, hp):
    for s, (l, n, lr) in enumerate(zip(losses, norms, lrs)):
        clip = "clipped" if n > hp.grad_clip else "not clipped"
        print(f"  {tag} step {s}: loss {l:.6f}  grad norm {n:.6f} ({clip})  lr {lr:.6e}")


def generate(out):
    os.makedirs(out, exist_ok=True)
    written = []

    def path(name):
        written.append(name)
        return os.path.join(out, name)

    # --- small ---------------------------------------------------------------
    cfg = SMALL
    init = init_params(cfg, SMALL_SEED)
    print(f"small: L={cfg.num_layers} C={cfg.channels} NH={cfg.num_heads} V={cfg.vocab_size} "
          f"Vp={cfg.padded_vocab_size} maxT={cfg.max_seq_len} seed {SMALL_SEED}, "
          f"{num_parameters(cfg)} parameters")
    for name in ("wte", "qkvw"):
        print(f"  init {name}[:4] = " + " ".join(f"{v:+.9e}" for v in init[name].reshape(-1)[:4].tolist()))
    write_model(path("small_model_fp32.bin"), cfg, init)
    write_model(path("small_model_bf16.bin"), cfg, init, bf16=True)

    rng = np.random.RandomState(1)
    x, y = tokens(rng, cfg.vocab_size, 4, 32)
    logits, loss, grads = debug_state(GPT(cfg, init), x, y)
    write_debug(path("small_debug.bin"), x, y, logits, loss, grads)
    print(f"  small_debug: loss {loss:.6f}")

    rng = np.random.RandomState(2)
    K, A, B, T = 5, 2, 4, 32
    xs = np.zeros((K, A, B, T), np.int32)
    ys = np.zeros((K, A, B, T), np.int32)
    for s in range(K):
        for mb in range(A):
            xs[s, mb], ys[s, mb] = tokens(rng, cfg.vocab_size, B, T)
    model = GPT(cfg, init)
    losses, norms, lrs = train(model, SMALL_HP, xs, ys)
    write_train(path("small_train.bin"), SMALL_HP, num_parameters(cfg), SMALL_SEED, xs, ys,
                losses, norms, lrs, model.params())
    report_train("small_train", losses, norms, lrs, SMALL_HP)

    # --- muon: the same batches, Muon for the blocks' matrices; and the planted mistakes ---
    for plant in (None,) + PLANTS:
        model = GPT(cfg, init)
        opt = MuonAdamW(model, MUON_HP, gpt2_muon_blocks(cfg), lambda ex: make_optimizer(model, MUON_HP, ex),
                        plant=plant)
        losses, norms, lrs = train(model, MUON_HP, xs, ys, opt)
        name = "small_muon_train.bin" if plant is None else f"small_muon_plant_{plant}_train.bin"
        write_train(path(name), MUON_HP, num_parameters(cfg), SMALL_SEED, xs, ys, losses, norms, lrs,
                    model.params())
        report_train(name, losses, norms, lrs, MUON_HP)

    # --- masked: same model, targets -1 -----------------------------------------
    rng = np.random.RandomState(3)
    x, y = tokens(rng, cfg.vocab_size, 4, 32)
    # uneven over rows: row 0 none, row 1 a masked prefix (as a prompt would
    # be), rows 2 and 3 scattered, few and many
    y[1, :18] = -1
    mask_exact(rng, y[2], 5)
    mask_exact(rng, y[3], 14)
    logits, loss, grads = debug_state(GPT(cfg, init), x, y)
    write_debug(path("masked_debug.bin"), x, y, logits, loss, grads)
    print(f"  masked_debug: {(y == -1).sum()} of {y.size} targets masked, loss {loss:.6f}")

    rng = np.random.RandomState(4)
    K, A, B, T = 5, 4, 2, 32
    n = B * T
    # masked targets per (step, microbatch): microbatch 0 ~90%, 1 ~50%, 2 none,
    # 3 ~20%; step 2's microbatch 0 keeps a single target and step 4's keeps
    # none at all (it then adds nothing to the loss or the gradients)
    n_masked = np.array([[58, 32, 0, 13]] * K)
    n_masked[2, 0] = n - 1
    n_masked[4, 0] = n
    xs = np.zeros((K, A, B, T), np.int32)
    ys = np.zeros((K, A, B, T), np.int32)
    for s in range(K):
        for mb in range(A):
            xs[s, mb], ys[s, mb] = tokens(rng, cfg.vocab_size, B, T)
            mask_exact(rng, ys[s, mb], int(n_masked[s, mb]))
    model = GPT(cfg, init)
    losses, norms, lrs = train(model, MASKED_HP, xs, ys)
    write_train(path("masked_train.bin"), MASKED_HP, num_parameters(cfg), SMALL_SEED, xs, ys,
                losses, norms, lrs, model.params())
    counts = (ys != -1).reshape(K, A, -1).sum(-1)
    for s in range(K):
        print(f"  masked_train step {s}: unmasked targets per microbatch {counts[s].tolist()}, "
              f"G = {counts[s].sum()}")
    report_train("masked_train", losses, norms, lrs, MASKED_HP)

    # --- docs: packed documents, kept apart (--doc-mask 1 --doc-positions 1) -------
    rng = np.random.RandomState(6)
    x, y = doc_tokens(rng, cfg.vocab_size, 4, 32, DOC_LENGTHS)
    logits, loss, grads = debug_state(GPT(cfg, init, docs=True), x, y)
    write_debug(path("docs_debug.bin"), x, y, logits, loss, grads)
    print(f"  docs_debug: {int((x == cfg.vocab_size - 1).sum())} document starts in 4 x 32 tokens, loss {loss:.6f}")

    rng = np.random.RandomState(7)
    K, A, B, T = 5, 2, 4, 32
    xs = np.zeros((K, A, B, T), np.int32)
    ys = np.zeros((K, A, B, T), np.int32)
    for s in range(K):  # one stream per step, cut into A x B rows
        x, y = doc_tokens(rng, cfg.vocab_size, A * B, T, DOC_LENGTHS[s:] + DOC_LENGTHS[:s])
        xs[s], ys[s] = x.reshape(A, B, T), y.reshape(A, B, T)
    model = GPT(cfg, init, docs=True)
    losses, norms, lrs = train(model, DOCS_HP, xs, ys)
    write_train(path("docs_train.bin"), DOCS_HP, num_parameters(cfg), SMALL_SEED, xs, ys,
                losses, norms, lrs, model.params())
    report_train("docs_train", losses, norms, lrs, DOCS_HP)

    # --- vocab: the real GPT-2 vocabulary, debug state only --------------------
    cfg = VOCAB
    init = init_params(cfg, VOCAB_SEED)
    print(f"vocab: L={cfg.num_layers} C={cfg.channels} NH={cfg.num_heads} V={cfg.vocab_size} "
          f"Vp={cfg.padded_vocab_size} maxT={cfg.max_seq_len} seed {VOCAB_SEED}, "
          f"{num_parameters(cfg)} parameters")
    rng = np.random.RandomState(5)
    x, y = tokens(rng, cfg.vocab_size, 1, 8)
    logits, loss, grads = debug_state(GPT(cfg, init), x, y)
    write_debug(path("vocab_debug.bin"), x, y, logits, loss, grads)
    print(f"  vocab_debug: loss {loss:.6f}")

    write_sums(out, written)
    return written


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_sums(out, names):
    # sha256sum's format: `cd test/ref && sha256sum -c SHA256SUMS` checks it
    with open(os.path.join(out, "SHA256SUMS"), "w") as f:
        for name in sorted(names):
            f.write(f"{sha256(os.path.join(out, name))}  {name}\n")


# -----------------------------------------------------------------------------
# self-check


def replay_by_hand(cfg, init, t, docs=False):
    """Replays a trajectory file's steps with the gradient clip and AdamW
    written out per element; returns the final weights and the norms."""
    model = GPT(cfg, init, docs=docs)
    params = model.params()
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    b1, b2, eps, wd, clip = t["beta1"], t["beta2"], t["eps"], t["weight_decay"], t["grad_clip"]
    hp = HParams(lr=t["lr"], warmup=t["warmup"], final_frac=t["final_frac"])
    norms = []
    for step in range(t["K"]):
        model.zero_grad(set_to_none=True)
        G = int((t["y"][step] != -1).sum())
        for mb in range(t["A"]):
            logits = model(torch.from_numpy(t["x"][step, mb]).long())
            (model.loss_sum(logits, torch.from_numpy(t["y"][step, mb]).long()) / G).backward()
        norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
        norms.append(norm)
        scale = min(1.0, clip / (norm + 1e-6))
        lr = lr_at(hp, step, t["K"])
        with torch.no_grad():
            for i, p in enumerate(params):
                g = p.grad * scale
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                m_hat = m[i] / (1 - b1 ** (step + 1))
                v_hat = v[i] / (1 - b2 ** (step + 1))
                decay = wd if PARAM_NAMES[i] in DECAYED else 0.0
                p -= lr * (m_hat / (torch.sqrt(v_hat) + eps) + decay * p)
    return {k: getattr(model, k).detach() for k in PARAM_NAMES}, norms


MUON_VS_TORCH_BOUND = 3e-2  # torch.optim.Muon iterates in bf16: 1.1e-2 to 1.5e-2 from fp32 (measured)


def check_muon(out, expect):
    """The Muon trajectories (clip on some steps; the planted ones far enough from the right one for
    test_gpt2's fp32 bound, 1e-5, to tell them apart), Newton-Schulz's singular values, and this Muon
    against torch.optim.Muon where the installed torch has it."""
    t = read_train(os.path.join(out, "small_muon_train.bin"), SMALL)
    clipped = [bool(n > t["grad_clip"]) for n in t["norms"]]
    expect(t["muon"] == 1 and t["muon_lr"] > 0 and any(clipped) and not all(clipped),
           f"small_muon_train.bin: Muon lr {t['muon_lr']:g} wd {t['muon_weight_decay']:g}, clip active on steps "
           f"{[i for i, c in enumerate(clipped) if c]} only")
    for plant in PLANTS:
        q = read_train(os.path.join(out, f"small_muon_plant_{plant}_train.bin"), SMALL)
        gap = max(float(np.abs(q["params"][k] - t["params"][k]).max() / np.abs(t["params"][k]).max())
                  for k in gpt2_muon_blocks(SMALL))
        expect(gap > 1e-3, f"small_muon_plant_{plant}_train.bin: Muon's matrices {gap:.1e} from the right ones' "
                           "(> 1e-3, 100 x test_gpt2's fp32 bound)")
    g = torch.Generator().manual_seed(11)
    s = torch.linalg.svdvals(newton_schulz(torch.randn(96, 40, generator=g)))
    expect(0.6 <= float(s.min()) and float(s.max()) <= 1.25,
           f"Newton-Schulz: singular values of O in [{float(s.min()):.2f}, {float(s.max()):.2f}] (within [0.6, 1.25])")
    if not hasattr(torch.optim, "Muon"):
        print(f"SKIP torch.optim.Muon: not in torch {torch.__version__}")
        return
    lr, wd, mu = 0.02, 0.1, 0.95
    for R, C in ((96, 40), (40, 96), (64, 64)):
        w0 = 0.02 * torch.randn(R, C, generator=g)
        grads = [torch.randn(R, C, generator=g) for _ in range(3)]
        wt = w0.clone().requires_grad_(True)
        # torch.optim.Muon set to this Muon: lr, weight_decay (its default 0.1; --muon-wd's is 0),
        # momentum 0.95 with Nesterov, (a, b, c), 5 steps and eps as ours, adjust_lr_fn "original"
        # (Keller Jordan's sqrt(max(1, R/C)), also its default; "match_rms_adamw" would be
        # Moonshot's 0.2 sqrt(max(R, C))). What it does not let one set: its momentum is an average,
        # m' = mu m' + (1 - mu) g and u' = (1 - mu) g + mu m', i.e. (1 - mu) times ours, which the
        # normalisation removes (compared below, as m' = (1 - mu) m); its iteration always runs in bf16
        # (hence the bound); it divides by max(||u||, eps) instead of ||u|| + eps.
        opt = torch.optim.Muon([wt], lr=lr, weight_decay=wd, momentum=mu, nesterov=True,
                               ns_coefficients=NS_COEFFICIENTS, eps=NS_EPS, ns_steps=NS_STEPS,
                               adjust_lr_fn="original")
        ours = {}
        for plant in (None,) + PLANTS:
            w, m = w0.clone(), torch.zeros(R, C)
            for grad in grads:
                muon_step(w, grad, m, lr, wd, mu, plant=plant)
            ours[plant] = (w - w0, m)
        for grad in grads:
            wt.grad = grad.clone()
            opt.step()
        step = wt.detach() - w0
        rel = {plant: float((d - step).norm() / step.norm()) for plant, (d, _) in ours.items()}
        m_diff = float((opt.state[wt]["momentum_buffer"] - (1 - mu) * ours[None][1]).abs().max())
        expect(rel[None] <= MUON_VS_TORCH_BOUND and m_diff <= 1e-6,
               f"Muon {R} x {C}, 3 steps: the update is torch.optim.Muon's within {rel[None]:.1e} "
               f"(<= {MUON_VS_TORCH_BOUND:g}, its bf16 iteration), its momentum (1 - mu) times ours "
               f"(max diff {m_diff:.0e})")
        if R > C:
            expect(rel["side"] > MUON_VS_TORCH_BOUND,
                   f"Muon {R} x {C}: the planted 'side' mistake is told apart from torch.optim.Muon "
                   f"({rel['side']:.1e}); 'b' is not ({rel['b']:.1e}: bf16's own error)")


def check(out):
    ok = True

    def expect(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and bool(cond)

    # 1. every file parses, with exactly the size its header implies
    cfg, version, m32 = read_model(os.path.join(out, "small_model_fp32.bin"))
    expect(cfg == SMALL and version == MODEL_VERSION_FP32, "small_model_fp32.bin: header, size")
    init = init_params(SMALL, SMALL_SEED)
    expect(all(torch.equal(m32[k], init[k]) for k in PARAM_NAMES),
           "small_model_fp32.bin: equals the init")
    expect(bool((m32["wte"][SMALL.vocab_size:] == 0).all()), "small_model_fp32.bin: padded wte rows 0")
    cfg16, version, m16 = read_model(os.path.join(out, "small_model_bf16.bin"))
    expect(cfg16 == SMALL and version == MODEL_VERSION_BF16, "small_model_bf16.bin: header, size")
    # our bit rounding against torch's fp32 -> bf16 conversion (also nearest-even)
    expect(all(torch.equal(m16[k], init[k].to(torch.bfloat16).float()) for k in PARAM_NAMES),
           "small_model_bf16.bin: equals torch's bf16 rounding of the init")

    debugs = {}
    for name, c in (("small_debug.bin", SMALL), ("masked_debug.bin", SMALL), ("docs_debug.bin", SMALL),
                    ("vocab_debug.bin", VOCAB)):
        d = read_debug(os.path.join(out, name), c)
        debugs[name] = d
        count = int((d["y"] != -1).sum())
        expect(bool((d["grads"]["wte"][c.vocab_size:] == 0).all()) and np.isfinite(d["loss"]),
               f"{name}: B={d['B']} T={d['T']}, {count} targets, loss {d['loss']:.6f}, "
               f"padded wte grads 0")
    trains = {}
    for name in ("small_train.bin", "masked_train.bin", "docs_train.bin"):
        d = read_train(os.path.join(out, name), SMALL)
        trains[name] = d
        clipped = [bool(n > d["grad_clip"]) for n in d["norms"]]
        expect(any(clipped) and not all(clipped),
               f"{name}: K={d['K']} A={d['A']} B={d['B']} T={d['T']} lr={d['lr']:g} "
               f"clip={d['grad_clip']:g}; clip active on steps "
               f"{[i for i, c in enumerate(clipped) if c]} only")
        expect(bool((d["params"]["wte"][SMALL.vocab_size:] == 0).all()),
               f"{name}: padded wte rows still 0 after training")

    # 2. independent cross-checks of the model and of the accumulation
    model = GPT(SMALL, init)
    d = debugs["small_debug.bin"]
    xt = torch.from_numpy(d["x"]).long()
    with torch.no_grad():
        # the explicit attention against torch's fused one, same weights
        V = SMALL.vocab_size
        fused = model(xt, sdpa=True)[..., :V]
        ref = F.cross_entropy(fused.reshape(-1, V), torch.from_numpy(d["y"]).long().reshape(-1))
    diff = float((fused - torch.from_numpy(d["logits"])).abs().max())
    expect(diff < 1e-5 and abs(float(ref) - d["loss"]) < 1e-5,
           f"small_debug: logits, loss match fused attention + F.cross_entropy (max diff {diff:.1e})")
    # documents: the explicit mask against SDPA's with the same boolean mask, and
    # against each document run alone (a sequence of its own, positions from 0)
    d = debugs["docs_debug.bin"]
    docs_model = GPT(SMALL, init, docs=True)
    xt = torch.from_numpy(d["x"]).long()
    with torch.no_grad():
        fused = docs_model(xt, sdpa=True)[..., :SMALL.vocab_size]
        alone = torch.zeros_like(fused)
        for b in range(xt.shape[0]):
            starts = [t for t in range(xt.shape[1]) if t == 0 or int(xt[b, t]) == SMALL.vocab_size - 1]
            for s0, s1 in zip(starts, starts[1:] + [xt.shape[1]]):
                alone[b, s0:s1] = GPT(SMALL, init)(xt[b:b + 1, s0:s1])[0, :, :SMALL.vocab_size]
    diff = float((fused - torch.from_numpy(d["logits"])).abs().max())
    diff_alone = float((alone - torch.from_numpy(d["logits"])).abs().max())
    expect(diff < 1e-5 and diff_alone < 1e-5,
           f"docs_debug: logits match SDPA with the document mask (max diff {diff:.1e}) and each document "
           f"run alone (max diff {diff_alone:.1e})")
    # accumulated masked step 0 == one big batch of A*B rows with the mean loss
    t = trains["masked_train.bin"]
    model = GPT(SMALL, init)
    xs = torch.from_numpy(t["x"][0].reshape(-1, t["T"])).long()
    ys = torch.from_numpy(t["y"][0].reshape(-1, t["T"])).long()
    big = F.cross_entropy(model(xs)[..., :SMALL.vocab_size].reshape(-1, SMALL.vocab_size),
                          ys.reshape(-1), ignore_index=-1)
    big.backward()
    norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.params()))
    expect(abs(big.item() - t["losses"][0]) < 1e-5 and abs(norm - t["norms"][0]) < 1e-4 * norm,
           f"masked_train step 0: accumulated loss/norm = one big batch's "
           f"({big.item():.6f}/{norm:.6f})")
    # the whole trajectory again, with the clip and the AdamW update written out
    # by hand (the form a C++ kernel takes) instead of torch.optim
    # The key biases (qkvb columns C..2C) have a zero gradient in exact
    # arithmetic (softmax ignores a constant added to a row of scores); what
    # they get is rounding noise, which Adam's normalization turns into steps,
    # so they are compared apart, against a bound on their size.
    C = SMALL.channels
    for name, t in trains.items():
        final, norms = replay_by_hand(SMALL, init, t, docs=name.startswith("docs"))
        diffs = {k: (final[k] - torch.from_numpy(t["params"][k])).abs() for k in PARAM_NAMES}
        kbias = float(diffs["qkvb"][:, C:2 * C].max())
        diffs["qkvb"][:, C:2 * C] = 0
        diff = max(float(d.max()) for d in diffs.values())
        ndiff = max(abs(a - b) for a, b in zip(norms, t["norms"]))
        expect(diff < 1e-6 and kbias < 1e-5 and ndiff < 1e-5,
               f"{name}: hand-written clip + AdamW replay matches (max param diff {diff:.1e}, "
               f"key biases {kbias:.1e}, norm diff {ndiff:.1e})")
    # lrs follow the schedule
    hp = HParams(lr=t["lr"], warmup=t["warmup"], final_frac=t["final_frac"])
    expect(all(abs(lr_at(hp, s, t["K"]) - t["lrs"][s]) < 1e-9 for s in range(t["K"])),
           "masked_train: lrs follow warmup + cosine")

    check_muon(out, expect)

    # 3. regenerating gives the same bytes, and SHA256SUMS matches
    with open(os.path.join(out, "SHA256SUMS")) as f:
        sums = dict(reversed(line.split()) for line in f if line.strip())
    expect(all(sha256(os.path.join(out, n)) == h for n, h in sums.items()),
           f"SHA256SUMS matches the {len(sums)} files")
    tmp = tempfile.mkdtemp(prefix="ref_check_")
    try:
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            names = generate(tmp)
        for name in sorted(names) + ["SHA256SUMS"]:
            with open(os.path.join(out, name), "rb") as a, open(os.path.join(tmp, name), "rb") as b:
                expect(a.read() == b.read(), f"{name}: regenerated byte-identical")
    finally:
        shutil.rmtree(tmp)
    print("check: " + ("all ok" if ok else "FAILED"))
    return ok


def main():
    reference_mode.pin_torch(torch)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    default_out = os.path.join(repo, "test", "ref")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=default_out, help="output directory (default test/ref)")
    ap.add_argument("--check", nargs="?", const=default_out, metavar="DIR",
                    help="re-read DIR, cross-check, regenerate and compare bytes")
    ap.add_argument("--init-preview", action="store_true",
                    help="print the first values of every init tensor (small and vocab)")
    args = ap.parse_args()
    if args.init_preview:
        init_preview(SMALL, SMALL_SEED)
        init_preview(VOCAB, VOCAB_SEED)
        return
    if args.check:
        sys.exit(0 if check(args.check) else 1)
    for name in generate(args.out):
        p = os.path.join(args.out, name)
        print(f"wrote {p} ({os.path.getsize(p)} bytes)")


if __name__ == "__main__":
    main()
