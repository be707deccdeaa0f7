#!/usr/bin/env python3
"""A fuzzer of the trainers' loaders, run as the user runs them: valid seed inputs, mutated
(truncations, byte flips, safetensors headers and index files rewritten: dtypes, shapes,
data_offsets, header lengths, duplicate and hostile names, shard names that leave the folder;
config.json values wrong, huge or missing; token shards with wrong magic, version or token
count, ids >= V, document-token flags against the vocabulary; llm.c model files and a
checkpoint folder to resume from, damaged), each case run through the real trainer for at
most one step:

  gpt2-folder     train_gpt -e FOLDER       transformers GPT-2 folder (test/ref/hf_tiny)
  llama3-folder   train_llama3 -e FOLDER    Llama folder, tied or untied (build/host/write_llama3_random)
  llama3-sharded  train_llama3 -e FOLDER    4 shards and model.safetensors.index.json
  model-bin       train_gpt -e FILE         llm.c model file (version 3 and 5)
  shards-u16      train_gpt -i SHARDS       uint16 shards (magic 20240520)
  shards-u32      train_llama3 -i SHARDS    uint32 shards (magic 20240801, version 7), mixed with uint16
  resume          train_gpt -o DIR -y 1     a checkpoint folder (DONE, state and model files)
  ranks           prepro --tiktoken FILE    a tiktoken ranks file (test/data/tiktoken_test.ranks): lines
                                            duplicated, dropped, swapped; ranks and base64 made bad

A run passes when it exits 0 (the mutation was harmless), or exits 1 with exactly one stderr
line, starting "error: ", that names no out-of-memory (an attempt at a huge allocation) and
holds no control bytes ("warning: " lines may precede either: a resume falling back says why). Anything else (a signal, a sanitizer report, more lines, another exit
status, running past the hang guard) is a finding: printed with its mutation, counted, and its
case folder saved under --findings with the command that reproduces it; exit status 1.

Memory: the ASan build (the default where built) runs with ASan's allocation limit of 2 GiB
and an RSS limit of 4 GiB (a larger request is a sanitizer report); another build runs under
an address-space limit of 4 GiB. The CPU runtime's device has 2 GiB. The mutations are
deterministic given --seed: --runs N makes the same N cases of each loader every time;
--seconds N runs each loader for N seconds of wall time (the number of cases then varies,
their sequence does not).

--plant replaces the trainers with a planted loader (this file, --planted-loader) that
crashes on a shard whose token count is past its end and prints a traceback for a
safetensors header length past the end: the harness must report both.

Usage: dev/fuzz_loaders.py [--seconds N | --runs N] [--seed S] [--loaders a,b] [--build DIR]
                           [--findings DIR] [--guard SECONDS] [--plant] [--verbose]
       (defaults: 60 s per loader, seed 1, every loader, build/cpu-asan where its trainers are
       built else build/cpu, findings in build/fuzz_loaders/findings, guard 120 s)
"""
import argparse
import json
import os
import random
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fuzz_hf as hf  # noqa: E402  (its safetensors, config.json and model-file mutations)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test"))
import xxh64  # noqa: E402  (a DONE marker that vouches for a damaged file)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2_FOLDER = os.path.join(REPO, "test", "ref", "hf_tiny")
STEP = {"-x": "1", "-b": "1", "-t": "8", "-v": "0"}  # one step of one short sequence, no evaluation
MEMORY_LIMIT = 4 << 30
ASAN_OPTIONS = ("detect_leaks=0:allocator_may_return_null=0:max_allocation_size_mb=2048:"
                "hard_rss_limit_mb=4096:abort_on_error=0")
U16, U32 = (20240520, 1, 2, "H"), (20240801, 7, 4, "I")  # magic, version, bytes per token, struct code
MARKOV_MARKER = 0x31564B4D  # a built-in-corpus shard's header[4] (llmc/data/markov_corpus.h); its EOT is header[9]
ODD = hf.ODD + [2 ** 31 - 1, 2 ** 31, 2 ** 24, 2 ** 24 + 1, 2 ** 40, 65536, 128256, 4096, 4097]
HOSTILE_STRINGS = ["two\nlines", "\x1b[2J\x1b[H", "a\rb", "\x00", "\u00e9\u4e2d", "x" * 10000]  # for one-line errors


# ---- files -------------------------------------------------------------------------------
def read(path):
    with open(path, "rb") as f:
        return f.read()


def shard(tokens, kind):
    magic, version, _, code = kind
    return struct.pack("<3i", magic, version, len(tokens)) + bytes(1012) + struct.pack(f"<{len(tokens)}{code}", *tokens)


def shard_tokens(data):
    """-> (kind, tokens) of a well-formed shard."""
    kind = U16 if struct.unpack("<i", data[:4])[0] == U16[0] else U32
    n = (len(data) - 1024) // kind[2]
    return kind, list(struct.unpack(f"<{n}{kind[3]}", data[1024:1024 + n * kind[2]]))


def documents(rng, V, doc, n):
    """n token ids < V in documents that each start with doc."""
    tokens = []
    while len(tokens) < n:
        tokens += [doc] + [rng.randrange(V) for _ in range(rng.randint(3, 40))]
    return tokens[:n]


# ---- mutations ---------------------------------------------------------------------------
def json_paths(obj, prefix=()):
    """Every (path, value) of a JSON object's members, nested objects included."""
    for k, v in obj.items():
        yield prefix + (k,), v
        if isinstance(v, dict):
            yield from json_paths(v, prefix + (k,))


def mutate_json(rng, data, keys=()):
    """One change to a JSON object's text: a member (one of keys, or any) set to an odd value or
    removed, or the text broken -> (bytes, what)."""
    try:
        obj = json.loads(data)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or rng.random() < 0.15:
        garbage = rng.choice([b"", b"[]", b"null", b"{", data[:len(data) // 2], b"[" * 100000, b"\xff\xfe",
                              b'{"a":' * 5000, b"1" * 5000, b" " * (2 << 20)])
        return garbage, f"text {garbage[:20]!r} ({len(garbage)} bytes)"
    paths = [p for p, _ in json_paths(obj)]
    wanted = [p for p in paths if p[-1] in keys]
    path = rng.choice(wanted if wanted and rng.random() < 0.8 else paths)
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    if rng.random() < 0.2:
        del parent[path[-1]]
        return json.dumps(obj).encode(), f"no {'.'.join(path)}"
    value = parent[path[-1]]
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.4:
        value = rng.choice([value + 1, value - 1, value * 2, value // 2, -value, value * 1024])
    else:
        value = rng.choice(ODD + HOSTILE_STRINGS + [float("inf"), 1e-30, "llama", "gpt2", "silu", {"rope_type": "llama3"}])
    parent[path[-1]] = value
    return json.dumps(obj).encode(), f"{'.'.join(path)} = {value!r:.60}"


def retype(rng, data):
    """A tensor's dtype changed with its shape rescaled so that its bytes (and the file's tiling)
    stay the same: it gets past the reader's checks to the model's."""
    header, body = hf.split_safetensors(data)
    name = rng.choice([k for k in header if k != "__metadata__"])
    spec = header[name]
    old = hf_dtype_bytes(spec["dtype"])
    dtype = rng.choice(["F64", "I64", "F16", "BF16", "I32", "I16", "U16", "U8", "BOOL", "F8_E4M3", "F32"])
    new = hf_dtype_bytes(dtype)
    shape = list(spec["shape"]) or [1]
    if shape[-1] * old % new == 0:  # else the bytes no longer match: the reader's check
        shape[-1] = shape[-1] * old // new
    spec["dtype"], spec["shape"] = dtype, shape
    return hf.join_safetensors(json.dumps(header), body), f"{name} as {dtype} {shape}"


def hf_dtype_bytes(dtype):
    return {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
            "U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}[dtype]


HOSTILE_NAMES = ["../model.safetensors", "../../etc/passwd", "/etc/passwd", "/dev/zero", "", ".", "..", ".hidden",
                 "a/../model.safetensors", "config.json", "model.safetensors.index.json", "missing.safetensors",
                 "x" * 5000, "model\n.safetensors", "\u00e9.safetensors", "model-00001-of-00003.safetensors/"]


def rename_tensor(rng, data):
    """A tensor renamed: another tensor's name (a swap), a hostile or absurd name."""
    header, body = hf.split_safetensors(data)
    names = [k for k in header if k != "__metadata__"]
    a, b = rng.sample(names, 2) if len(names) > 1 else (names[0], None)
    if b and rng.random() < 0.5:
        header[a], header[b] = header[b], header[a]
        return hf.join_safetensors(json.dumps(header), body), f"{a} and {b} swapped"
    new = rng.choice(HOSTILE_NAMES + [a + "\x00", a.upper(), a.replace("0", "99999"), "\x1b[2J" + a])
    header[new] = header.pop(a)
    return hf.join_safetensors(json.dumps(header), body), f"{a} renamed {new!r:.40}"


def mutate_safetensors(rng, data):
    """-> (bytes, what): one of the reader's and the model's checks aimed at."""
    choice = rng.random()
    if choice < 0.2:
        n = struct.unpack("<Q", data[:8])[0]
        return hf.flip_bytes(rng, data, 8 + n + 64), "byte flips / truncation"
    if choice < 0.55:
        return hf.mutate_header(rng, data)
    if choice < 0.7:
        return retype(rng, data)
    if choice < 0.85:
        return rename_tensor(rng, data)
    return hf.poison_weight(rng, data)


def mutate_kind(rng, case, name):
    """name becomes another kind of file: a FIFO, a folder, a link to a device or to nowhere, absent."""
    path = os.path.join(case, name)
    if os.path.lexists(path):
        os.unlink(path)
    kind = rng.choice(["fifo", "folder", "/dev/zero", "/dev/null", "dangling link", "absent", "link to a folder"])
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        os.mkdir(path)
    elif kind.startswith("/dev/"):
        os.symlink(kind, path)
    elif kind == "dangling link":
        os.symlink(path + ".nowhere", path)
    elif kind == "link to a folder":
        os.symlink(case, path)
    return f"{name} is {kind}"


def mutate_shard(rng, data, V):
    """-> (bytes, what): a token shard's header, size or ids."""
    kind, tokens = shard_tokens(data)
    choice = rng.random()
    if choice < 0.35:
        d = bytearray(data)
        slot = rng.choice([0, 1, 2, 2, 2, 3, rng.randrange(256)])
        value = rng.choice([U16[0], U32[0], 0, 1, 7, -1, 2 ** 31 - 1, -2 ** 31, len(tokens) + 1, len(tokens) - 1,
                            len(tokens) * 2, len(tokens) // 2, 2 ** 30, rng.randint(-2 ** 31, 2 ** 31 - 1)])
        d[slot * 4:slot * 4 + 4] = struct.pack("<i", value)
        return bytes(d), f"header[{slot}] = {value}"
    if choice < 0.55:
        bad = rng.choice([V, V + 1, 65535, 65536, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, V - 1])
        if kind == U16:
            bad &= 0xFFFF
        at = rng.randrange(len(tokens))
        tokens[at] = bad
        return shard(tokens, kind), f"token {at} = {bad}"
    if choice < 0.65:
        n = rng.choice([0, 1, 2, 8, 9, 10])
        return shard(tokens[:n], kind), f"{n} tokens"
    if choice < 0.75:
        other = U32 if kind == U16 else U16
        if other == U16:
            tokens = [t & 0xFFFF for t in tokens]
        return shard(tokens, other), f"rewritten as {'uint16' if other == U16 else 'uint32'}"
    if choice < 0.85:
        d = bytearray(data)
        eot = rng.choice([-1, -2 ** 31, 0, V - 1, V, 2 ** 31 - 1])
        d[16:20] = struct.pack("<i", MARKOV_MARKER)
        d[36:40] = struct.pack("<i", eot)
        return bytes(d), f"marked as a built-in-corpus shard with EOT {eot}"
    return hf.flip_bytes(rng, data, 1024), "byte flips / truncation"


def document_flags(rng, V):
    """Flags that need the document token, with or without --doc-token (in the vocabulary or not)."""
    flags = []
    for f in rng.sample([["--packing", "slots"], ["--doc-mask", "1"], ["--doc-positions", "1"]], rng.randint(0, 2)):
        flags += f
    if rng.random() < 0.3:
        flags += ["--doc-token", str(rng.choice([0, V - 1, V - 1, V // 2, V, 128000]))]
    if rng.random() < 0.2:
        flags += ["-t", str(rng.choice([1, 2, 16, 64, 65, 1024]))]
    if rng.random() < 0.2:
        flags += ["-b", str(rng.choice([2, 7, 64]))]
    return flags


# ---- the loaders -------------------------------------------------------------------------
class Loader:
    """A trainer and how its cases are made: base(rng, work) -> {name: bytes} (made once);
    mutate(rng, case_dir) -> what was done (files already written); args -> the trainer's
    arguments (relative to the case folder)."""

    def __init__(self, name, program, base, mutate, args):
        self.name, self.program, self.base, self.mutate, self.args = name, program, base, mutate, args


def write_files(folder, files):
    for name, data in files.items():
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def rewrite(case, name, change):
    """change(bytes) -> (bytes, what) applied to the case's file name."""
    data, what = change(read(os.path.join(case, name)))
    with open(os.path.join(case, name), "wb") as f:
        f.write(data)
    return f"{name}: {what}"


GPT2_KEYS = ["n_embd", "n_layer", "n_head", "vocab_size", "n_positions", "n_inner", "layer_norm_epsilon",
             "activation_function", "tie_word_embeddings", "scale_attn_weights", "model_type"]
LLAMA3_KEYS = ["hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
               "vocab_size", "max_position_embeddings", "head_dim", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
               "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "rope_type",
               "model_type", "architectures", "pretraining_tp", "attention_bias"]


def mutate_folder(rng, case, config_keys, weight_files):
    """One change to a model folder: config.json, the index (where sharded), a weight file, or a
    file's kind."""
    index = ["model.safetensors.index.json"] if len(weight_files) > 1 else []
    choice = rng.random()
    if choice < 0.2:
        return rewrite(case, "model/config.json", lambda d: mutate_json(rng, d, config_keys))
    if index and choice < 0.45:
        return rewrite(case, "model/" + index[0], lambda d: mutate_index(rng, d, weight_files))
    if choice < 0.95:
        return rewrite(case, "model/" + rng.choice(weight_files), lambda d: mutate_safetensors(rng, d))
    return mutate_kind(rng, case, "model/" + rng.choice(["config.json"] + index + weight_files))


def mutate_index(rng, data, weight_files):
    index = json.loads(data)
    wm = index["weight_map"]
    choice = rng.random()
    if choice < 0.5:
        name = rng.choice(list(wm))
        wm[name] = rng.choice(HOSTILE_NAMES + weight_files + [None, 3, ["x"]])
        return json.dumps(index).encode(), f"weight_map[{name}] = {wm[name]!r:.40}"
    if choice < 0.65:
        name = rng.choice(list(wm))
        del wm[name]
        return json.dumps(index).encode(), f"weight_map without {name}"
    if choice < 0.75:
        wm[rng.choice(["lm_head.bias", "model.layers.2.mlp.up_proj.weight", "x"])] = rng.choice(weight_files)
        return json.dumps(index).encode(), "weight_map with a tensor no shard has"
    return mutate_json(rng, data, ["weight_map", "metadata", "total_size"])


def gpt2_folder_base(rng, work):
    files = {"model/config.json": read(os.path.join(GPT2_FOLDER, "config.json")),
             "model/model.safetensors": read(os.path.join(GPT2_FOLDER, "model.safetensors"))}
    files["train.bin"] = shard(documents(rng, 1000, 999, 600), U16)
    return files


LLAMA3_WRITTEN = "llama3:L=2,C=32,H=2,KV=1,F=64,V=300,T=64"  # head size 16: a shape the trainer trains


def write_llama3(work, descriptor, max_shard_bytes):
    """{name: bytes} of a random Llama folder written by llmc (build/host/write_llama3_random)."""
    writer = next((p for p in (os.path.join(REPO, "build", b, "write_llama3_random") for b in ("host", "host-asan"))
                   if os.access(p, os.X_OK)), None)
    if not writer:
        raise SystemExit("fuzz_loaders: build/host/write_llama3_random is not built (make build/host/write_llama3_random)")
    out = tempfile.mkdtemp(dir=work)
    subprocess.run([writer, out, descriptor, str(max_shard_bytes)], check=True, capture_output=True)
    return {n: read(os.path.join(out, n)) for n in sorted(os.listdir(out))}


def llama3_folder_base(rng, work):
    """An untied folder with Llama 3.1's RoPE scaling, and a tied one (mutate_llama3_folder picks)."""
    files = {"model/" + n: d for n, d in write_llama3(work, LLAMA3_WRITTEN + ",factor=8,orig=16", 1 << 30).items()}
    files.update({"tied/" + n: d for n, d in write_llama3(work, LLAMA3_WRITTEN + ",tied=1", 1 << 30).items()})
    files["train.bin"] = shard(documents(rng, 300, 299, 600), U32)
    return files


def llama3_sharded_base(rng, work):
    """Shards of at most 20000 bytes (4 of them) and their index."""
    files = {"model/" + n: d for n, d in write_llama3(work, LLAMA3_WRITTEN, 20000).items()}
    files["train.bin"] = shard(documents(rng, 300, 299, 600), U32)
    return files


def mutate_llama3_folder(rng, case):
    if rng.random() < 0.5:  # the tied folder instead
        for n in ("config.json", "model.safetensors"):
            os.replace(os.path.join(case, "tied", n), os.path.join(case, "model", n))
    return mutate_folder(rng, case, LLAMA3_KEYS, ["model.safetensors"])


def mutate_llama3_sharded(rng, case):
    shards = sorted(n for n in os.listdir(os.path.join(case, "model")) if n.endswith(".safetensors"))
    return mutate_folder(rng, case, LLAMA3_KEYS, shards)


def model_bin_base(rng, work):
    m3, m5 = (os.path.join(work, n) for n in ("m3.bin", "m5.bin"))
    for out, version in ((m3, "3"), (m5, "5")):
        subprocess.run([sys.executable, os.path.join(REPO, "dev", "import_hf.py"), GPT2_FOLDER, out, "--version",
                        version], check=True, capture_output=True)
    return {"model.bin": read(m3), "model5.bin": read(m5), "train.bin": shard(documents(rng, 1000, 999, 600), U16)}


def mutate_model_bin(rng, case):
    if rng.random() < 0.5:
        os.replace(os.path.join(case, "model5.bin"), os.path.join(case, "model.bin"))
    if rng.random() < 0.05:
        return mutate_kind(rng, case, "model.bin")
    return rewrite(case, "model.bin", lambda d: hf.mutate_model_file(rng, d))


GPT2_SMALL = "L=1,C=32,H=2,V=300,maxT=64"
LLAMA3_SMALL = "llama3:L=1,C=32,H=2,KV=1,F=64,V=300,T=64"


def step(*args, extra=()):
    """The trainer's arguments: args, then STEP's flags and extra's (flag, value pairs; an extra
    flag replaces STEP's)."""
    flags = dict(STEP)
    flags.update(zip(extra[::2], extra[1::2]))
    return list(args) + [x for f, v in flags.items() for x in (f, v)]


def shards_base(kind, V, doc):
    def base(rng, work):
        return {f"data/train_{k}.bin": shard(documents(rng, V, doc, rng.choice([200, 300])), kind) for k in range(2)}
    return base


def mutate_shards(V):
    def mutate(rng, case):
        flags = document_flags(rng, V)
        with open(os.path.join(case, "flags"), "w") as f:
            f.write(" ".join(flags))
        name = f"data/train_{rng.randrange(2)}.bin"
        if rng.random() < 0.05:
            return mutate_kind(rng, case, name) + f"; {' '.join(flags)}"
        return rewrite(case, name, lambda d: mutate_shard(rng, d, V)) + (f"; {' '.join(flags)}" if flags else "")
    return mutate


def case_flags(case):
    path = os.path.join(case, "flags")
    return read(path).decode().split() if os.path.exists(path) else []


def resume_base(rng, work, build):
    """A checkpoint of step 1 (train_gpt -o): its folder's files."""
    files = shards_base(U16, 300, 299)(rng, work)
    write_files(work, files)
    out = os.path.join(work, "run")
    r = subprocess.run([os.path.join(REPO, build, "train_gpt"), "-e", GPT2_SMALL, "-i", "data/train_*.bin", "-o", "run",
                        *step("-n", "1")], cwd=work, capture_output=True, text=True, env=run_env(build))
    if r.returncode != 0:
        raise SystemExit(f"fuzz_loaders: the resume loader's checkpoint run failed: {r.stderr.strip()[-300:]}")
    for n in sorted(os.listdir(out)):
        if n != "train.lock" and os.path.isfile(os.path.join(out, n)):
            files["run/" + n] = read(os.path.join(out, n))
    return files


def mutate_resume(rng, case):
    """One file of the checkpoint damaged; a damaged model or state file is vouched for by a
    rewritten DONE half of the time (so that its own checks, not the checksum's, are reached)."""
    names = sorted(os.listdir(os.path.join(case, "run")))
    name = "run/" + rng.choice([n for n in names if n.startswith("DONE")] + names)
    if rng.random() < 0.1:
        return mutate_kind(rng, case, name)
    what = mutate_checkpoint_file(rng, case, name)
    if not name.startswith("run/DONE") and rng.random() < 0.5:
        xxh64.rewrite_done(os.path.join(case, "run"), 1)
        what += ", its DONE rewritten to vouch for it"
    return what


def mutate_checkpoint_file(rng, case, name):
    if name.startswith("run/DONE"):
        def done(d):
            lines = d.split(b"\n")
            i = rng.randrange(len(lines))
            lines[i] = rng.choice([b"", b"x", lines[i] + b" 1", lines[i].replace(b"model", b"../model"),
                                   lines[i].replace(b"file ", b"file /etc/"), lines[i][:len(lines[i]) // 2],
                                   lines[i] + b"\r", b"file model_00000001.bin 18446744073709551615 0",
                                   b"\x1b[31m" * 10])
            return b"\n".join(lines), f"line {i + 1} = {lines[i][:40]!r}"
        return rewrite(case, name, done if rng.random() < 0.7 else lambda d: (hf.flip_bytes(rng, d, len(d)), "flips"))
    if name.startswith("run/state") and rng.random() < 0.6:
        def state(d):
            b = bytearray(d)
            slot = rng.choice([0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 16, rng.randrange(256)])
            value = rng.choice([0, 1, 2, -1, 2 ** 31 - 1, -2 ** 31, 100000, rng.randint(-2 ** 31, 2 ** 31 - 1)])
            b[slot * 4:slot * 4 + 4] = struct.pack("<i", value)
            return bytes(b), f"header[{slot}] = {value}"
        return rewrite(case, name, state)
    return rewrite(case, name, lambda d: (hf.flip_bytes(rng, d, 1024), "byte flips / truncation"))


RANKS = os.path.join(REPO, "test", "data", "tiktoken_test.ranks")
RANKS_TEXT = "Hello world, it's the tokenizer's text.\n\n  Numbers 12345 and caf\u00e9 \u4e2d\u6587!\n"


def ranks_base(rng, work):
    return {"ranks": read(RANKS), "input.txt": RANKS_TEXT.encode()}


def mutate_ranks(rng, case):
    """One change to a ranks file: a line duplicated, dropped, swapped, made odd; its rank or base64
    made bad; or byte flips and truncation; or the file's kind."""
    if rng.random() < 0.05:
        return mutate_kind(rng, case, "ranks")

    def lines(d):
        ls = d.split(b"\n")
        i, j = rng.randrange(len(ls)), rng.randrange(len(ls))
        token, _, rank = ls[i].partition(b" ")
        kind = rng.randrange(10)
        if kind == 0:
            ls.insert(j, ls[i])
        elif kind == 1:
            del ls[i]
        elif kind == 2:
            ls[i], ls[j] = ls[j], ls[i]
        elif kind == 3:
            ls[i] = token + b" " + str(rng.choice(ODD)).encode()
        elif kind == 4:
            ls[i] = rng.choice([b"!!!!", b"AA=", b"A", b"====", b"AAAA====", b"\xff\xfe", b"", b"A" * 10000]) + b" " + rank
        elif kind == 5:
            ls[i] = ls[i] + rng.choice([b"\r", b" 7", b"\t", b" "])
        elif kind == 6:
            ls[i] = ls[i].replace(b" ", rng.choice([b"\t", b"  ", b"", b"\x00"]))
        elif kind == 7:
            ls[i] = rank + b" " + token
        elif kind == 8:
            ls[i] = b"x" * rng.choice([4097, 100000])
        else:
            ls[i] = ls[j].split(b" ")[0] + b" " + rank  # a token twice, under two ranks
        return b"\n".join(ls), f"line {i + 1} (kind {kind})"
    if rng.random() < 0.8:
        return rewrite(case, "ranks", lines)
    return rewrite(case, "ranks", lambda d: (hf.flip_bytes(rng, d, len(d)), "byte flips / truncation"))


def host_program(build, name):
    """A data tool of the host build that matches build (ASan with ASan)."""
    return os.path.join("..", "host-asan" if "asan" in build else "host", name)


def loaders(build):
    return [
        Loader("gpt2-folder", "train_gpt", gpt2_folder_base,
               lambda rng, case: mutate_folder(rng, case, GPT2_KEYS, ["model.safetensors"]),
               lambda case: step("-e", "model", "-i", "train.bin")),
        Loader("llama3-folder", "train_llama3", llama3_folder_base, mutate_llama3_folder,
               lambda case: step("-e", "model", "-i", "train.bin")),
        Loader("llama3-sharded", "train_llama3", llama3_sharded_base, mutate_llama3_sharded,
               lambda case: step("-e", "model", "-i", "train.bin")),
        Loader("model-bin", "train_gpt", model_bin_base, mutate_model_bin,
               lambda case: step("-e", "model.bin", "-i", "train.bin")),
        Loader("shards-u16", "train_gpt", shards_base(U16, 300, 299), mutate_shards(300),
               lambda case: step("-e", GPT2_SMALL, "-i", "data/train_*.bin", extra=case_flags(case))),
        Loader("shards-u32", "train_llama3", shards_base(U32, 300, 299), mutate_shards(300),
               lambda case: step("-e", LLAMA3_SMALL, "-i", "data/train_*.bin", extra=case_flags(case))),
        Loader("resume", "train_gpt", lambda rng, work: resume_base(rng, work, build), mutate_resume,
               lambda case: step("-e", GPT2_SMALL, "-i", "data/train_*.bin", "-o", "run", "-y", "1", extra=["-x", "2"])),
        Loader("ranks", host_program(build, "prepro"), ranks_base, mutate_ranks,
               lambda case: ["--tiktoken", "ranks", "--out", "out/t", "--val-tokens", "0", "--threads", "1", "-q",
                             "input.txt"]),
    ]


# ---- running and judging -----------------------------------------------------------------
def run_env(build):
    env = dict(os.environ, CPUCUDA_DEVICE_MEMORY_MB="2048", CPUCUDA_WORKERS="1")
    if "asan" in build:
        env.update(ASAN_OPTIONS=ASAN_OPTIONS, UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    return env


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


SANITIZER = re.compile(r"Sanitizer|runtime error:|==\d+==")


def judge(rc, stderr):
    """-> ("accepted" | "refused", the error line) or (the finding, stderr's tail)."""
    lines = [line for line in stderr.split("\n") if line.strip()]
    tail = " | ".join(lines)[-400:]
    if rc is None:
        return "hang", tail
    if rc < 0:
        return f"signal {signal.Signals(-rc).name}", tail
    if any(SANITIZER.search(line) for line in lines):
        return "sanitizer report", tail
    # (warning lines may come first: a resume that falls back to an older checkpoint says why)
    other = [line for line in lines if not line.startswith("warning: ")]
    if rc == 0:
        return ("accepted", "") if not other else (f"exit 0 with {len(other)} stderr lines", tail)
    if rc != 1 or len(other) != 1 or not other[0].startswith("error: "):
        return f"exit {rc} with {len(other)} stderr lines", tail
    line = other[0]
    if re.search(r"out of (host |device )?memory", line):  # every model here is tiny: its size came from bad input
        return "out of memory (an attempt at a huge allocation)", line
    if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", line):
        return "control bytes in the error line", repr(line)
    return "refused", line


def run_case(command, case, env, build, guard):
    preexec = no_core if "asan" in build else limit_memory
    try:
        r = subprocess.run(command, cwd=case, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=guard, preexec_fn=preexec)
        return judge(r.returncode, r.stderr.decode("utf-8", "replace"))
    except subprocess.TimeoutExpired:
        return judge(None, "")


def save_finding(findings, loader, i, case, command, what, verdict, detail):
    """The case folder, its mutation and the command that reproduces it, under findings/."""
    dest = os.path.join(findings, f"{loader.name}-{i:05d}")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(case, dest, symlinks=True, ignore_dangling_symlinks=True,
                    ignore=lambda d, names: [n for n in names if n == "train.lock"])
    with open(os.path.join(dest, "FINDING.txt"), "w") as f:
        f.write(f"{verdict}\nmutation: {what}\nstderr: {detail}\nreproduce (in this folder):\n  "
                + " ".join(quote(a) for a in command) + "\n")
    return dest


def quote(arg):
    return arg if re.fullmatch(r"[\w./=,:+-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


def fuzz_loader(loader, args, build, work, rng_seed, findings):
    rng = random.Random(f"{rng_seed}:{loader.name}")
    base_dir = os.path.join(work, loader.name)
    os.makedirs(base_dir)
    base = loader.base(rng, base_dir)
    env = run_env(build)
    program = os.path.join(REPO, build, loader.program)
    counts = {"accepted": 0, "refused": 0, "findings": 0}
    messages = set()
    start = time.monotonic()
    i = 0
    while (i < args.runs) if args.runs else (time.monotonic() - start < args.seconds):
        case = os.path.join(work, f"{loader.name}.case")
        shutil.rmtree(case, ignore_errors=True)
        os.makedirs(case)
        write_files(case, base)
        what = loader.mutate(rng, case)
        command = ([sys.executable, os.path.abspath(__file__), "--planted-loader"] if args.plant else [program]) + \
            loader.args(case)
        verdict, detail = run_case(command, case, env, build, args.guard)
        if verdict in counts:
            counts[verdict] += 1
            if verdict == "refused":
                messages.add(re.sub(r"\d+", "N", detail))
            if args.verbose:
                print(f"  {loader.name} #{i} [{what}] {detail or 'accepted'}", flush=True)
        else:
            counts["findings"] += 1
            dest = save_finding(findings, loader, i, case, command, what, verdict, detail)
            print(f"  FINDING {loader.name} #{i}: {verdict} [{what}] {detail}\n    saved in {dest}", flush=True)
        i += 1
    shutil.rmtree(os.path.join(work, f"{loader.name}.case"), ignore_errors=True)
    print(f"fuzz_loaders: {loader.name}: {i} runs in {time.monotonic() - start:.0f} s: {counts['accepted']} accepted, "
          f"{counts['refused']} refused with one error line ({len(messages)} distinct), "
          f"{counts['findings']} findings", flush=True)
    return i, counts["findings"]


# ---- the planted loader (--plant) --------------------------------------------------------
def planted_loader(argv):
    """A stand-in trainer with two planted bugs, for checking the harness: a shard whose token
    count runs past its end is a segfault (no truncation check), a safetensors header length past
    the end a traceback; every other refusal is one error line, as a real loader's."""
    e = argv[argv.index("-e") + 1] if "-e" in argv else ""
    files = [os.path.join(e, "model.safetensors")] if os.path.isdir(e) else []
    import glob
    for path in files:
        data = read(path) if os.path.isfile(path) else b""
        if len(data) >= 8 and struct.unpack("<Q", data[:8])[0] > len(data) - 8:
            raise ValueError(f"{path}: the header runs past the end")  # the planted traceback
    for path in sorted(glob.glob(argv[argv.index("-i") + 1])):
        data = read(path) if os.path.isfile(path) else b""
        if len(data) < 1024 or struct.unpack("<i", data[:4])[0] not in (U16[0], U32[0]):
            sys.exit(print(f"error: {path}: not a token shard", file=sys.stderr) or 1)
        width = 2 if struct.unpack("<i", data[:4])[0] == U16[0] else 4
        if 1024 + struct.unpack("<i", data[8:12])[0] * width > len(data):
            os.kill(os.getpid(), signal.SIGSEGV)  # the planted crash
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--planted-loader":
        return planted_loader(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60, help="per loader (wall time; ignored with --runs)")
    ap.add_argument("--runs", type=int, default=0, help="cases per loader (deterministic)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loaders", default="", help="comma-separated names (default: every loader)")
    ap.add_argument("--build", default="", help="the trainers' folder (default: build/cpu-asan if built, else build/cpu)")
    ap.add_argument("--findings", default=os.path.join(REPO, "build", "fuzz_loaders", "findings"))
    ap.add_argument("--guard", type=float, default=120, help="seconds: a hang guard, no other verdict depends on time")
    ap.add_argument("--plant", action="store_true", help="run the planted loader instead of the trainers")
    ap.add_argument("--verbose", action="store_true", help="print every case and its verdict")
    args = ap.parse_args()
    build = args.build or ("build/cpu-asan" if all(os.access(os.path.join(REPO, "build/cpu-asan", p), os.X_OK)
                                                   for p in ("train_gpt", "train_llama3")) else "build/cpu")
    chosen = loaders(build)
    if args.loaders:
        names = args.loaders.split(",")
        unknown = set(names) - {ld.name for ld in chosen}
        if unknown:
            ap.error(f"unknown loaders {sorted(unknown)}; the loaders are {[ld.name for ld in chosen]}")
        chosen = [ld for ld in chosen if ld.name in names]
    for ld in chosen:
        if not args.plant and not os.access(os.path.join(REPO, build, ld.program), os.X_OK):
            ap.error(f"{build}/{ld.program} is not built (make {build}/{ld.program})")
    print(f"fuzz_loaders: {build}{' (planted loader)' if args.plant else ''}, seed {args.seed}, "
          + (f"{args.runs} runs" if args.runs else f"{args.seconds:g} s") + " per loader", flush=True)
    work = tempfile.mkdtemp(prefix="fuzz_loaders.")
    total_runs = total_findings = 0
    try:
        for ld in chosen:
            runs, findings = fuzz_loader(ld, args, build, work, args.seed, args.findings)
            total_runs += runs
            total_findings += findings
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"fuzz_loaders: {total_runs} runs over {len(chosen)} loaders, {total_findings} findings", flush=True)
    return 1 if total_findings else 0


if __name__ == "__main__":
    sys.exit(main())
