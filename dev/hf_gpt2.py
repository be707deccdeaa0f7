"""GPT-2 between llm.c's model files and Hugging Face transformers' folders (numpy only).

Shared by dev/export_hf.py and dev/import_hf.py. Layouts:
- model file (llm.c, docs/formats.md): 256 x int32 header [20240326, 3 (fp32) or 5
  (bf16), maxT, V, L, NH, C, Vp], then the 16 tensors in llm.c's order, layers stacked,
  matrices as (out, in) like torch.nn.Linear, wte padded to Vp rows.
- transformers' GPT2LMHeadModel: one tensor per layer, named transformer.h.N.*; its
  Conv1D matrices (c_attn, c_proj, c_fc) are stored (in, out), so they are transposed here;
  wte has V rows and lm_head is tied to it.
- safetensors: u64 little-endian header length, a JSON header {name: {dtype, shape,
  data_offsets}}, then the raw little-endian data. It is read and written here directly,
  because the safetensors package's numpy API has no bfloat16 (numpy has no such type); the
  tests read the exported files with the safetensors package.

Every input is checked before it is used (validate_*; a bad one is an Error, one line), and
the files go through read_regular / write_regular: only regular files are read (a FIFO or a
device would block or never end), and an output is written whole, as a regular file, over a
regular file or nothing (never through a symlink, never over a device, FIFO or folder).
"""
import argparse
import json
import math
import os
import secrets
import stat
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


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one `error:` line too (not usage text and exit 2)."""

    def error(self, message):
        raise Error(f"{message} (see --help)")


def run_cli(main):
    """main(), with whatever stops it as one `error:` line on stderr and exit 1: an Error, a
    system error, memory; anything else is a bug, said so on the same one line."""
    try:
        main()
        return
    except Error as e:
        message = str(e)
    except OSError as e:
        message = f"{e.filename}: {e.strerror}" if e.filename else str(e)
    except MemoryError:
        message = "out of memory"
    except KeyboardInterrupt:
        message = "interrupted"
    except Exception as e:  # noqa: BLE001 (one line, not a traceback, even for a bug)
        message = f"internal error (a bug in {os.path.basename(sys.argv[0])}): {type(e).__name__}: {e}"
    print("error: " + message.replace("\n", "\\n"), file=sys.stderr)
    sys.exit(1)


def shown(value, limit=60):
    """A value from a file, for an error line: as JSON (no raw newlines), cut to limit."""
    try:
        r = json.dumps(value)
    except (TypeError, ValueError):
        r = repr(value)
    return r if len(r) <= limit else r[:limit] + "..."


# ---- files: regular inputs; outputs whole, regular, never through a link ------------------
_KINDS = [(stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]


def _kind(mode):
    return next((name for test, name in _KINDS if test(mode)), "of an unknown kind")


def _json_kind(value):
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def read_regular(path, what, max_bytes=None):
    """The bytes of path, a regular file. Opened with O_NONBLOCK and checked with fstat before
    any read (as llmc/formats/regular_file.h): a FIFO's open would wait for a writer, a device's read
    might never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise Error(f"{path}: cannot open {what} ({e.strerror})")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Error(f"{path}: {what} is {_kind(st.st_mode)}, not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise Error(f"{path}: {what} is {st.st_size} bytes, more than {max_bytes}")
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    except OSError as e:
        raise Error(f"{path}: cannot read {what} ({e.strerror})")
    finally:
        os.close(fd)


def check_output(path, what, regular=True):
    """Refuses an output path that exists as anything but a regular file (regular=False: a
    folder); a symlink is refused, not followed. An existing regular file is replaced."""
    if regular and not os.path.basename(path):
        raise Error(f"{path}: {what} needs a file name, not a folder")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        raise Error(f"{path}: cannot check the {what} path ({e.strerror})")
    if not (stat.S_ISREG(mode) if regular else stat.S_ISDIR(mode)):
        raise Error(f"{path}: exists and is {_kind(mode)}; {what} is written only as a new "
                    f"{'regular file' if regular else 'folder'} or over one, so it is left alone")
    return True


def make_output_folder(path, what):
    """path as a folder: an existing one (not a symlink to one), or a new one."""
    if check_output(os.path.normpath(path), what, regular=False):
        return
    try:
        os.makedirs(path)
    except OSError as e:
        raise Error(f"{path}: cannot create {what} ({e.strerror})")


def write_regular(path, chunks, what):
    """Writes the byte strings of chunks as path: into a temporary created exclusively in
    path's folder (O_EXCL | O_NOFOLLOW: nothing planted there is followed), fsynced, renamed
    over path. So path is either what it was or all of the new content, and is only ever a
    regular file (check_output)."""
    check_output(path, what)
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise Error(f"{path}: cannot create {what} in {folder} ({e.strerror})")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        check_output(path, what)  # again: the path may have changed while writing
        os.rename(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise Error(f"{path}: cannot write {what} ({e.strerror})")
        raise
    _fsync_folder(folder)


def _fsync_folder(folder):
    """So the rename survives a power loss; best effort (some file systems cannot)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json(path, what, max_bytes=1 << 20):
    """A JSON object from a small regular file."""
    text = read_regular(path, what, max_bytes)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise Error(f"{path}: {what} is not valid JSON ({str(e).splitlines()[0][:80]})")
    if not isinstance(value, dict):
        raise Error(f"{path}: {what} is {_json_kind(value)}, not a JSON object")
    return value


# ---- shapes --------------------------------------------------------------------------------
MAX_LAYERS, MAX_DIM, MAX_PARAMETERS = 4096, 1 << 24, 1 << 40  # as train_gpt.cu's model_shape_problem


def padded_vocab(V):
    return (V + 127) // 128 * 128  # the trainer's round_up_vocab


def shapes(cfg):
    maxT, Vp, L, C = cfg["maxT"], cfg["Vp"], cfg["L"], cfg["C"]
    return {"wte": (Vp, C), "wpe": (maxT, C), "ln1w": (L, C), "ln1b": (L, C),
            "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C),
            "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
            "fcprojw": (L, C, 4 * C), "fcprojb": (L, C), "lnfw": (C,), "lnfb": (C,)}


def num_parameters(cfg):
    return sum(math.prod(s) for s in shapes(cfg).values())


def validate_shape(cfg, where, names=None):
    """The trainer's limits (train_gpt.cu's model_shape_problem): every field an int in
    1..its maximum, C a multiple of NH, Vp >= V, at most 2^40 parameters. names: what the
    fields are called where they come from (config.json's n_embd for C...)."""
    label, at = (names or {}).get, f"{where}: " if where else ""
    limits = {"maxT": MAX_DIM, "V": MAX_DIM, "Vp": MAX_DIM, "L": MAX_LAYERS, "NH": MAX_DIM, "C": MAX_DIM}
    for name, top in limits.items():
        value = cfg[name]
        if type(value) is not int or not 1 <= value <= top:
            raise Error(f"{at}{label(name, name)} {shown(value)} is outside 1..{top}")
    if cfg["C"] % cfg["NH"]:
        raise Error(f"{at}{label('C', 'C')} {cfg['C']} is not a multiple of {label('NH', 'NH')} {cfg['NH']}")
    if cfg["Vp"] < cfg["V"]:
        raise Error(f"{at}Vp {cfg['Vp']} is below V {cfg['V']}")
    if num_parameters(cfg) > MAX_PARAMETERS:
        raise Error(f"{at}more than 2^40 parameters")


def validate_finite(tensors, where):
    """Refuses NaN and infinity: a model with them trains nothing and cannot be checkpointed."""
    for name, a in tensors.items():
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            raise Error(f"{where}: {name} has {bad.size} non-finite value{'s' * (bad.size > 1)} "
                        f"({a.flat[bad[0]]} at flat index {bad[0]})")


# ---- bf16 as uint16 bits ---------------------------------------------------------
# the smallest fp32 magnitude that rounds (to nearest even) to bf16 infinity
BF16_OVERFLOW = float(np.array(0x7F7F8000, dtype="<u4").view("<f4"))


def to_bf16_bits(a):
    """fp32 -> bf16 bits, round to nearest even (the trainer's and PyTorch's rounding)."""
    bits = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def from_bf16_bits(b):
    return (np.asarray(b, dtype="<u2").astype("<u4") << 16).view("<f4")


def validate_bf16_range(tensors, where):
    """Refuses a finite fp32 weight that would round to infinity in bf16."""
    for name, a in tensors.items():
        big = np.flatnonzero(np.abs(a) >= BF16_OVERFLOW)
        if big.size:
            raise Error(f"{where}: {name} has {big.size} value{'s' * (big.size > 1)} beyond bf16's range "
                        f"({a.flat[big[0]]} at flat index {big[0]}); keep fp32")


# ---- llm.c model files --------------------------------------------------------------
def read_model_file(path):
    """-> (config dict, {name: fp32 array}, version). bf16 values widen exactly."""
    data = read_regular(path, "the model file")
    if len(data) < 1024:
        raise Error(f"{path}: truncated model header ({len(data)} bytes)")
    h = np.frombuffer(data[:1024], dtype="<i4")
    if h[0] != MODEL_MAGIC:
        raise Error(f"{path}: not a model file (magic {h[0]}, expected {MODEL_MAGIC})")
    version = int(h[1])
    if version not in (VERSION_FP32, VERSION_BF16):
        raise Error(f"{path}: unsupported model file version {version} (3 = fp32, 5 = bf16)")
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    cfg = {"maxT": maxT, "V": V, "Vp": Vp, "L": L, "NH": NH, "C": C}
    validate_shape(cfg, f"{path}: model header")
    sh = shapes(cfg)
    elem = 4 if version == VERSION_FP32 else 2
    size = 1024 + num_parameters(cfg) * elem
    if len(data) != size:
        raise Error(f"{path}: file is {len(data)} bytes, expected {size} for this model "
                    f"({'truncated' if len(data) < size else 'trailing data'})")
    flat = np.frombuffer(data, dtype="<f4" if elem == 4 else "<u2", offset=1024)
    if elem == 2:
        flat = from_bf16_bits(flat)
    tensors, off = {}, 0
    for name in PARAM_NAMES:
        k = math.prod(sh[name])
        tensors[name] = flat[off:off + k].reshape(sh[name])
        off += k
    validate_finite(tensors, path)
    return cfg, tensors, version


def write_model_file(path, cfg, tensors, version):
    validate_shape(cfg, path)
    validate_finite(tensors, path)
    if version == VERSION_BF16:
        validate_bf16_range(tensors, path)
    header = np.zeros(256, dtype="<i4")
    header[:8] = [MODEL_MAGIC, version, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]

    def chunks():
        yield header.tobytes()
        for name in PARAM_NAMES:
            a = np.ascontiguousarray(tensors[name], dtype="<f4")
            yield a.tobytes() if version == VERSION_FP32 else to_bf16_bits(a).tobytes()
    write_regular(path, chunks(), "the model file")


# ---- safetensors ----------------------------------------------------------------------
_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
MAX_HEADER = 100 << 20  # the safetensors package's own limit


def _no_duplicates(pairs):
    names = [k for k, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"a name twice: {shown(next(k for k in names if names.count(k) > 1))}")
    return dict(pairs)


def _is_int(v):
    return type(v) is int


def validate_safetensors(data, path):
    """-> {name: (numpy dtype, shape, begin, end)}, begin/end absolute in data, from the
    header, checked as the safetensors package does: a JSON object, each tensor a known dtype,
    a shape of non-negative ints, data_offsets whose length is the shape's; the tensors tile
    the data exactly (sorted by offset, no overlap, no gap, nothing after the last)."""
    if len(data) < 8:
        raise Error(f"{path}: not a safetensors file ({len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise Error(f"{path}: header length {n} runs past the end of the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n], object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:
        raise Error(f"{path}: the safetensors header is not valid JSON ({str(e).splitlines()[0][:80]})")
    if not isinstance(header, dict):
        raise Error(f"{path}: the safetensors header is {_json_kind(header)}, not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise Error(f"{path}: __metadata__ is not an object of strings")
    specs = {}
    for name, spec in header.items():
        specs[name] = _tensor_spec(name, spec, path)
    base, end = 8 + n, 8 + n
    for name, (dtype, shape, b, e) in sorted(specs.items(), key=lambda kv: kv[1][2:]):
        if base + b != end:
            what = "overlaps the tensor before it" if base + b < end else "leaves a gap before it"
            raise Error(f"{path}: tensor {shown(name)} at data_offsets [{b}, {e}] {what} (tensors must tile the data)")
        end = base + e
        specs[name] = (dtype, shape, base + b, base + e)
    if end != len(data):
        raise Error(f"{path}: the tensors end at byte {end}, the file at {len(data)} "
                    f"({'truncated' if end > len(data) else 'trailing data'})")
    return specs


def _tensor_spec(name, spec, path):
    if not isinstance(spec, dict):
        raise Error(f"{path}: tensor {shown(name)} is described by {_json_kind(spec)}, not a JSON object")
    dt, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dt not in _DTYPES:
        raise Error(f"{path}: tensor {shown(name)} has dtype {shown(dt)}; F32, F16 or BF16 expected")
    if not isinstance(shape, list) or len(shape) > 8 or not all(_is_int(d) and d >= 0 for d in shape):
        raise Error(f"{path}: tensor {shown(name)} has shape {shown(shape)}, not a list of non-negative ints")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets) \
            or not 0 <= offsets[0] <= offsets[1]:
        raise Error(f"{path}: tensor {shown(name)} has data_offsets {shown(offsets)}, not [begin, end] with 0 <= begin <= end")
    dtype = np.dtype(_DTYPES[dt])
    nbytes = math.prod(shape) * dtype.itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise Error(f"{path}: tensor {shown(name)}: shape {shape} of {dt} is {nbytes} bytes, "
                    f"data_offsets {offsets} give {offsets[1] - offsets[0]}")
    return dt, tuple(shape), offsets[0], offsets[1]


def read_safetensors(path):
    """-> {name: fp32 array} (F32, F16 and BF16 widen exactly), the file validated first."""
    data = read_regular(path, "the safetensors file")
    out = {}
    for name, (dt, shape, b, e) in validate_safetensors(data, path).items():
        dtype = np.dtype(_DTYPES[dt])
        a = np.frombuffer(data, dtype=dtype, count=(e - b) // dtype.itemsize, offset=b).reshape(shape)
        out[name] = from_bf16_bits(a) if dt == "BF16" else a.astype("<f4", copy=False)
    return out


def write_safetensors(path, tensors, bf16):
    """tensors: {name: fp32 array}, written in sorted name order (as transformers does)."""
    validate_finite(tensors, path)
    if bf16:
        validate_bf16_range(tensors, path)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(tensors):
        a = tensors[name]
        size = a.size * (2 if bf16 else 4)
        header[name] = {"dtype": "BF16" if bf16 else "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # data 8-byte aligned, as the safetensors package writes it

    def chunks():
        yield struct.pack("<Q", len(h)) + h
        for name in sorted(tensors):
            a = np.ascontiguousarray(tensors[name], dtype="<f4")
            yield (to_bf16_bits(a) if bf16 else a).tobytes()
    write_regular(path, chunks(), "the safetensors file")


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


# buffers some checkpoints carry besides the weights (the causal mask), ignored
_BUFFERS = ("attn.bias", "attn.masked_bias")


def validate_names(cfg, state, where):
    """-> {name without "transformer.": the state's name}: every tensor a GPT-2 of cfg's shape
    has (each once, with or without the prefix), lm_head.weight, the mask buffers, nothing
    else (a layer past n_layer would be dropped without a word)."""
    expected = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"} | {
        f"h.{l}.{theirs}" for l in range(cfg["L"]) for theirs, _ in LAYER_TENSORS.values()}
    keys = {}
    for key in state:
        if key == "lm_head.weight":
            continue
        name = key[len("transformer."):] if key.startswith("transformer.") else key
        layer, _, rest = name[2:].partition(".") if name.startswith("h.") else ("", "", "")
        buffer = layer.isdigit() and int(layer) < cfg["L"] and rest in _BUFFERS
        if name not in expected and not buffer:
            raise Error(f"{where}: unexpected tensor {shown(key)} (not in a GPT-2 of config.json's shape)")
        if name in keys:
            raise Error(f"{where}: tensor {shown(key)} twice (with and without the transformer. prefix)")
        keys[name] = key
    missing = sorted(expected - set(keys))
    if missing:
        raise Error(f"{where}: tensor transformer.{missing[0]} missing" +
                    (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return keys


def from_hf(cfg, state, where):
    """transformers' state dict (with or without the "transformer." prefix, as on the hub)
    -> llm.c tensors, wte padded with zero rows to Vp; names, shapes and values checked."""
    keys = validate_names(cfg, state, where)
    validate_finite({key: state[key] for key in keys.values()}, where)

    def get(name, shape):
        t = state[keys[name]]
        if tuple(t.shape) != tuple(shape):
            raise Error(f"{where}: {keys[name]} has shape {list(t.shape)}, expected {list(shape)} from config.json")
        return t
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


# config.json's names of the shape's fields
HF_FIELDS = {"maxT": "n_positions", "V": "vocab_size", "L": "n_layer", "NH": "n_head", "C": "n_embd"}


def _optional(conf, key, types, default):
    value = conf.get(key, default)
    if type(value) not in types:
        names = {str: "a string", int: "an int", float: "a number", bool: "true or false", type(None): "null"}
        raise Error(f"{key} is {shown(value)}, not {' or '.join(names[t] for t in types)}")
    return value


def config_from_hf(conf, where):
    """transformers' GPT2Config (config.json) -> our shape; refuses what the trainer cannot
    compute, and any field of the wrong type."""
    try:
        return _config_from_hf(conf)
    except Error as e:  # the one place that knows the file's name
        raise Error(f"{where}: {e}")


def _config_from_hf(conf):
    if not isinstance(conf, dict):
        raise Error(f"{_json_kind(conf)}, not a JSON object")
    if conf.get("model_type") != "gpt2":
        raise Error(f"model_type is {shown(conf.get('model_type'))}, not 'gpt2'")
    cfg = {}
    for ours, key in HF_FIELDS.items():
        if key not in conf:
            raise Error(f"{key} missing")
        if type(conf[key]) is not int:
            raise Error(f"{key} is {shown(conf[key])}, not an int")
        cfg[ours] = conf[key]
    cfg["Vp"] = padded_vocab(cfg["V"])
    validate_shape(cfg, None, dict(HF_FIELDS, Vp="vocab_size padded to 128"))
    C = cfg["C"]
    activation = _optional(conf, "activation_function", (str,), "gelu_new")
    n_inner = _optional(conf, "n_inner", (int, type(None)), None)
    eps = _optional(conf, "layer_norm_epsilon", (float,), 1e-5)
    flags = {k: _optional(conf, k, (bool,), d) for k, d in (("scale_attn_weights", True),
             ("scale_attn_by_inverse_layer_idx", False), ("tie_word_embeddings", True))}
    checks = [
        (activation in ("gelu_new", "gelu_pytorch_tanh"),
         f"activation_function {shown(activation)} (the trainer's GELU is the tanh form, gelu_new)"),
        (n_inner in (None, 4 * C), f"n_inner {n_inner} (the trainer's MLP is 4 x n_embd)"),
        (abs(eps - 1e-5) < 1e-12, f"layer_norm_epsilon {eps} (the trainer's is 1e-5)"),
        (flags["scale_attn_weights"], "scale_attn_weights false"),
        (not flags["scale_attn_by_inverse_layer_idx"], "scale_attn_by_inverse_layer_idx true"),
        (flags["tie_word_embeddings"], "tie_word_embeddings false"),
    ]
    for ok, what in checks:
        if not ok:
            raise Error(f"{what}: not supported")
    return cfg


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
