#!/usr/bin/env python3
"""A bounded, deterministic fuzzer of dev/import_hf.py and dev/export_hf.py: the committed
fixture (test/ref/hf_tiny) and its imports, mutated: bit flips and truncations of
model.safetensors and of model files, safetensors header JSON mutations (dtypes, shapes,
data_offsets, names, the header length), config.json mutations (missing keys, wrong types,
sizes out of range, broken JSON), NaN and infinity weights; and every kind of file in the
wrong place (a FIFO, a folder, a device as an input; a symlink, FIFO, device or folder at
the output path).

Each run must end by itself with exit 0 and an output whose weights are all finite, or with
exit 1 and exactly one stderr line starting "error: " (not an internal error); what sat at a
refused output path is untouched, and no temporary is left behind. Anything else, or running
past the hang guard, is a finding: printed with its case, counted, exit status 1.

Usage: dev/fuzz_hf.py [--cases N] [--seed S] [--guard SECONDS] [--dev DIR]
       (defaults: 200 random cases after the fixed file-kind cases, seed 1, guard 60 s,
       the scripts of dev/; --dev DIR runs another copy of import_hf.py / export_hf.py)
"""
import argparse
import json
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

import numpy as np

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "ref", "hf_tiny")
OUT = "out.bin"  # an import's output, in the case's folder
EXPORT_OUT = "export"  # an export's output folder, in the case's folder


# ---- what a run must leave ---------------------------------------------------------------
def finite_model_file(path):
    data = open(path, "rb").read()
    h = np.frombuffer(data[:1024], "<i4")
    bits = np.frombuffer(data, "<u4" if h[1] == 3 else "<u2", offset=1024)
    exponent = 0x7F800000 if h[1] == 3 else 0x7F80
    return len(data) > 1024 and h[0] == 20240326 and not np.any(bits & exponent == exponent)


def finite_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    for name, spec in json.loads(data[8:8 + n]).items():
        if name == "__metadata__":
            continue
        b, e = spec["data_offsets"]
        dtype, exponent = {"F32": ("<u4", 0x7F800000), "BF16": ("<u2", 0x7F80)}[spec["dtype"]]
        if np.any(np.frombuffer(data[8 + n + b:8 + n + e], dtype) & exponent == exponent):
            return False
    return True


def temporaries(case):
    """The *.tmp files in the case's output folders."""
    found = set()
    for folder in (case.folder, os.path.join(case.folder, EXPORT_OUT)):
        if os.path.isdir(folder) and not os.path.islink(folder):
            found |= {os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".tmp")}
    return found


def snapshot(path):
    """What sits at path (not following a symlink), to compare after a refusal."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISREG(st.st_mode):
        return ("file", open(path, "rb").read())
    if stat.S_ISDIR(st.st_mode):
        return ("folder", sorted(os.listdir(path)))
    return ("node", stat.S_IFMT(st.st_mode), st.st_rdev)


# ---- the fixture and its mutations -------------------------------------------------------
def read(path):
    with open(path, "rb") as f:
        return f.read()


def split_safetensors(data):
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def join_safetensors(header_text, body, length=None):
    h = header_text.encode() if isinstance(header_text, str) else header_text
    return struct.pack("<Q", len(h) if length is None else length) + h + body


def flip_bytes(rng, data, header_bytes):
    d = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.2 and len(d) > 1:
            d = d[:rng.randrange(len(d))]
        elif rng.random() < 0.1:
            d += bytes(rng.randrange(256) for _ in range(rng.choice([1, 4, 8, 100])))
        elif d:
            i = rng.randrange(min(len(d), header_bytes) if rng.random() < 0.7 else len(d))
            d[i] ^= 1 << rng.randrange(8)
    return bytes(d)


ODD = [-1, 0, 1, 3, 2 ** 31, 2 ** 63, 10 ** 30, -(2 ** 63), 1.5, "4", True, None, [], {}, [1, 2, 3], "x"]


def mutate_spec(rng, header, names):
    """One change to one tensor's entry (or to the set of entries)."""
    name = rng.choice(names)
    spec = header[name]
    what = rng.choice(["dtype", "shape", "offsets", "offsets", "overlap", "delete", "add", "spec", "metadata"])
    if what == "dtype":
        spec["dtype"] = rng.choice(["F16", "BF16", "F64", "I32", "U8", "f32", "", None, 3])
    elif what == "shape":
        shape = list(spec["shape"])
        i = rng.randrange(len(shape))
        choice = rng.random()
        if choice < 0.3:
            shape[i] = rng.choice(ODD)
        elif choice < 0.6:
            shape[i] += rng.choice([-1, 1, shape[i]])
        else:
            shape = rng.choice([shape[::-1], shape + [1], shape[:-1], [], [0], shape * 2])
        spec["shape"] = shape
    elif what == "offsets":
        b, e = spec["data_offsets"]
        spec["data_offsets"] = rng.choice([[b + 4, e + 4], [e, b], [b - 4, e - 4], [b, e + 4], [rng.choice(ODD), e],
                                           [b, rng.choice(ODD)], [b], [b, e, e], "0-4", [-4, e - b - 4],
                                           [b + 2 ** 40, e + 2 ** 40]])
    elif what == "overlap":
        other = header[rng.choice(names)]
        spec["data_offsets"] = list(other["data_offsets"])
        spec["shape"], spec["dtype"] = list(other["shape"]), other["dtype"]
    elif what == "delete":
        del header[name]
    elif what == "add":
        header[rng.choice(["transformer.h.2.ln_1.weight", "lm_head.bias", "x", name.replace("transformer.", "")])] = \
            dict(spec)
    elif what == "spec":
        header[name] = rng.choice(ODD)
    else:
        header["__metadata__"] = rng.choice([{"format": 1}, [], "pt", None, {"a": {"b": 1}}])
    return f"{what} of {name}"


def mutate_header(rng, data):
    """-> (mutated safetensors bytes, what was done)."""
    header, body = split_safetensors(data)
    names = [n for n in header if n != "__metadata__"]
    choice = rng.random()
    if choice < 0.6:
        what = mutate_spec(rng, header, names)
        return join_safetensors(json.dumps(header), body), what
    text = json.dumps(header)
    if choice < 0.7:
        length = rng.choice([0, 1, len(text) - 1, len(text) + 1, len(text) + len(body), 2 ** 63, 2 ** 64 - 1])
        return join_safetensors(text, body, length), f"header length {length}"
    if choice < 0.8:
        dup = names[rng.randrange(len(names))]
        text = "{" + json.dumps(dup) + ":" + json.dumps(header[dup]) + "," + text[1:]
        return join_safetensors(text, body), f"{dup} twice"
    replacement = rng.choice([b"[]", b"1", b'"x"', b"[" * 50000, b"{", text[:len(text) // 2].encode(), b"\xff\xfe",
                              text.replace("{", '{"\\ud800":1,', 1).encode()])
    return join_safetensors(replacement, body), f"header text {replacement[:20]!r}"


def poison_weight(rng, data):
    """One weight of a safetensors file set to NaN, an infinity or (fp32) beyond bf16's range."""
    header, _ = split_safetensors(data)
    (n,) = struct.unpack("<Q", data[:8])
    name = rng.choice([k for k in header if k != "__metadata__"])
    b, e = header[name]["data_offsets"]
    if header[name]["dtype"] == "F32":
        size, value = 4, rng.choice([float("nan"), float("inf"), -float("inf"), 3.4e38])
        raw = struct.pack("<f", value)
    else:  # BF16 bits: +inf, -inf, NaN
        size, value = 2, rng.choice([0x7F80, 0xFF80, 0x7FC0])
        raw = struct.pack("<H", value)
    at = 8 + n + b + rng.randrange((e - b) // size) * size
    return data[:at] + raw + data[at + size:], f"{value!r} in {name}"


def mutate_config(rng, text):
    """-> (config.json bytes, what was done)."""
    conf = json.loads(text)
    choice = rng.random()
    if choice < 0.25:
        key = rng.choice(["n_embd", "n_layer", "n_head", "vocab_size", "n_positions", "model_type"])
        conf.pop(key, None)
        return json.dumps(conf).encode(), f"no {key}"
    if choice < 0.85:
        key = rng.choice(["n_embd", "n_layer", "n_head", "vocab_size", "n_positions", "n_inner",
                          "layer_norm_epsilon", "activation_function", "tie_word_embeddings",
                          "scale_attn_weights", "model_type"])
        conf[key] = rng.choice(ODD + [float("nan"), float("inf"), 1e-5, 2 ** 24, 2 ** 24 + 1, 4097, 63, 256])
        return json.dumps(conf).encode(), f"{key} = {conf[key]!r}"
    garbage = rng.choice([b"", b"[]", b"null", b"{", text[:len(text) // 2].encode(), b"[" * 50000, b"\xff",
                          b"1" * 5000])
    return garbage, f"config text {garbage[:20]!r}"


def mutate_model_file(rng, data):
    """A model file's header fields, bit flips, truncation or a NaN weight."""
    d = bytearray(data)
    choice = rng.random()
    if choice < 0.4:
        field = rng.randrange(8)
        value = rng.choice([0, -1, 1, 2, 3, 4, 5, 64, 1 << 24, (1 << 24) + 1, 2 ** 31 - 1, -2 ** 31,
                            rng.randint(-2 ** 31, 2 ** 31 - 1)])
        d[field * 4:field * 4 + 4] = struct.pack("<i", value)
        return bytes(d), f"header field {field} = {value}"
    if choice < 0.7:
        version = struct.unpack("<i", data[4:8])[0]
        size = 4 if version == 3 else 2
        at = 1024 + rng.randrange((len(data) - 1024) // size) * size
        d[at:at + size] = struct.pack("<f", float("nan")) if size == 4 else struct.pack("<H", 0x7FC0)
        return bytes(d), f"NaN at byte {at}"
    return flip_bytes(rng, data, 1024), "bit flips / truncation"


# ---- cases ---------------------------------------------------------------------------------
class Case:
    """A folder with the inputs of one run, the run's arguments, and what must not change."""

    def __init__(self, folder, label, script, args, guarded=()):
        self.folder, self.label, self.script, self.args, self.guarded = folder, label, script, args, guarded
        self.victim = os.path.join(folder, "victim")  # what a planted symlink points at


def import_case(work, i, label, files, out_args=()):
    folder = os.path.join(work, f"c{i}")
    src = os.path.join(folder, "src")
    os.makedirs(src)
    for name, data in files.items():
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
    return Case(folder, label, "import_hf.py", [src, os.path.join(folder, OUT), *out_args])


def export_case(work, i, label, model):
    folder = os.path.join(work, f"c{i}")
    os.makedirs(folder)
    with open(os.path.join(folder, "model.bin"), "wb") as f:
        f.write(model)
    return Case(folder, label, "export_hf.py", [os.path.join(folder, "model.bin"), os.path.join(folder, EXPORT_OUT)])


def random_case(rng, work, i, bases):
    target = rng.choice(["bytes", "header", "header", "weights", "config", "model file", "model file"])
    conf, st = rng.choice([bases["f32"], bases["bf16"]])
    version = rng.choice([["--version", "3"], ["--version", "5"], []])
    if target == "bytes":
        n = struct.unpack("<Q", st[:8])[0]
        return import_case(work, i, "safetensors bit flips", {"config.json": conf, "model.safetensors":
                                                              flip_bytes(rng, st, 8 + n + 64)}, version)
    if target == "header":
        st, what = mutate_header(rng, st)
        return import_case(work, i, f"safetensors header: {what}", {"config.json": conf, "model.safetensors": st}, version)
    if target == "weights":
        st, what = poison_weight(rng, st)
        return import_case(work, i, what, {"config.json": conf, "model.safetensors": st}, version)
    if target == "config":
        text, what = mutate_config(rng, conf.decode())
        return import_case(work, i, f"config.json: {what}", {"config.json": text, "model.safetensors": st}, version)
    model, what = mutate_model_file(rng, rng.choice([bases["m3"], bases["m5"]]))
    return export_case(work, i, f"model file: {what}", model)


def kind_cases(work, bases):
    """Every kind of file in the wrong place, once each."""
    conf, st = bases["f32"]
    good = {"config.json": conf, "model.safetensors": st}
    cases = []

    def new(maker, label, *a):
        case = maker(work, f"k{len(cases)}", label, *a)
        cases.append(case)
        return case
    for name in ("config.json", "model.safetensors"):
        for kind in ("fifo", "folder", "device", "dangling symlink"):
            case = new(import_case, f"{name} is a {kind}", good)
            plant(os.path.join(case.args[0], name), kind, case.victim)
    for kind in ("fifo", "folder", "device"):
        case = new(export_case, f"the model file is a {kind}", bases["m3"])
        plant(case.args[0], kind, case.victim)
    for kind in ("symlink", "fifo", "folder", "device", "dangling symlink"):
        case = new(import_case, f"the output path is a {kind}", good)
        plant(case.args[1], kind, case.victim)
        case.guarded = [case.args[1], case.victim]
    case = new(import_case, "the output path + .tmp is a symlink", good)
    plant(case.args[1] + ".tmp", "symlink", case.victim)
    case.guarded = [case.victim]
    for kind in ("symlink", "fifo", "device"):
        case = new(export_case, f"the output folder's model.safetensors is a {kind}", bases["m3"])
        os.makedirs(case.args[1])
        plant(os.path.join(case.args[1], "model.safetensors"), kind, case.victim)
        case.guarded = [case.args[1], os.path.join(case.args[1], "model.safetensors"), case.victim]
    for kind in ("symlink to a folder", "regular file"):
        case = new(export_case, f"the output folder is a {kind}", bases["m3"])
        plant(case.args[1], kind, case.victim)
        case.guarded = [case.args[1], case.victim]
    return cases


def plant(path, kind, victim):
    """Puts a kind of file at path (replacing what is there); a symlink points at victim (a
    file, or a folder), whose content must survive."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        os.mkdir(path)
    elif kind == "device":
        make_device(path)
    elif kind == "dangling symlink":
        os.symlink(victim + ".nowhere", path)
    elif kind == "symlink":
        with open(victim, "wb") as f:
            f.write(b"the victim's content\n")
        os.symlink(victim, path)
    elif kind == "symlink to a folder":
        os.makedirs(victim, exist_ok=True)
        os.symlink(victim, path)
    else:
        with open(path, "wb") as f:
            f.write(b"a regular file\n")


def make_device(path):
    """A character device like /dev/null (1, 3) where allowed (root), else a symlink to /dev/null."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        os.symlink("/dev/null", path)


# ---- running and judging ---------------------------------------------------------------
def last_lines(text, n=300):
    return " | ".join(text.strip().splitlines())[-n:]


def judge(case, dev, guard):
    """-> ("ok", the error line or "" for a success), or (what is wrong, stderr's tail)."""
    before, planted = {p: snapshot(p) for p in case.guarded}, temporaries(case)
    try:
        r = subprocess.run([sys.executable, os.path.join(dev, case.script), *case.args], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, errors="replace", timeout=guard)
    except subprocess.TimeoutExpired:
        return "hang", ""
    lines = r.stderr.strip().splitlines()
    if any(snapshot(p) != s for p, s in before.items()):
        return "changed a guarded path", last_lines(r.stderr)
    if temporaries(case) - planted:
        return "temporary left behind", " ".join(sorted(temporaries(case) - planted))
    if r.returncode == 0:
        return ("ok", "") if accepted_output_finite(case) else ("exit 0 with a non-finite output", "")
    if r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0]:
        return "ok", lines[0]
    return f"exit {r.returncode}, {len(lines)} stderr lines", last_lines(r.stderr)


def accepted_output_finite(case):
    try:
        if case.script == "import_hf.py":
            return finite_model_file(case.args[1])
        return finite_safetensors(os.path.join(case.args[1], "model.safetensors"))
    except (OSError, ValueError, KeyError, IndexError, struct.error):
        return False


def make_bases(work, dev):
    """The fixture (fp32) and its bf16 export, each as (config.json, model.safetensors) bytes;
    the fixture imported as version 3 and 5 model files."""
    bases = {"f32": (read(os.path.join(FIXTURE, "config.json")), read(os.path.join(FIXTURE, "model.safetensors")))}
    m3, m5, e16 = (os.path.join(work, n) for n in ("base3.bin", "base5.bin", "base_bf16"))
    for args in ([FIXTURE, m3], [FIXTURE, m5, "--version", "5"]):
        subprocess.run([sys.executable, os.path.join(dev, "import_hf.py"), *args], check=True, capture_output=True)
    subprocess.run([sys.executable, os.path.join(dev, "export_hf.py"), m5, e16], check=True, capture_output=True)
    bases["bf16"] = (read(os.path.join(e16, "config.json")), read(os.path.join(e16, "model.safetensors")))
    bases["m3"], bases["m5"] = read(m3), read(m5)
    return bases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--guard", type=float, default=60, help="seconds: a hang guard, no verdict depends on time")
    ap.add_argument("--dev", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--verbose", action="store_true", help="print every case and its verdict")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="fuzz_hf.")
    try:
        bases = make_bases(work, args.dev)
        counts = {"refused": 0, "accepted": 0, "findings": 0}
        cases = kind_cases(work, bases)
        runs = 0
        for i in range(len(cases) + args.cases):
            case = cases[i] if i < len(cases) else random_case(rng, work, i, bases)
            verdict, detail = judge(case, args.dev, args.guard)
            runs += 1
            if verdict != "ok":
                counts["findings"] += 1
                print(f"  {verdict}: {case.script} [{case.label}] {detail}", flush=True)
            else:
                counts["refused" if detail else "accepted"] += 1
                if args.verbose:
                    print(f"  {case.script} [{case.label}] {detail or 'accepted'}", flush=True)
            shutil.rmtree(case.folder, ignore_errors=True)
        print(f"fuzz_hf: {runs} runs ({len(cases)} file kinds, {args.cases} random, seed {args.seed}): "
              f"{counts['accepted']} accepted, {counts['refused']} refused with one error line, "
              f"{counts['findings']} findings", flush=True)
        return 1 if counts["findings"] else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
