#!/usr/bin/env python3
"""From and to transformers, against the committed fixture test/ref/hf_tiny (a random tiny
GPT-2 saved by transformers, with one batch's logits, loss and gradients from transformers;
dev/make_hf_fixture.py):
  (a) dev/import_hf.py -> the trainer's forward and backward (fp32 build, test_gpt2
      --debug-case) give transformers' logits, loss and gradients within 1e-5 (max error
      over the tensor's max); the bf16 build within its bounds (test_gpt2.cu's);
  (b) export -> import is bitwise the identity on the fp32 model file (and on the bf16 one);
  (c) the exported tensors are bitwise the fixture's (read with the safetensors package);
  the trainer fine-tunes the import (-e, a few steps on the built-in corpus) and its
  checkpoint exports;
  (d) -e FOLDER reads a transformers folder directly (train_gpt.cu, llmc/formats/hf_model.h): the
  weights bitwise those of import_hf.py's file of the same folder, for F32, BF16 and F16
  tensors, the hub's layout (no "transformer." prefix, mask buffers, a tied
  lm_head.weight) and 2 shards with their index; fine-tuning it gives the import's losses exactly; a folder with a wrong
  shape, a missing, extra or F64 tensor, an untied head, an unsupported config.json key or
  Llama's config is refused with one error line naming it;
and bad input: one `error:` line, exit 1: malformed files (NaN weights, n_head -1, overlapping
tensors...), a FIFO or device as an input (refused without blocking), a symlink, FIFO or
device at the output path (refused, left as it was; a symlink planted at a temporary's
name is not followed); dev/fuzz_hf.py's short deterministic run. Needs numpy and
safetensors (no torch); skips without them.

Usage: test/trainer/test_hf.py [FP32_TEST_GPT2 [BF16_TEST_GPT2 [TRAIN_GPT]]]
       (default build/cpu-fp32/test_gpt2 build/cpu/test_gpt2 build/cpu/train_gpt)
"""
import hashlib
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # test/checks.py
from checks import Checks  # noqa: E402

DEFAULT_BINS = ["build/cpu-fp32/test_gpt2", "build/cpu/test_gpt2", "build/cpu/train_gpt"]
BINS = sys.argv[1:4] + DEFAULT_BINS[len(sys.argv[1:4]):]
FIXTURE = "test/ref/hf_tiny"
check = Checks()


def done():
    check.tally("test_hf")
    sys.exit(0)


try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file
except ImportError as e:
    print(f"SKIP transformers import/export tests: {e.name} is not installed (pip install numpy safetensors)")
    done()


# seconds: a hang guard only (a FIFO input used to block forever), scaled as run_tests.sh scales every
# guard; long enough that a busy machine never reaches it, so no verdict depends on time
GUARD = 300 * int(os.environ.get("TEST_TIMEOUT_SCALE", "1"))


class Hung:
    returncode, stdout, stderr = None, "", "(still running after the hang guard)"


def tool(script, *args):
    try:
        return subprocess.run([sys.executable, f"dev/{script}", *args], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=GUARD)
    except subprocess.TimeoutExpired:
        return Hung()


def read(path):
    with open(path, "rb") as f:
        return f.read()


def one_error_line(r):
    lines = r.stderr.strip().splitlines()
    return r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ")


def copy_fixture(name):
    folder = os.path.join(tmp, name)
    shutil.copytree(FIXTURE, folder)
    return folder


def edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    conf = json.load(open(path))
    conf.update(changes)
    json.dump(conf, open(path, "w"))


def edit_safetensors(folder, edit):
    """edit(header dict, data bytearray after the header) changes model.safetensors in place."""
    path = os.path.join(folder, "model.safetensors")
    raw = read(path)
    (n,) = struct.unpack("<Q", raw[:8])
    header, body = json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])
    edit(header, body)
    h = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + bytes(body))


def refused(label, r, *words):
    """The run ended with one error line naming each of words."""
    check(f"{label}: {r.stderr.strip()}", one_error_line(r) and all(w in r.stderr for w in words))


def kind(path):
    """What is at path, not following a symlink: its type, and a file's bytes or a link's target."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return ("symlink", os.readlink(path))
    return (stat.S_IFMT(st.st_mode), read(path) if stat.S_ISREG(st.st_mode) else st.st_rdev)


def device_or_none(path):
    """A character device like /dev/null at path (mknod: root only), or None."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return path
    except OSError:
        return None


def malformed_inputs(model):
    """Inputs the scripts accepted (NaN, n_head -1, overlapping tensors) or ended in a traceback on."""
    out = os.path.join(tmp, "malformed.bin")

    def nan_weight(header, body):
        b = header["transformer.h.0.mlp.c_fc.weight"]["data_offsets"][0]
        body[b + 40:b + 44] = struct.pack("<f", float("nan"))

    def overlap(header, body):  # ln_1.weight read from ln_1.bias's bytes (same shape)
        header["transformer.h.0.ln_1.weight"]["data_offsets"] = header["transformer.h.0.ln_1.bias"]["data_offsets"]

    def no_offsets(header, body):
        del header["transformer.wpe.weight"]["data_offsets"]

    def wrong_shape(header, body):
        header["transformer.ln_f.bias"]["shape"] = [65]
    for label, edit, words in [("a NaN weight", nan_weight, ["non-finite", "c_fc"]),
                               ("overlapping tensors", overlap, ["overlaps"]),
                               ("a tensor without data_offsets", no_offsets, ["data_offsets"]),
                               ("a shape that does not match data_offsets", wrong_shape, ["shape [65]"])]:
        folder = copy_fixture(label.replace(" ", "_"))
        edit_safetensors(folder, edit)
        refused(f"import of a model.safetensors with {label}", tool("import_hf.py", folder, out), *words)
    for label, changes, words in [("n_head -1", {"n_head": -1}, ["n_head -1"]),
                                  ("n_head null", {"n_head": None}, ["n_head"]),
                                  ("n_embd 64.5", {"n_embd": 64.5}, ["n_embd"])]:
        folder = copy_fixture(label.replace(" ", "_"))
        edit_config(folder, **changes)
        refused(f"import with {label} in config.json", tool("import_hf.py", folder, out), *words)
    folder = copy_fixture("config_array")
    open(os.path.join(folder, "config.json"), "w").write("[]")
    refused("import with a config.json that is a JSON array", tool("import_hf.py", folder, out), "array")
    check("no model file written by any of the refused imports", not os.path.lexists(out))
    nan_model = os.path.join(tmp, "nan.bin")
    data = bytearray(read(model))
    data[1024 + 4 * 100:1024 + 4 * 101] = struct.pack("<f", float("inf"))
    open(nan_model, "wb").write(bytes(data))
    refused("export of a model file with an infinite weight", tool("export_hf.py", nan_model, os.path.join(tmp, "z")),
            "non-finite", "wte")
    check("no folder made by the refused export", not os.path.lexists(os.path.join(tmp, "z")))


def non_regular_files(model, exported):
    """A FIFO as an input is refused without waiting for a writer; a symlink, FIFO or device at
    the output path is refused and left as it was; a regular output is replaced."""
    folder = copy_fixture("fifo_config")
    os.unlink(os.path.join(folder, "config.json"))
    os.mkfifo(os.path.join(folder, "config.json"))
    refused("import with config.json a FIFO (no writer)", tool("import_hf.py", folder, os.path.join(tmp, "f.bin")),
            "FIFO")
    fifo_model = os.path.join(tmp, "fifo_model.bin")
    os.mkfifo(fifo_model)
    refused("export of a FIFO model file (no writer)", tool("export_hf.py", fifo_model, os.path.join(tmp, "f")), "FIFO")

    victim = os.path.join(tmp, "victim")
    open(victim, "wb").write(b"victim\n")
    link = os.path.join(tmp, "link.bin")
    os.symlink(victim, link)
    r = tool("import_hf.py", FIXTURE, link)
    check(f"import to a symlink at the output path: refused, the link and its target untouched ({r.stderr.strip()})",
          one_error_line(r) and kind(link) == ("symlink", victim) and read(victim) == b"victim\n")
    fifo_out = os.path.join(tmp, "out.fifo")
    os.mkfifo(fifo_out)
    r = tool("import_hf.py", FIXTURE, fifo_out)
    check(f"import to a FIFO at the output path: refused, still a FIFO ({r.stderr.strip()})",
          one_error_line(r) and kind(fifo_out) == (stat.S_IFIFO, 0))
    device = device_or_none(os.path.join(tmp, "null"))
    if device is None:
        print("SKIP import to a character device at the output path: mknod needs root")
    else:
        r = tool("import_hf.py", FIXTURE, device)
        check(f"import to a character device (1, 3: /dev/null's) at the output path: refused, still that device "
              f"({r.stderr.strip()})", one_error_line(r) and kind(device) == (stat.S_IFCHR, os.makedev(1, 3)))
    planted = os.path.join(tmp, "planted.bin")
    os.symlink(victim, planted + ".tmp")
    r = tool("import_hf.py", FIXTURE, planted)
    left = [n for n in os.listdir(tmp) if n.endswith(".tmp") and n != "planted.bin.tmp"]
    check(f"import with a symlink planted at OUT.tmp: written, the link's target untouched, no temporary left "
          f"({r.stdout.strip() or r.stderr.strip()})",
          r.returncode == 0 and read(planted) == read(model) and read(victim) == b"victim\n" and not left)

    out_dir = os.path.join(tmp, "export_link")
    os.makedirs(out_dir)
    os.symlink(victim, os.path.join(out_dir, "model.safetensors"))
    r = tool("export_hf.py", model, out_dir)
    check(f"export into a folder whose model.safetensors is a symlink: refused, nothing written, the target untouched "
          f"({r.stderr.strip()})", one_error_line(r) and os.listdir(out_dir) == ["model.safetensors"] and
          read(victim) == b"victim\n")
    open(os.path.join(exported, "config.json"), "w").write("{}")
    r = tool("export_hf.py", model, exported)
    check("export into an existing export folder replaces its regular files",
          r.returncode == 0 and json.load(open(os.path.join(exported, "config.json"))).get("n_embd") == 64)
    r = tool("import_hf.py", FIXTURE, victim)
    check("import over an existing regular file replaces it", r.returncode == 0 and read(victim) == read(model))


def train_losses(init, out_dir):
    """The train losses of 4 steps of train_gpt -e init (-a 1: one batch overfitted), and the run."""
    r = subprocess.run([BINS[2], "-e", init, "-t", "32", "-b", "4", "-x", "4", "-v", "0", "-a", "1", "-l", "1e-3", "-u", "0",
                        "-o", out_dir], capture_output=True, text=True)
    return [float(line.split("| loss ")[1].split()[0]) for line in r.stdout.splitlines() if "| loss " in line], r


def same_weights(folder, model):
    """test_gpt2 --same-weights: the folder and the model file load bitwise the same weights."""
    r = subprocess.run([BINS[0], "--same-weights", folder, model], capture_output=True, text=True)
    return r.returncode == 0 and "test_gpt2: 1 passed, 0 failed" in r.stdout, (r.stdout + r.stderr).strip()


def folder_variants():
    """The fixture's weights as a BF16 folder, and as an F16 folder in the hub's layout: names
    without "transformer.", the attention mask buffers, lm_head.weight tied to wte."""
    sys.path.insert(0, "dev")
    import hf_gpt2 as hf
    from safetensors.numpy import save_file
    fixture = load_file(os.path.join(FIXTURE, "model.safetensors"))
    bf16 = copy_fixture("direct_bf16")
    os.unlink(os.path.join(bf16, "model.safetensors"))
    hf.write_safetensors(os.path.join(bf16, "model.safetensors"), fixture, bf16=True)
    hub = {k[len("transformer."):]: v.astype(np.float16) for k, v in fixture.items()}
    for layer in range(2):
        hub[f"h.{layer}.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float16))
    hub["lm_head.weight"] = hub["wte.weight"].copy()
    f16 = copy_fixture("direct_f16_hub")
    os.unlink(os.path.join(f16, "model.safetensors"))
    save_file(hub, os.path.join(f16, "model.safetensors"))
    shards = copy_fixture("direct_shards")
    os.unlink(os.path.join(shards, "model.safetensors"))
    names = sorted(fixture)
    weight_map = {}
    for k, part in enumerate((names[:len(names) // 2], names[len(names) // 2:])):
        shard = f"model-0000{k + 1}-of-00002.safetensors"
        save_file({n: fixture[n] for n in part}, os.path.join(shards, shard))
        weight_map.update({n: shard for n in part})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(shards, "model.safetensors.index.json"), "w"))
    return {"F32 (the fixture)": FIXTURE, "BF16": bf16, "F16, the hub's layout": f16, "F32 in 2 shards": shards}, fixture


def direct_folders(m3):
    """(d): -e FOLDER against import_hf.py's file of the same folder, and bad folders."""
    from safetensors.numpy import save_file
    variants, fixture = folder_variants()
    for label, folder in variants.items():
        out = os.path.join(tmp, "direct.bin")
        # (import_hf.py reads one model.safetensors: the shards are compared with the fixture's import)
        r = tool("import_hf.py", FIXTURE if "shards" in label else folder, out)
        ok, said = same_weights(folder, out) if r.returncode == 0 else (False, r.stderr.strip())
        check(f"-e FOLDER, {label}: the weights bitwise import_hf.py's ({said.splitlines()[-2] if ok else said})", ok)
    losses_bin, _ = train_losses(m3, os.path.join(tmp, "run_bin"))
    losses_dir, r = train_losses(FIXTURE, os.path.join(tmp, "run_folder"))
    check(f"{BINS[2]} -e {FIXTURE} fine-tunes with the import's train losses exactly: {losses_dir} (exit {r.returncode})",
          r.returncode == 0 and len(losses_dir) == 4 and losses_dir == losses_bin)

    def rewritten(name, change):
        """A copy of the fixture whose model.safetensors holds change(the fixture's tensors)."""
        folder = copy_fixture(name)
        os.unlink(os.path.join(folder, "model.safetensors"))
        save_file(change(dict(fixture)), os.path.join(folder, "model.safetensors"))
        return folder

    def configured(name, **changes):
        folder = copy_fixture(name)
        edit_config(folder, **changes)
        return folder
    p = "transformer."
    bad = [
        ("a Conv1D matrix stored (out, in)", rewritten("d_shape", lambda t: {
            **t, p + "h.1.mlp.c_fc.weight": np.ascontiguousarray(t[p + "h.1.mlp.c_fc.weight"].T)}),
         ["h.1.mlp.c_fc.weight has the shape [256, 64], config.json gives [64, 256]"]),
        ("a missing tensor", rewritten("d_missing", lambda t: {k: v for k, v in t.items() if k != p + "ln_f.bias"}),
         ["transformer.ln_f.bias is missing"]),
        ("a layer past n_layer", rewritten("d_extra", lambda t: {**t, p + "h.2.ln_1.weight": t[p + "h.1.ln_1.weight"]}),
         ["transformer.h.2.ln_1.weight", "not one of this model's"]),
        ("an F64 tensor", rewritten("d_f64", lambda t: {**t, p + "wpe.weight": t[p + "wpe.weight"].astype(np.float64)}),
         ["wpe.weight is F64"]),
        ("an untied lm_head.weight", rewritten("d_untied", lambda t: {**t, "lm_head.weight": t[p + "wte.weight"] + 1}),
         ["lm_head.weight differs"]),
        ("scale_attn_by_inverse_layer_idx", configured("d_scale", scale_attn_by_inverse_layer_idx=True),
         ["scale_attn_by_inverse_layer_idx true is not supported"]),
        ("add_cross_attention", configured("d_cross", add_cross_attention=True), ["add_cross_attention true"]),
        ("activation relu", configured("d_relu", activation_function="relu"), ['activation_function "relu"']),
        ("an activation of two lines (quoted, one error line)", configured("d_act2", activation_function="two\nlines"),
         ['activation_function "two\\x0alines"']),
        ("n_head 5", configured("d_heads", n_head=5), ["n_embd 64 is not a multiple of n_head 5"]),
        ("n_inner 100", configured("d_inner", n_inner=100), ["n_inner 100"]),
        ("n_layer missing", configured("d_layers", n_layer=None), ["n_layer is missing"]),
        ("a Llama folder", "test/ref/llama3_hf_tiny/tied", ['model_type is "llama"', "train_llama3"]),
        ("no config.json", rewritten("d_no_config", lambda t: t), ["config.json: cannot read"]),
    ]
    os.unlink(os.path.join(tmp, "d_no_config", "config.json"))
    for label, folder, words in bad:
        r = subprocess.run([BINS[2], "-e", folder, "-t", "32", "-b", "4", "-x", "1", "-v", "0"], capture_output=True, text=True)
        refused(f"-e FOLDER with {label}", r, *words)


tmp = tempfile.mkdtemp(prefix="test_hf.")
try:
    sums = [line.split() for line in open(os.path.join(FIXTURE, "SHA256SUMS"))]
    bad = [n for h, n in sums if hashlib.sha256(read(os.path.join(FIXTURE, n))).hexdigest() != h]
    check(f"fixture {FIXTURE}: sha256 of {len(sums)} files as SHA256SUMS" + (f" (differ: {bad})" if bad else ""),
          not bad and len(sums) >= 4)

    # (a) import, then the trainer's forward and backward against transformers'
    m3, m5 = os.path.join(tmp, "hf_tiny.bin"), os.path.join(tmp, "hf_tiny_bf16.bin")
    r = tool("import_hf.py", FIXTURE, m3)
    check(f"import_hf.py {FIXTURE} -> version 3 ({r.stdout.strip() or r.stderr.strip()})", r.returncode == 0)
    header = np.frombuffer(read(m3)[:32], "<i4") if os.path.exists(m3) else np.zeros(8)
    check(f"imported header: magic, version, maxT, V, L, NH, C, Vp = {header.tolist()}",
          header.tolist() == [20240326, 3, 32, 1000, 2, 4, 64, 1024])
    for bin_path, precision in zip(BINS[:2], ("fp32", "bf16")):
        run = subprocess.run([bin_path, "--debug-case", m3, os.path.join(FIXTURE, "debug.bin"), "transformers fixture"],
                             capture_output=True, text=True)
        tally = [line for line in run.stdout.splitlines() if line.startswith("test_gpt2: ")]
        for line in run.stdout.splitlines():
            if line.startswith(("PASS", "FAIL")):
                print("  " + line)
        check(f"{bin_path} ({precision}) --debug-case on the import: logits, loss, 16 gradients as transformers' "
              f"({tally[0] if tally else 'no tally, exit %d: %s' % (run.returncode, run.stderr.strip()[-200:])})",
              run.returncode == 0 and bool(tally) and tally[0].endswith(" 0 failed") and
              f"precision: {precision}" in run.stdout)

    # (b) export -> import is the identity; (c) the export's tensors are the fixture's
    e32, e16 = os.path.join(tmp, "export_fp32"), os.path.join(tmp, "export_bf16")
    r = tool("export_hf.py", m3, e32)
    check(f"export_hf.py version 3 -> fp32 folder ({r.stdout.strip() or r.stderr.strip()})", r.returncode == 0)
    back = os.path.join(tmp, "back.bin")
    r = tool("import_hf.py", e32, back)
    check("export -> import of the fp32 model file is bitwise the identity",
          r.returncode == 0 and read(back) == read(m3))
    fixture, exported = load_file(os.path.join(FIXTURE, "model.safetensors")), load_file(os.path.join(e32, "model.safetensors"))
    same = sorted(fixture) == sorted(exported) and all(
        fixture[k].dtype == exported[k].dtype and fixture[k].shape == exported[k].shape and
        np.array_equal(fixture[k].view(np.uint32), exported[k].view(np.uint32)) for k in fixture)
    check(f"exported model.safetensors: the fixture's {len(fixture)} tensors, names, shapes, bitwise values", same)
    check("exported model.safetensors is byte-identical to the fixture's (written by transformers' save_pretrained)",
          read(os.path.join(e32, "model.safetensors")) == read(os.path.join(FIXTURE, "model.safetensors")))
    fc, ec = json.load(open(os.path.join(FIXTURE, "config.json"))), json.load(open(os.path.join(e32, "config.json")))
    keys = ["model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "activation_function",
            "layer_norm_epsilon", "tie_word_embeddings"]
    check("exported config.json: shape and computation fields as the fixture's",
          all(fc.get(k) == ec.get(k) for k in keys) and os.path.exists(os.path.join(e32, "generation_config.json")))

    r = tool("import_hf.py", FIXTURE, m5, "--version", "5")
    bf = np.frombuffer(read(m5), "<u2", offset=1024).astype("<u4") << 16 if r.returncode == 0 else None
    f32 = np.frombuffer(read(m3), "<f4", offset=1024)
    # rounded, not truncated: within half a bf16 ulp (at most 2^-8 of the value) of the fp32 value
    near = bf is not None and bool(np.all(np.abs(bf.view("<f4") - f32) <= np.abs(f32) * 2.0 ** -8))
    check("import --version 5: the fp32 weights rounded to bf16 (each within half an ulp)", near)
    r = tool("export_hf.py", m5, e16)
    with safe_open(os.path.join(e16, "model.safetensors"), framework="numpy") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    check(f"export of version 5 writes bf16 safetensors (dtypes {sorted(dtypes)})", r.returncode == 0 and dtypes == {"BF16"})
    r = tool("import_hf.py", e16, back, "--version", "5")
    check("export -> import of the bf16 model file is bitwise the identity", r.returncode == 0 and read(back) == read(m5))

    # fine-tuning the import: -a 1 overfits one batch, so the loss falls every step
    run_dir = os.path.join(tmp, "run")
    r = subprocess.run([BINS[2], "-e", m3, "-t", "32", "-b", "4", "-x", "4", "-v", "0", "-a", "1", "-l", "1e-3", "-u", "0",
                        "-o", run_dir], capture_output=True, text=True)
    losses = [float(line.split("| loss ")[1].split()[0]) for line in r.stdout.splitlines() if "| loss " in line]
    check(f"{BINS[2]} -e <import> fine-tunes: train losses {losses} fall (exit {r.returncode})",
          r.returncode == 0 and len(losses) == 4 and all(b < a for a, b in zip(losses, losses[1:])))
    ckpt = os.path.join(run_dir, "model_00000004.bin")
    r = tool("export_hf.py", ckpt, os.path.join(tmp, "export_ckpt"))
    check(f"the fine-tuned checkpoint exports ({r.stdout.strip() or r.stderr.strip()})",
          r.returncode == 0 and os.path.exists(os.path.join(tmp, "export_ckpt", "model.safetensors")))

    direct_folders(m3)

    # GPT-2's vocabulary: the export adds the tokenizer files (from $SHARED_DATA/gpt2)
    gpt2_dir = os.path.join(os.environ.get("SHARED_DATA", "../shared/data"), "gpt2")
    if not os.path.isfile(os.path.join(gpt2_dir, "encoder.json")) or not os.path.isfile(os.path.join(gpt2_dir, "vocab.bpe")):
        print(f"SKIP export of a V=50257 model with the tokenizer files: {gpt2_dir}/encoder.json or vocab.bpe absent")
    else:
        header = np.zeros(256, "<i4")
        header[:8] = [20240326, 3, 16, 50257, 1, 1, 8, 50304]
        # wte, wpe; 13 C-vectors (ln1 2, qkvb 3, attprojb, ln2 2, fcb 4, fcprojb), 12 C x C
        # blocks (qkvw 3, attprojw, fcw 4, fcprojw 4), lnf 2C
        n = 50304 * 8 + 16 * 8 + 13 * 8 + 12 * 64 + 16
        weights = np.random.RandomState(0).randn(n).astype("<f4")
        weights[50257 * 8:50304 * 8] = 0  # the padded rows
        v50257 = os.path.join(tmp, "v50257.bin")
        open(v50257, "wb").write(header.tobytes() + weights.tobytes())
        out = os.path.join(tmp, "export_v50257")
        r = tool("export_hf.py", v50257, out, "--gpt2-dir", gpt2_dir)
        conf = json.load(open(os.path.join(out, "config.json"))) if r.returncode == 0 else {}
        copies = r.returncode == 0 and read(os.path.join(out, "vocab.json")) == read(os.path.join(gpt2_dir, "encoder.json")) \
            and read(os.path.join(out, "merges.txt")) == read(os.path.join(gpt2_dir, "vocab.bpe"))
        tok_conf = json.load(open(os.path.join(out, "tokenizer_config.json"))) if r.returncode == 0 else {}
        check(f"export of a V=50257 model: vocab.json, merges.txt = encoder.json, vocab.bpe; EOT 50256 as bos/eos "
              f"({r.stdout.strip() or r.stderr.strip()})",
              copies and conf.get("eos_token_id") == 50256 and conf.get("bos_token_id") == 50256 and
              tok_conf.get("eos_token") == "<|endoftext|>" and tok_conf.get("model_max_length") == 16)
        weights[50300 * 8] = 1.0
        open(v50257, "wb").write(header.tobytes() + weights.tobytes())
        r = tool("export_hf.py", v50257, out, "--gpt2-dir", gpt2_dir)
        check(f"export of a model whose padded vocabulary rows are not zero: {r.stderr.strip()}",
              one_error_line(r) and "padded" in r.stderr)

    # bad input
    empty = os.path.join(tmp, "no_weights")
    os.makedirs(empty)
    shutil.copy(os.path.join(FIXTURE, "config.json"), empty)
    r = tool("import_hf.py", empty, os.path.join(tmp, "x.bin"))
    check(f"import of a folder without model.safetensors: {r.stderr.strip()}", one_error_line(r) and "model.safetensors" in r.stderr)
    relu = os.path.join(tmp, "relu")
    shutil.copytree(FIXTURE, relu)
    json.dump(dict(fc, activation_function="relu"), open(os.path.join(relu, "config.json"), "w"))
    r = tool("import_hf.py", relu, os.path.join(tmp, "x.bin"))
    check(f"import of a relu GPT-2: {r.stderr.strip()}", one_error_line(r) and "activation_function" in r.stderr)
    r = tool("export_hf.py", os.path.join(FIXTURE, "debug.bin"), os.path.join(tmp, "y"))
    check(f"export of a file that is not a model file: {r.stderr.strip()}", one_error_line(r) and "magic" in r.stderr)
    short = os.path.join(tmp, "short.bin")
    open(short, "wb").write(read(m3)[:-4])
    r = tool("export_hf.py", short, os.path.join(tmp, "y"))
    check(f"export of a truncated model file: {r.stderr.strip()}", one_error_line(r) and "truncated" in r.stderr)
    malformed_inputs(m3)
    non_regular_files(m3, e32)
    r = subprocess.run([sys.executable, "dev/fuzz_hf.py", "--cases", "100", "--seed", "1", "--guard", str(GUARD)],
                       capture_output=True, text=True)
    lines = r.stdout.strip().splitlines()
    summary = [line for line in lines if line.startswith("fuzz_hf: ")] + lines[:1] + [r.stderr.strip()[-300:]]
    check("dev/fuzz_hf.py --cases 100 --seed 1: every run exits 0 with finite weights or 1 with one error line, "
          "no hang, guarded paths untouched (" + " | ".join(summary[:2]) + ")",
          r.returncode == 0 and " 0 findings" in r.stdout and " refused with one error line" in r.stdout)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
done()
