"""GPT-2 between llm.c's model files and Hugging Face transformers' folders (numpy only).

Shared by dev/export_hf.py and dev/import_hf.py. Layouts:
- model file (llm.c, README "File formats"): 256 x int32 header [20240326, 3 (fp32) or 5
  (bf16), maxT, V, L, NH, C, Vp], then the 16 tensors in llm.c's order, layers stacked,
  matrices as (out, in) like torch.nn.Linear, wte padded to Vp rows.
- transformers' GPT2LMHeadModel: one tensor per layer, named transformer.h.N.*; its
  Conv1D matrices (c_attn, c_proj, c_fc) are stored (in, out), so they are transposed here;
  wte has V rows and lm_head is tied to it.
- safetensors: u64 little-endian header length, a JSON header {name: {dtype, shape,
  data_offsets}}, then the raw little-endian data. It is read and written here directly,
  because the safetensors package's numpy API has no bfloat16 (numpy has no such type); the
  tests read the exported files with the safetensors package.
"""
import json
import os
import struct
import sys

import numpy as np

MODEL_MAGIC, VERSION_FP32, VERSION_BF16 = 20240326, 3, 5
PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
# per-layer tensors: llm.c name -> (transformers name under transformer.h.N., Conv1D?)
LAYER_TENSORS = {
    "ln1w": ("ln_1.weight", False), "ln1b": ("ln_1.bias", False),
    "qkvw": ("attn.c_attn.weight", True), "qkvb": ("attn.c_attn.bias", False),
    "attprojw": ("attn.c_proj.weight", True), "attprojb": ("attn.c_proj.bias", False),
    "ln2w": ("ln_2.weight", False), "ln2b": ("ln_2.bias", False),
    "fcw": ("mlp.c_fc.weight", True), "fcb": ("mlp.c_fc.bias", False),
    "fcprojw": ("mlp.c_proj.weight", True), "fcprojb": ("mlp.c_proj.bias", False),
}
GPT2_EOT = 50256


class Error(Exception):
    """Bad input: the CLIs print it as one `error:` line and exit 1."""


def run_cli(main):
    try:
        main()
    except Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def padded_vocab(V):
    return (V + 127) // 128 * 128  # the trainer's round_up_vocab


def shapes(cfg):
    maxT, Vp, L, C = cfg["maxT"], cfg["Vp"], cfg["L"], cfg["C"]
    return {"wte": (Vp, C), "wpe": (maxT, C), "ln1w": (L, C), "ln1b": (L, C),
            "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C),
            "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
            "fcprojw": (L, C, 4 * C), "fcprojb": (L, C), "lnfw": (C,), "lnfb": (C,)}


# ---- bf16 as uint16 bits ---------------------------------------------------------
def to_bf16_bits(a):
    """fp32 -> bf16 bits, round to nearest even (the trainer's and PyTorch's rounding)."""
    bits = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def from_bf16_bits(b):
    return (np.asarray(b, dtype="<u2").astype("<u4") << 16).view("<f4")


# ---- llm.c model files --------------------------------------------------------------
def read_model_file(path):
    """-> (config dict, {name: fp32 array}, version). bf16 values widen exactly."""
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise Error(f"{path}: cannot open the model file ({e.strerror})")
    if len(data) < 1024:
        raise Error(f"{path}: truncated model header ({len(data)} bytes)")
    h = np.frombuffer(data[:1024], dtype="<i4")
    if h[0] != MODEL_MAGIC:
        raise Error(f"{path}: not a model file (magic {h[0]}, expected {MODEL_MAGIC})")
    version = int(h[1])
    if version not in (VERSION_FP32, VERSION_BF16):
        raise Error(f"{path}: unsupported model file version {version} (3 = fp32, 5 = bf16)")
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    if min(maxT, V, L, NH, C) <= 0 or Vp < V or C % NH:
        raise Error(f"{path}: inconsistent model shape in the header "
                    f"(maxT={maxT} V={V} Vp={Vp} L={L} NH={NH} C={C})")
    cfg = {"maxT": maxT, "V": V, "Vp": Vp, "L": L, "NH": NH, "C": C}
    sh = shapes(cfg)
    n = sum(int(np.prod(s)) for s in sh.values())
    elem = 4 if version == VERSION_FP32 else 2
    if len(data) != 1024 + n * elem:
        raise Error(f"{path}: file is {len(data)} bytes, expected {1024 + n * elem} for this model "
                    f"({'truncated' if len(data) < 1024 + n * elem else 'trailing data'})")
    flat = np.frombuffer(data, dtype="<f4" if elem == 4 else "<u2", offset=1024)
    if elem == 2:
        flat = from_bf16_bits(flat)
    tensors, off = {}, 0
    for name in PARAM_NAMES:
        k = int(np.prod(sh[name]))
        tensors[name] = flat[off:off + k].reshape(sh[name])
        off += k
    return cfg, tensors, version


def write_model_file(path, cfg, tensors, version):
    header = np.zeros(256, dtype="<i4")
    header[:8] = [MODEL_MAGIC, version, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        for name in PARAM_NAMES:
            a = np.ascontiguousarray(tensors[name], dtype="<f4")
            f.write(a.tobytes() if version == VERSION_FP32 else to_bf16_bits(a).tobytes())
    os.replace(tmp, path)


# ---- safetensors ----------------------------------------------------------------------
_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def read_safetensors(path):
    """-> {name: fp32 array} (F32, F16 and BF16 widen exactly)."""
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise Error(f"{path}: cannot open ({e.strerror})")
    if len(data) < 8:
        raise Error(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n])
    except (ValueError, UnicodeDecodeError):
        raise Error(f"{path}: not a safetensors file (no JSON header)")
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dt = spec.get("dtype")
        if dt not in _DTYPES:
            raise Error(f"{path}: tensor {name} has dtype {dt}; F32, F16 or BF16 expected")
        b, e = spec["data_offsets"]
        if 8 + n + e > len(data):
            raise Error(f"{path}: truncated (tensor {name} ends past the end of the file)")
        a = np.frombuffer(data, dtype=_DTYPES[dt], count=(e - b) // np.dtype(_DTYPES[dt]).itemsize,
                          offset=8 + n + b).reshape(spec["shape"])
        out[name] = from_bf16_bits(a) if dt == "BF16" else a.astype("<f4", copy=False)
    return out


def write_safetensors(path, tensors, bf16):
    """tensors: {name: fp32 array}, written in sorted name order (as transformers does)."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        raw = (to_bf16_bits(a) if bf16 else a).tobytes()
        header[name] = {"dtype": "BF16" if bf16 else "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # data 8-byte aligned, as the safetensors package writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for raw in blobs:
            f.write(raw)


# ---- the two layouts ---------------------------------------------------------------------
def to_hf(cfg, tensors):
    """llm.c tensors -> transformers' state dict (padded vocabulary rows dropped)."""
    out = {"transformer.wte.weight": tensors["wte"][:cfg["V"]],
           "transformer.wpe.weight": tensors["wpe"],
           "transformer.ln_f.weight": tensors["lnfw"], "transformer.ln_f.bias": tensors["lnfb"]}
    for l in range(cfg["L"]):
        for ours, (theirs, conv1d) in LAYER_TENSORS.items():
            t = tensors[ours][l]
            out[f"transformer.h.{l}.{theirs}"] = t.T if conv1d else t
    return out


def from_hf(cfg, state, where):
    """transformers' state dict (with or without the "transformer." prefix, as on the hub)
    -> llm.c tensors, wte padded with zero rows to Vp."""
    def get(name, shape):
        for key in ("transformer." + name, name):
            if key in state:
                t = state[key]
                if tuple(t.shape) != tuple(shape):
                    raise Error(f"{where}: {key} has shape {list(t.shape)}, expected {list(shape)} from config.json")
                return t
        raise Error(f"{where}: tensor transformer.{name} missing")
    V, Vp, C, L, maxT = cfg["V"], cfg["Vp"], cfg["C"], cfg["L"], cfg["maxT"]
    wte = get("wte.weight", (V, C))
    if "lm_head.weight" in state and not np.array_equal(state["lm_head.weight"], wte):
        raise Error(f"{where}: lm_head.weight differs from wte (untied output layer; GPT-2 ties them)")
    t = {"wte": np.concatenate([wte, np.zeros((Vp - V, C), dtype="<f4")]), "wpe": get("wpe.weight", (maxT, C)),
         "lnfw": get("ln_f.weight", (C,)), "lnfb": get("ln_f.bias", (C,))}
    sh = shapes(cfg)
    for ours, (theirs, conv1d) in LAYER_TENSORS.items():
        per_layer = sh[ours][1:]
        hf_shape = per_layer[::-1] if conv1d else per_layer
        layers = [get(f"h.{l}.{theirs}", hf_shape) for l in range(L)]
        t[ours] = np.stack([a.T if conv1d else a for a in layers])
    return t


def config_from_hf(conf, where):
    """transformers' GPT2Config (config.json) -> our shape; refuses what the trainer cannot compute."""
    if conf.get("model_type") != "gpt2":
        raise Error(f"{where}: model_type is {conf.get('model_type')!r}, not 'gpt2'")
    try:
        C, L, NH, V, maxT = (int(conf[k]) for k in ("n_embd", "n_layer", "n_head", "vocab_size", "n_positions"))
    except KeyError as e:
        raise Error(f"{where}: {e.args[0]} missing")
    checks = [
        (conf.get("activation_function", "gelu_new") in ("gelu_new", "gelu_pytorch_tanh"),
         f"activation_function {conf.get('activation_function')!r} (the trainer's GELU is the tanh form, gelu_new)"),
        (conf.get("n_inner") in (None, 4 * C), f"n_inner {conf.get('n_inner')} (the trainer's MLP is 4 x n_embd)"),
        (abs(float(conf.get("layer_norm_epsilon", 1e-5)) - 1e-5) < 1e-12,
         f"layer_norm_epsilon {conf.get('layer_norm_epsilon')} (the trainer's is 1e-5)"),
        (conf.get("scale_attn_weights", True), "scale_attn_weights false"),
        (not conf.get("scale_attn_by_inverse_layer_idx", False), "scale_attn_by_inverse_layer_idx true"),
        (conf.get("tie_word_embeddings", True), "tie_word_embeddings false"),
        (C % NH == 0, f"n_embd {C} not a multiple of n_head {NH}"),
    ]
    for ok, what in checks:
        if not ok:
            raise Error(f"{where}: {what}: not supported")
    return {"maxT": maxT, "V": V, "Vp": padded_vocab(V), "L": L, "NH": NH, "C": C}


def config_to_hf(cfg, bf16):
    eot = GPT2_EOT if cfg["V"] > GPT2_EOT else None
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg["V"], "n_positions": cfg["maxT"], "n_ctx": cfg["maxT"],
        "n_embd": cfg["C"], "n_layer": cfg["L"], "n_head": cfg["NH"], "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True, "use_cache": True,
        "bos_token_id": eot, "eos_token_id": eot,
        "torch_dtype": "bfloat16" if bf16 else "float32",
    }
