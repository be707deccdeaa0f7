#!/usr/bin/env python3
"""Checks that a Llama 3 folder written by llmc (llmc/formats/llama3_config.h, llmc/formats/safetensors.h) is
what transformers reads with no converter: BIN (build/host/write_llama3_random) writes random
bf16 models, one untied with GQA and Llama 3.1 RoPE scaling in one file, one tied in shards, and
LlamaForCausalLM.from_pretrained must load each with no missing or unexpected tensor, every
tensor's sum equal to the writer's, the config as described, and a forward pass finite. Then
TRAINER (build/cpu/train_llama3) trains its built-in model 2 steps with -o, and the checkpoint's
model folder model_00000002 must load the same way, every tensor bitwise the file's bf16
values. Prints PASS/FAIL lines and a tally; exit 1 on a failure. Without torch or transformers
it prints a SKIP line saying so and exits 0.

usage: python3 dev/check_llama3_written.py build/host/write_llama3_random build/cpu/train_llama3
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
except ImportError as e:
    print(f"SKIP check_llama3_written: torch or transformers is not installed ({e})")
    sys.exit(0)

CASES = [  # descriptor, max shard bytes, what transformers' config must say
    ("llama3:L=2,C=32,H=4,KV=2,F=64,V=96,T=64,factor=8,orig=16", 1 << 30,
     dict(num_key_value_heads=2, tie_word_embeddings=False, rope_type="llama3", factor=8.0, shards=0)),
    ("llama3:L=1,C=32,H=4,KV=4,F=64,V=96,T=64,tied=1", 5000,
     dict(num_key_value_heads=4, tie_word_embeddings=True, rope_type="default", factor=None, shards=6)),
]
passed = failed = 0


def check(ok, what):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + what)
    passed, failed = passed + bool(ok), failed + (not ok)


def rope(config):
    r = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return r.get("rope_type", "default"), r.get("factor")


def safetensors_bf16(path):
    """name -> tensor of a bf16 safetensors file, read as it is on disk (no library's reader)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = bytearray(data[8 + n + a:8 + n + b])
        out[name] = (t["dtype"], torch.frombuffer(raw, dtype=torch.bfloat16).reshape(t["shape"]))
    return out


def check_checkpoint(trainer):
    """train_llama3's checkpoint model folder under -o, loaded by from_pretrained."""
    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "run")
        r = subprocess.run([trainer, "-x", "2", "-n", "2", "-v", "0", "-s", "0", "-o", run],
                           capture_output=True, text=True)
        folder = os.path.join(run, "model_00000002")
        if r.returncode != 0 or not os.path.isdir(folder):
            check(False, f"{trainer}: a checkpoint written under -o ({r.stderr.strip()[-300:]})")
            return
        model, info = transformers.LlamaForCausalLM.from_pretrained(folder, output_loading_info=True)
        check(sorted(os.listdir(folder)) == ["config.json", "model.safetensors"] and not info["missing_keys"] and
              not info["unexpected_keys"],
              f"train_llama3's checkpoint model_00000002 (config.json, model.safetensors) loaded, nothing missing or "
              f"unexpected ({info['missing_keys']}, {info['unexpected_keys']})")
        state = model.state_dict()
        written = safetensors_bf16(os.path.join(folder, "model.safetensors"))
        bad = [n for n, (dtype, t) in written.items() if dtype != "BF16" or not torch.equal(state[n], t)]
        check(not bad and len(written) == len(state) - model.config.tie_word_embeddings and model.dtype == torch.bfloat16,
              f"train_llama3's checkpoint: all {len(written)} tensors bitwise the file's bf16 values ({bad})")
        c = model.config
        shape = (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                 c.intermediate_size, c.vocab_size, c.max_position_embeddings)
        with torch.no_grad():
            logits = model(torch.tensor([[1, 2, 3, 4]])).logits
        check(shape == (2, 64, 4, 2, 192, 256, 64) and bool(torch.isfinite(logits).all()),
              f"train_llama3's checkpoint: the built-in model's shape L,C,H,KV,F,V,T = {shape}, a forward pass finite")


def main():
    if len(sys.argv) != 3:
        print("error: usage: check_llama3_written.py WRITE_LLAMA3_RANDOM TRAIN_LLAMA3", file=sys.stderr)
        sys.exit(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    check_checkpoint(sys.argv[2])
    for desc, shard, want in CASES:
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.argv[1], d, desc, str(shard)], capture_output=True, text=True)
            if r.returncode != 0:
                check(False, f"{desc}: written ({r.stderr.strip()})")
                continue
            sums = dict((n, float(s)) for n, s in (line.split() for line in r.stdout.splitlines()))
            shards = sum(f.startswith("model-") for f in os.listdir(d))
            model, info = transformers.LlamaForCausalLM.from_pretrained(d, output_loading_info=True)
            check(not info["missing_keys"] and not info["unexpected_keys"] and shards == want["shards"],
                  f"{desc}: loaded from {shards or 'one'} file(s), nothing missing or unexpected ({info['missing_keys']}, {info['unexpected_keys']})")
            state = model.state_dict()
            bad = [n for n, s in sums.items() if abs(float(state[n].double().sum()) - s) > 1e-9 * max(1.0, abs(s))]
            check(not bad and model.dtype == torch.bfloat16, f"{desc}: every tensor's sum is the writer's, bf16 ({bad})")
            c = model.config
            got = dict(num_key_value_heads=c.num_key_value_heads, tie_word_embeddings=c.tie_word_embeddings)
            rt, factor = rope(c)
            tied_ok = (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) == want["tie_word_embeddings"]
            check(all(got[k] == want[k] for k in got) and rt == want["rope_type"] and factor == want["factor"] and tied_ok,
                  f"{desc}: config as described ({got}, rope {rt} {factor})")
            with torch.no_grad():
                logits = model(torch.tensor([[1, 2, 3, 4]])).logits
            check(bool(torch.isfinite(logits).all()), f"{desc}: a forward pass is finite")
    print(f"check_llama3_written: {passed} passed, {failed} failed")
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
