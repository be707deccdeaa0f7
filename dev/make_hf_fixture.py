#!/usr/bin/env python3
"""Writes test/ref/hf_tiny/: a tiny GPT-2 made by transformers with every tensor random
(layernorm gains and biases included), saved with save_pretrained (config.json,
generation_config.json, model.safetensors), and debug.bin: one batch's logits, mean loss and
gradients computed by transformers (llm.c's debug-state format, README "File formats";
gradients in llm.c's order and layout, wte's padded rows 0); SHA256SUMS of the files.
test/test_hf.py checks the import, the trainer's forward and the export against them.

Before writing, dev/import_hf.py's conversion is checked against dev/train_gpt2.py, the
independent PyTorch model: the imported tensors in it give transformers' logits and
gradients. Needs torch, transformers (and numpy); CI needs only the committed files.

usage: python3 dev/make_hf_fixture.py [--out test/ref/hf_tiny]
"""
import argparse
import hashlib
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2 as hf  # noqa: E402
import train_gpt2 as ref  # noqa: E402  (sets torch to one deterministic thread)

# V not a multiple of 128, so the import pads (1000 -> 1024); maxT = T of the batch
V, MAXT, L, NH, C = 1000, 32, 2, 4, 64
B, T, SEED = 2, 32, 15


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.1 * noise)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="test/ref/hf_tiny")
    args = ap.parse_args()
    conf = transformers.GPT2Config(vocab_size=V, n_positions=MAXT, n_embd=C, n_layer=L, n_head=NH,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   bos_token_id=V - 1, eos_token_id=V - 1, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(conf).eval()
    randomize(model, SEED)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)

    rng = np.random.RandomState(SEED)
    x = rng.randint(0, V, size=(B, T)).astype(np.int32)
    y = rng.randint(0, V, size=(B, T)).astype(np.int32)
    xt, yt = torch.from_numpy(x).long(), torch.from_numpy(y).long()
    model.zero_grad()
    logits = model(xt).logits  # (B, T, V)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), yt.reshape(-1))
    loss.backward()
    cfg = {"maxT": MAXT, "V": V, "Vp": hf.padded_vocab(V), "L": L, "NH": NH, "C": C}
    grads = hf.from_hf(cfg, {n: p.grad.numpy() for n, p in model.named_parameters()}, "gradients")

    # the conversion against the independent reference model
    weights = hf.from_hf(cfg, hf.read_safetensors(os.path.join(args.out, "model.safetensors")), "fixture")
    rcfg = ref.GPTConfig(MAXT, V, cfg["Vp"], L, NH, C)
    rmodel = ref.GPT(rcfg, {k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
    rlogits, rloss, rgrads = ref.debug_state(rmodel, x, y)
    err = (rlogits - logits.detach()).abs().max().item() / logits.detach().abs().max().item()
    assert err < 1e-5, f"train_gpt2.py's logits differ from transformers' by {err:.2e}"
    assert abs(rloss - loss.item()) < 1e-5 * loss.item(), (rloss, loss.item())
    worst = 0.0
    for name, rg in zip(ref.PARAM_NAMES, rgrads):
        g = grads[name]
        worst = max(worst, float(np.abs(rg.numpy() - g).max() / max(np.abs(g).max(), 1e-30)))
    assert worst < 1e-5, f"gradients differ by {worst:.2e}"
    print(f"train_gpt2.py with the imported weights: logits {err:.1e}, gradients {worst:.1e} (scaled max error)")

    ref.write_debug(os.path.join(args.out, "debug.bin"), x, y, logits.detach(), loss.item(),
                    [torch.from_numpy(np.ascontiguousarray(grads[n])) for n in ref.PARAM_NAMES])
    names = sorted(n for n in os.listdir(args.out) if n != "SHA256SUMS")
    with open(os.path.join(args.out, "SHA256SUMS"), "w") as f:
        for n in names:
            f.write(f"{hashlib.sha256(open(os.path.join(args.out, n), 'rb').read()).hexdigest()}  {n}\n")
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in names)
    print(f"{args.out}: {', '.join(names)} ({total:,} bytes; transformers {transformers.__version__}, "
          f"torch {torch.__version__}), loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
