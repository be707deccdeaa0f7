#!/usr/bin/env python3
"""Imports a transformers GPT-2 (a local folder with config.json and model.safetensors, or,
online with huggingface_hub installed, a hub name such as gpt2 or openai-community/gpt2-xl)
as a model file, version 3 (fp32) or 5 (bf16), that the trainer loads with -e:

    python3 dev/import_hf.py gpt2 gpt2_124M.bin [--version 3|5]
    ./train_gpt -e gpt2_124M.bin -i "data/tinyshakespeare/*train*.bin" ...   # fine-tunes GPT-2

wte is padded with zero rows to a multiple of 128 (50257 -> 50304, as llm.c); the Conv1D
matrices are transposed to llm.c's (out, in). Version 5 rounds fp32 to bf16 (nearest even).
Needs numpy only (and huggingface_hub for a hub name).

The output is written whole (a temporary in its folder, renamed over it): it may replace a
regular file, never anything else (a symlink, device, FIFO or folder there is an error).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2 as hf  # noqa: E402


def resolve(source):
    if os.path.isdir(source):
        return source
    if os.path.exists(source):
        raise hf.Error(f"{source}: not a folder (a transformers GPT-2 folder or a hub name expected)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise hf.Error(f"{source}: no such folder, and huggingface_hub is not installed to fetch it from the hub")
    try:
        return snapshot_download(source, allow_patterns=["config.json", "model.safetensors"])
    except Exception as e:  # network, unknown repository: one line either way
        raise hf.Error(f"{source}: cannot download from the hub ({type(e).__name__}: {str(e).splitlines()[0]})")


def main():
    ap = hf.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", help="transformers GPT-2 folder, or hub name")
    ap.add_argument("out", help="model file to write")
    ap.add_argument("--version", type=int, choices=[3, 5], default=3, help="3 = fp32 (default), 5 = bf16")
    args = ap.parse_args()
    folder = resolve(args.source)
    hf.check_output(args.out, "the model file")  # before the long read
    conf_path = os.path.join(folder, "config.json")
    cfg = hf.config_from_hf(hf.read_json(conf_path, "config.json"), conf_path)
    st = os.path.join(folder, "model.safetensors")
    if not os.path.lexists(st):
        raise hf.Error(f"{st}: not found (only safetensors weights are read; "
                       "save_pretrained(..., safe_serialization=True) writes them)")
    tensors = hf.from_hf(cfg, hf.read_safetensors(st), st)
    hf.write_model_file(args.out, cfg, tensors, args.version)
    n = sum(a.size for a in tensors.values())
    print(f"{args.out}: version {args.version}, L={cfg['L']} C={cfg['C']} NH={cfg['NH']} V={cfg['V']} "
          f"(Vp={cfg['Vp']}) maxT={cfg['maxT']}, {n:,} parameters")


if __name__ == "__main__":
    hf.run_cli(main)
