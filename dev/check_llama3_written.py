#!/usr/bin/env python3
"""Checks that a Llama 3 folder written by llmc (llmc/llama3_config.h, llmc/safetensors.h) is
what transformers reads with no converter: BIN (build/host/write_llama3_random) writes random
bf16 models, one untied with GQA and Llama 3.1 RoPE scaling in one file, one tied in shards, and
LlamaForCausalLM.from_pretrained must load each with no missing or unexpected tensor, every
tensor's sum equal to the writer's, the config as described, and a forward pass finite.
Prints PASS/FAIL lines and a tally; exit 1 on a failure. Needs torch and transformers.

usage: python3 dev/check_llama3_written.py build/host/write_llama3_random
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
except ImportError as e:
    print(f"error: dev/check_llama3_written.py needs torch and transformers ({e})", file=sys.stderr)
    sys.exit(1)

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


def main():
    if len(sys.argv) != 2:
        print("error: usage: check_llama3_written.py BIN", file=sys.stderr)
        sys.exit(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
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
