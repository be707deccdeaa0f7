#!/usr/bin/env python3
"""Exports a model file (version 3 fp32 or 5 bf16) as a transformers GPT-2 folder:
config.json, generation_config.json, model.safetensors (fp32 or bf16; the padded vocabulary
rows dropped, Conv1D matrices transposed) and, for GPT-2's vocabulary (V = 50257), the
tokenizer files from the local encoder.json / vocab.bpe (vocab.json, merges.txt,
tokenizer_config.json, special_tokens_map.json). Needs numpy only.

    python3 dev/export_hf.py MODEL.bin OUT_DIR [--dtype fp32|bf16] [--gpt2-dir DIR]

--dtype defaults to the file's own (3 -> fp32, 5 -> bf16); fp32 -> bf16 rounds to nearest
even. Then, e.g.: transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR).

OUT_DIR is made, or an existing folder (not a symlink to one) is written into; each file is
written whole (a temporary renamed over it) and may replace a regular file of that name,
never anything else (a symlink, device, FIFO or folder there is an error).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2 as hf  # noqa: E402


def tokenizer_files(gpt2_dir, maxT):
    """{file name: bytes} of the tokenizer files, from gpt2_dir's encoder.json and vocab.bpe."""
    files = {}
    for src, dst in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
        path = os.path.join(gpt2_dir, src)
        if not os.path.lexists(path):
            raise hf.Error(f"{path}: not found (the GPT-2 tokenizer files; set --gpt2-dir)")
        files[dst] = hf.read_regular(path, "a GPT-2 tokenizer file")
    eot = "<|endoftext|>"
    files["tokenizer_config.json"] = as_json({"tokenizer_class": "GPT2Tokenizer", "model_max_length": maxT,
                                              "add_prefix_space": False, "bos_token": eot, "eos_token": eot,
                                              "unk_token": eot})
    files["special_tokens_map.json"] = as_json({"bos_token": eot, "eos_token": eot, "unk_token": eot})
    return files


def as_json(value):
    return json.dumps(value, indent=2).encode()


def main():
    ap = hf.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["fp32", "bf16"])
    ap.add_argument("--gpt2-dir", default=os.path.join(os.environ.get("SHARED_DATA", "../shared/data"), "gpt2"))
    args = ap.parse_args()
    cfg, tensors, version = hf.read_model_file(args.model)
    bf16 = args.dtype == "bf16" if args.dtype else version == hf.VERSION_BF16
    padded = tensors["wte"][cfg["V"]:]
    if np.any(padded != 0):  # only the trainer's zero rows can be dropped without a trace
        raise hf.Error(f"{args.model}: padded vocabulary rows {cfg['V']}..{cfg['Vp'] - 1} of wte are not zero")
    conf = hf.config_to_hf(cfg, bf16)
    files = {"config.json": as_json(conf),
             "generation_config.json": as_json({"bos_token_id": conf["bos_token_id"],
                                                "eos_token_id": conf["eos_token_id"]})}
    if cfg["V"] == hf.GPT2_EOT + 1:
        files.update(tokenizer_files(args.gpt2_dir, cfg["maxT"]))
        note = ", GPT-2 tokenizer files"
    else:
        note = f" (vocabulary {cfg['V']} is not GPT-2's 50257: no tokenizer files)"
    # every output path checked before the first is written, so a refusal leaves the folder as it was
    hf.make_output_folder(args.out, "the output folder")
    for name in ["model.safetensors", *files]:
        hf.check_output(os.path.join(args.out, name), name)
    hf.write_safetensors(os.path.join(args.out, "model.safetensors"), hf.to_hf(cfg, tensors), bf16)
    for name, data in files.items():
        hf.write_regular(os.path.join(args.out, name), [data], name)
    n = sum(a.size for a in hf.to_hf(cfg, tensors).values())
    print(f"{args.out}: GPT-2 L={cfg['L']} C={cfg['C']} NH={cfg['NH']} V={cfg['V']} maxT={cfg['maxT']}, "
          f"{n:,} parameters, {'bf16' if bf16 else 'fp32'}{note}")


if __name__ == "__main__":
    hf.run_cli(main)
