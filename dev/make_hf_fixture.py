#!/usr/bin/env python3
"""Writes test/ref/hf_tiny/: a tiny GPT-2 made by transformers with every tensor random
(layernorm gains and biases included), saved with save_pretrained (config.json,
generation_config.json, model.safetensors), and debug.bin: one batch's logits, mean loss and
gradients computed by transformers (llm.c's debug-state format, docs/formats.md;
gradients in llm.c's order and layout, wte's padded rows 0); SHA256SUMS of the files.
test/trainer/test_hf.py checks the import, the trainer's forward and the export against them.

Before writing, dev/import_hf.py's conversion is checked against dev/train_gpt2.py, the
independent PyTorch model: the imported tensors in it give transformers' logits and
gradients. Needs torch, transformers (and numpy); CI needs only the committed files.

--bf16-sweep BIN measures the bf16 build's errors on models other than the tests' (the
bounds of test_gpt2.cu and docs/tests.md): 48 random GPT-2s from transformers (16 seeds of
three shapes: the fixture's; V=50257 with GPT-2's init; V=50257, L=4, C=128, all random),
each imported and run through BIN --debug-case (e.g. build/cpu/test_gpt2); prints each
model's errors and the worst.

usage: python3 dev/make_hf_fixture.py [--out test/ref/hf_tiny] [--bf16-sweep BIN]
"""
import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_mode  # noqa: E402

reference_mode.pin_env()  # before torch is imported: the fixture is a reference file

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import hf_gpt2 as hf  # noqa: E402
import train_gpt2 as ref  # noqa: E402

reference_mode.pin_torch(torch)

# V not a multiple of 128, so the import pads (1000 -> 1024); maxT = T of the batch
V, MAXT, L, NH, C = 1000, 32, 2, 4, 64
B, T, SEED = 2, 32, 15


def make_model(V, maxT, L, NH, C, seed, style="random"):
    """style "random": every tensor random (gains 1 + 0.2 N, the rest 0.1 N); "gpt2":
    GPT-2's init (N(0, 0.02) matrices, gains 1, biases 0)."""
    conf = transformers.GPT2Config(vocab_size=V, n_positions=maxT, n_embd=C, n_layer=L, n_head=NH,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   bos_token_id=V - 1, eos_token_id=V - 1, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(conf).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            gain = name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
            if style == "random":
                p.copy_(1.0 + 0.2 * noise if gain else 0.1 * noise)
            else:
                p.copy_(torch.ones_like(p) if gain else torch.zeros_like(p) if name.endswith("bias") else 0.02 * noise)
    return model


def batch(model, B, T, seed):
    """Random tokens and targets -> x, y, logits (B, T, V), mean loss, gradients (llm.c's)."""
    c = model.config
    V = c.vocab_size
    rng = np.random.RandomState(seed)
    x = rng.randint(0, V, size=(B, T)).astype(np.int32)
    y = rng.randint(0, V, size=(B, T)).astype(np.int32)
    model.zero_grad()
    logits = model(torch.from_numpy(x).long()).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.from_numpy(y).long().reshape(-1))
    loss.backward()
    cfg = {"maxT": c.n_positions, "V": V, "Vp": hf.padded_vocab(V), "L": c.n_layer, "NH": c.n_head, "C": c.n_embd}
    grads = hf.from_hf(cfg, {n: p.grad.numpy() for n, p in model.named_parameters()}, "gradients")
    return x, y, logits.detach(), loss.item(), cfg, grads


def write_debug(path, x, y, logits, loss, grads):
    ref.write_debug(path, x, y, logits, loss, [torch.from_numpy(np.ascontiguousarray(grads[n])) for n in ref.PARAM_NAMES])


def write_fixture(out):
    model = make_model(V, MAXT, L, NH, C, SEED)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    x, y, logits, loss, cfg, grads = batch(model, B, T, SEED)

    # the conversion against the independent reference model
    weights = hf.from_hf(cfg, hf.read_safetensors(os.path.join(out, "model.safetensors")), "fixture")
    rcfg = ref.GPTConfig(MAXT, V, cfg["Vp"], L, NH, C)
    rmodel = ref.GPT(rcfg, {k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
    rlogits, rloss, rgrads = ref.debug_state(rmodel, x, y)
    err = (rlogits - logits).abs().max().item() / logits.abs().max().item()
    assert err < 1e-5, f"train_gpt2.py's logits differ from transformers' by {err:.2e}"
    assert abs(rloss - loss) < 1e-5 * loss, (rloss, loss)
    worst = 0.0
    for name, rg in zip(ref.PARAM_NAMES, rgrads):
        g = grads[name]
        worst = max(worst, float(np.abs(rg.numpy() - g).max() / max(np.abs(g).max(), 1e-30)))
    assert worst < 1e-5, f"gradients differ by {worst:.2e}"
    print(f"train_gpt2.py with the imported weights: logits {err:.1e}, gradients {worst:.1e} (scaled max error)")

    write_debug(os.path.join(out, "debug.bin"), x, y, logits, loss, grads)
    names = sorted(n for n in os.listdir(out) if n != "SHA256SUMS")
    with open(os.path.join(out, "SHA256SUMS"), "w") as f:
        for n in names:
            f.write(f"{hashlib.sha256(open(os.path.join(out, n), 'rb').read()).hexdigest()}  {n}\n")
    total = sum(os.path.getsize(os.path.join(out, n)) for n in names)
    print(f"{out}: {', '.join(names)} ({total:,} bytes; transformers {transformers.__version__}, "
          f"torch {torch.__version__}), loss {loss:.6f}")


def bf16_sweep(binary):
    shapes = [("fixture shape, random", (1000, 32, 2, 4, 64), 2, 32, "random"),
              ("V=50257, GPT-2 init", (50257, 64, 2, 4, 64), 4, 64, "gpt2"),
              ("V=50257 L=4 C=128, random", (50257, 64, 4, 4, 128), 4, 64, "random")]
    worst = {"logits": 0.0, "loss": 0.0, "gradient": 0.0, "key bias": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, 17):
            for label, shape, Bs, Ts, style in shapes:
                model = make_model(*shape, seed, style)
                x, y, logits, loss, cfg, grads = batch(model, Bs, Ts, seed)
                model_bin, debug = os.path.join(tmp, "m.bin"), os.path.join(tmp, "debug.bin")
                hf.write_model_file(model_bin, cfg, hf.from_hf(cfg, {n: p.detach().numpy() for n, p in
                                                                     model.named_parameters()}, "model"), 3)
                write_debug(debug, x, y, logits, loss, grads)
                out = subprocess.run([binary, "--debug-case", model_bin, debug, "m"], capture_output=True, text=True).stdout
                got = {"logits": float(re.search(r"m logits .*err (\S+)", out).group(1)),
                       "loss": float(re.search(r"m loss .* rel err (\S+)", out).group(1)),
                       "gradient": max(float(v) for v in re.findall(r"gradient \w+: err (\S+)", out)),
                       "key bias": float(re.search(r"key bias .*abs err (\S+)", out).group(1))}
                for k in worst:
                    worst[k] = max(worst[k], got[k])
                print(f"seed {seed:2d} {label}: " + ", ".join(f"{k} {v:.2e}" for k, v in got.items()), flush=True)
    print("worst over 48 models: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="test/ref/hf_tiny")
    ap.add_argument("--bf16-sweep", metavar="BIN")
    args = ap.parse_args()
    if args.bf16_sweep:
        bf16_sweep(args.bf16_sweep)
    else:
        write_fixture(args.out)


if __name__ == "__main__":
    main()
