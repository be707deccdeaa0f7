#!/usr/bin/env python3
"""Compares the logits train_llama3.cu's model computes from a Hugging Face Llama folder
(LOGITS_TOOL: build/cpu-fp32/llama3_logits) with those of transformers' LlamaForCausalLM
loaded from the same folder by from_pretrained (fp32, eager attention), for one sequence of
tokens. Prints the max absolute difference and the scaled error max|a - b| / max|b| and one
PASS or FAIL line against the bound; exit 1 on FAIL.

Bound 1e-5 (scaled): both sides compute in fp32 and differ only in summation order and in
RoPE's angles (rope.cuh rounds double angles once, transformers computes them in fp32), about
p x 6e-8 at position p; test_llama3's transformers fixtures measure 3.4e-7 and use the same
1e-5. A model trained a few steps moves its logits by orders of magnitude more, so a folder
whose weights are not the trainer's fails (test_finetune.sh checks that too, with --hf FOLDER:
transformers on another folder).

Without torch or transformers: a SKIP line saying so, exit 0.

usage: python3 dev/compare_llama3_logits.py LOGITS_TOOL FOLDER [--hf OTHER] TOKEN...
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
except ImportError as e:
    print(f"SKIP compare_llama3_logits: torch or transformers is not installed ({e})")
    sys.exit(0)

BOUND = 1e-5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tool")
    ap.add_argument("folder")
    ap.add_argument("--hf", help="the folder transformers loads (default: FOLDER)")
    ap.add_argument("tokens", nargs="+", type=int)
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        r = subprocess.run([args.tool, args.folder, out] + [str(t) for t in args.tokens], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL {args.tool} {args.folder}: {r.stderr.strip()[-300:]}")
            sys.exit(1)
        with open(out, "rb") as f:
            ours = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
    hf_folder = args.hf or args.folder
    model = transformers.LlamaForCausalLM.from_pretrained(hf_folder, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = model(torch.tensor([args.tokens])).logits[0].flatten()
    T, V = len(args.tokens), model.config.vocab_size
    if ours.numel() != theirs.numel():
        print(f"FAIL {args.folder}: {ours.numel()} logits from {args.tool}, transformers {T} x {V}")
        sys.exit(1)
    diff = (ours - theirs).abs().max().item()
    scaled = diff / theirs.abs().max().item()
    ok = scaled <= BOUND
    print(f"{'PASS' if ok else 'FAIL'} logits ({T} x {V}) of {args.tool} on {args.folder} vs LlamaForCausalLM on "
          f"{hf_folder}: max abs diff {diff:.3g}, scaled {scaled:.3g} (bound {BOUND:g})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
