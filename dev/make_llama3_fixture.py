#!/usr/bin/env python3
"""Writes test/ref/llama3_hf_tiny/: tiny Llama 3 models made and saved by transformers
(save_pretrained), which test/host/test_safetensors.cpp reads with llmc/formats/safetensors.h and
llmc/formats/llama3_config.h:
  untied/   bf16, grouped-query attention (H=4, KV=2), Llama 3.1 RoPE scaling, separate lm_head
  tied/     fp32, lm_head tied to the embedding, plain RoPE, one layer
  sharded/  the untied model again, in shards of at most 20 KB with model.safetensors.index.json
  (with --finetune DIR instead: only DIR, the fine-tuning test's model: fp32, tied, V = 2512,
  the ids of test/data/tiktoken_test.ranks and Llama 3's 256 special tokens after them;
  test/trainer/test_finetune.sh trains it on text tokenized with those ranks)
and expected.json: for every tensor of each, its dtype, shape, the fp64 sum of its fp32 values
and its first four values (computed by torch from the saved model, loaded back); logits.json:
for each folder, the fp32 logits LlamaForCausalLM (eager attention) computes from it for a fixed
sequence of LOGITS_T tokens (test/model/test_llama3.cu runs the same tokens through train_llama3.cu).
Every tensor is random (norm gains 1 + 0.2 N too), so a tensor read from the wrong place shows.
Needs torch and transformers; the tests need only the committed files.

usage: python3 dev/make_llama3_fixture.py [--out test/ref/llama3_hf_tiny] [--logits-only]
       python3 dev/make_llama3_fixture.py --finetune test/ref/llama3_hf_ft
(--logits-only: writes logits.json for the folders already there, leaving them as they are)
"""
import argparse
import json
import os
import shutil
import sys

try:
    import torch
    import transformers
    from safetensors import safe_open
except ImportError as e:
    print(f"error: dev/make_llama3_fixture.py needs torch and transformers ({e})", file=sys.stderr)
    sys.exit(1)

SHAPE = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=96, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0)
SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=16)


# the fine-tuning fixture: the vocabulary of the test ranks (2256) and Llama 3's specials (256);
# C = 16 keeps its fp32 embedding at 160 KB
FT_SHAPE = dict(hidden_size=16, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                vocab_size=2256 + 256, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0)


def make_model(layers, tied, scaling, seed, shape=SHAPE):
    conf = transformers.LlamaConfig(num_hidden_layers=layers, tie_word_embeddings=tied,
                                    rope_scaling=scaling, **shape)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(conf).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else 0.1 * noise)
    return model


LOGITS_T = 16


def folder_logits(folder):
    """tokens (7t + 3) mod V, t < LOGITS_T, and the (LOGITS_T, V) fp32 logits of the folder's model."""
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    V = model.config.vocab_size
    tokens = [(7 * t + 3) % V for t in range(LOGITS_T)]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0]
    return dict(tokens=tokens, logits=[float(x) for x in logits.flatten()])


def write_logits(out):
    logits = {sub: folder_logits(os.path.join(out, sub)) for sub in ("untied", "tied", "sharded")}
    with open(os.path.join(out, "logits.json"), "w") as f:
        json.dump(logits, f, sort_keys=True)
        f.write("\n")


def describe(folder):
    """name -> dtype, shape, sum, first values of every tensor in the folder's safetensors files."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(folder, f), framework="pt") as st:
            for name in st.keys():
                t = st.get_tensor(name)
                v = t.float().flatten()
                out[name] = dict(file=f, dtype=str(t.dtype).replace("torch.", ""), shape=list(t.shape),
                                 sum=float(v.double().sum()), first=[float(x) for x in v[:4]])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="test/ref/llama3_hf_tiny")
    ap.add_argument("--logits-only", action="store_true")
    ap.add_argument("--finetune", metavar="DIR")
    args = ap.parse_args()
    if args.finetune:
        if os.path.exists(args.finetune):
            shutil.rmtree(args.finetune)
        make_model(2, True, None, 28, FT_SHAPE).save_pretrained(args.finetune)
        gen = os.path.join(args.finetune, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
        print(f"wrote {args.finetune} (transformers {transformers.__version__}, torch {torch.__version__})")
        return
    if args.logits_only:
        write_logits(args.out)
        print(f"wrote {args.out}/logits.json (transformers {transformers.__version__}, torch {torch.__version__})")
        return
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    untied = make_model(2, False, SCALING, 26).to(torch.bfloat16)
    untied.save_pretrained(os.path.join(args.out, "untied"))
    untied.save_pretrained(os.path.join(args.out, "sharded"), max_shard_size="20KB")
    tied = make_model(1, True, None, 27)
    tied.save_pretrained(os.path.join(args.out, "tied"))
    expected = {}
    for sub in ("untied", "tied", "sharded"):
        folder = os.path.join(args.out, sub)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(folder, extra)):
                os.remove(os.path.join(folder, extra))
        loaded = transformers.LlamaForCausalLM.from_pretrained(folder)  # what the tests read, loaded back
        assert loaded.config.num_key_value_heads == 2
        expected[sub] = describe(folder)
    if not os.path.exists(os.path.join(args.out, "sharded", "model.safetensors.index.json")):
        print("error: save_pretrained wrote no shards", file=sys.stderr)
        sys.exit(1)
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    write_logits(args.out)
    print(f"wrote {args.out} (transformers {transformers.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
