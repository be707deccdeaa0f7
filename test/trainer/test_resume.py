#!/usr/bin/env python3
"""Checkpoint and resume: a run killed with SIGKILL at points defined by its
progress (after step n is logged, after its k-th checkpoint, and inside a
checkpoint write: at the rename of the j-th file, so its .tmp is left
behind) and resumed with -y 1 each time ends with bitwise the losses, model
and optimizer state of a run that was never interrupted. No kill depends on
wall-clock time, so the test behaves the same on a busy machine.

After every kill, each DONE's files are whole (their sizes as listed). The
model is llm.c's one file model_S.bin (train_gpt) or, for train_llama3, the
Hugging Face folder model_S/ whose files are renamed into a temporary folder
and that folder into place: the kills inside a write cover each of those
renames. The final checkpoints' files, as their DONEs list them, are bitwise
the uninterrupted run's; -nk 3 leaves the newest 3 models only.

Usage: test/trainer/test_resume.py [path/to/train_gpt]   (default build/cpu/train_gpt)
TEST_RESUME_QUICK=1 (make check): one kill, inside the second checkpoint's
write (train_llama3: inside its model folder's write), and one resume, on a run
of 6 steps.
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # test/checks.py
from checks import Checks  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/cpu/train_gpt"
LLAMA = "llama3" in os.path.basename(BIN)  # its model: a folder of these files
MODEL_FOLDER_FILES = ["config.json", "model.safetensors"] if LLAMA else []
QUICK = os.environ.get("TEST_RESUME_QUICK") == "1"
# the built-in corpus and model; a checkpoint every EVERY steps, the newest 3 kept; the
# val loss every VAL steps, a sample every SAMPLE (all three divide STEPS). Small batches
# (B=2, 2 val batches): what is checked is where a kill leaves the files, not the numbers.
STEPS, EVERY, VAL, SAMPLE = (6, 2, 2, 6) if QUICK else (24, 3, 8, 12)
ARGS = ["-x", str(STEPS), "-n", str(EVERY), "-nk", "3", "-v", str(VAL), "-s", str(SAMPLE), "-g", "8", "-b", "2", "-m", "2"]
check = Checks()


def train_losses(run_dir):
    """step -> loss text of main.jsonl."""
    losses = {}
    with open(os.path.join(run_dir, "main.jsonl")) as f:
        for line in f:
            if '"loss"' in line:
                step = int(line.split('"step": ')[1].split(",")[0])
                losses[step] = line.split('"loss": ')[1].split(",")[0]
    return losses


def read(path):
    with open(path, "rb") as f:
        return f.read()


def model_name(step):
    """A checkpoint's model: the folder model_S (Llama) or llm.c's file model_S.bin."""
    return "model_%08d" % step + ("" if LLAMA else ".bin")


def done_files(run_dir, step):
    """The (name, bytes, xxh64) lines of a DONE."""
    lines = open(os.path.join(run_dir, "DONE_%08d" % step)).read().splitlines()
    return [tuple(l.split()[1:]) for l in lines if l.startswith("file ")]


def done_steps(run_dir):
    return sorted(int(n[5:]) for n in os.listdir(run_dir) if re.fullmatch(r"DONE_\d{8}", n))


def dones_whole(run_dir):
    """Whether every DONE lists its model (each file of its folder) and state, each there with its size."""
    for step in done_steps(run_dir):
        files = done_files(run_dir, step)
        model = [model_name(step) + "/" + f for f in MODEL_FOLDER_FILES] or [model_name(step)]
        if sorted(f[0] for f in files) != sorted(model + ["state_%08d_00000.bin" % step]):
            return False
        for name, size, _ in files:
            path = os.path.join(run_dir, name)
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) != int(size):
                return False
    return True


def renames_before(trace, run_dir):
    """How many rename() calls a start makes before its first one into run_dir
    (the built-in corpus is rewritten first), from an strace -e trace=rename log."""
    names = [l for l in open(trace) if "rename(" in l]
    return next(i for i, l in enumerate(names) if '"%s/' % run_dir in l)


def start(run_dir, kill_at_rename=0):
    """Starts a resuming run; with kill_at_rename > 0 under strace, which
    SIGKILLs it on entering that rename() call (the file is written and
    fsynced, still under its .tmp name)."""
    cmd = [BIN, *ARGS, "-o", run_dir, "-y", "1"]
    if kill_at_rename:
        cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=rename",
               "-e", "inject=rename:signal=SIGKILL:when=%d" % kill_at_rename, *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_after(proc, pattern, nth=1):
    """Reads the output until the nth line matching pattern, then SIGKILLs; the whole output."""
    out = []
    for line in proc.stdout:
        out.append(line)
        nth -= bool(re.search(pattern, line))
        if nth == 0:
            proc.send_signal(signal.SIGKILL)
            break
    rest, _ = proc.communicate()
    return "".join(out) + rest


def main():
    if not shutil.which("strace"):
        check("strace is installed (dev/install_deps.sh installs it; the test kills inside checkpoint writes with it)",
              False)
        return
    work = tempfile.mkdtemp()
    ref_dir, run_dir = os.path.join(work, "ref"), os.path.join(work, "run")
    trace = os.path.join(work, "ref.strace")
    r = subprocess.run(["strace", "-f", "-qq", "-o", trace, "-e", "trace=rename", BIN, *ARGS, "-o", ref_dir],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check("uninterrupted run of %d steps (exit %d)" % (STEPS, r.returncode), r.returncode == 0)
    if r.returncode != 0:
        print(r.stdout[-2000:])
        return
    ref_samples = [l for l in r.stdout.splitlines() if "sample:" in l]
    first = renames_before(trace, ref_dir)
    # a checkpoint's renames: its WRITING marker's, its model's (one file; or each file of the
    # folder, then the folder), its state file's, its DONE's
    model_renames = len(MODEL_FOLDER_FILES) + 1 if LLAMA else 1
    per_checkpoint = 1 + model_renames + 2
    first += 1  # (the WRITING marker's rename: a kill there leaves its whole .tmp)

    # (kind, argument) of each start; the last runs to the end
    rng = random.Random(20261129)
    plan = [("step", 2)]                   # before the first checkpoint: the next start begins afresh
    plan += [("rename", first)]            # the first checkpoint's WRITING marker: only its .tmp left
    # inside the first checkpoint's model folder: the folder .tmp left with config.json only
    # (or both files, renamed inside it, before the folder's own rename)
    plan += [("rename", first + k) for k in range(2, model_renames + 1)]
    plan += [("rename", first + model_renames + 1),  # its state file: model in place, state .tmp
             ("rename", first + model_renames + 2),  # its DONE: model and state in place, DONE .tmp
             ("checkpoint", 1),                      # right after a complete checkpoint
             ("rename", first + per_checkpoint * rng.randint(1, 2) + rng.randint(1, per_checkpoint)),
             ("step", None), ("checkpoint", 2), ("step", None), ("end", None)]
    if QUICK:  # inside the second checkpoint's write (the model folder's last file, or the
        # state file), then to the end from the first
        plan = [("rename", first + per_checkpoint + (model_renames - 1 if LLAMA else 2)), ("end", None)]
    in_write = sum(kind == "rename" for kind, _ in plan)
    outputs, kills, kills_in_write, resume_step, dones_ok, left = [], 0, 0, 0, True, []
    for kind, arg in plan:
        proc = start(run_dir, arg if kind == "rename" else 0)
        if kind == "step":  # a few steps past where this start resumes
            out = kill_after(proc, r"^step +%d/%d " % (arg or min(STEPS - 1, resume_step + rng.randint(1, 4)), STEPS))
        elif kind == "checkpoint":  # right after this start's arg-th complete checkpoint
            out = kill_after(proc, r"^checkpoint: step", arg)
        else:
            out = proc.communicate()[0]
        outputs.append(out)
        m = re.search(r"resuming from step (\d+)", out)
        resume_step = int(m.group(1)) if m else 0
        if kind == "end":
            break
        if proc.returncode != -signal.SIGKILL:
            print(out[-2000:])
            break
        kills += 1
        temps = sorted(n for n in os.listdir(run_dir) if n.endswith(".tmp"))
        if kind == "rename" and temps:
            kills_in_write += 1
            for n in temps:  # a model folder's temporary: what it held
                inside = os.path.join(run_dir, n)
                left.append(n + ("/{%s}" % ",".join(sorted(os.listdir(inside))) if os.path.isdir(inside) else ""))
        whole = dones_whole(run_dir)
        if not whole:
            check("after the SIGKILL at %s %s: every DONE lists its files, each whole (%s)"
                  % (kind, arg, " ".join(sorted(os.listdir(run_dir)))), False)
        dones_ok = dones_ok and whole
        # what the next start resumes from (the newest DONE)
        resume_step = max(done_steps(run_dir), default=0)
    check("after each of the %d SIGKILLs every DONE lists its model and state, each there and whole" % kills, dones_ok)
    check("the interrupted run finished after %d starts, %d SIGKILLs, %d of them inside a checkpoint write "
          "(left behind: %s)" % (len(outputs), kills, kills_in_write, " ".join(left)),
          proc.returncode == 0 and kills == len(plan) - 1 and kills_in_write == in_write)
    if proc.returncode != 0:
        return
    resumed = [o.split("resuming from step ")[1].split()[0] for o in outputs if "resuming from step" in o]
    check("%d of the starts resumed from a complete checkpoint (steps %s)" % (len(resumed), " ".join(resumed)),
          len(resumed) >= (1 if QUICK else 5))

    ref_losses, run_losses = train_losses(ref_dir), train_losses(run_dir)
    same = [s for s in ref_losses if run_losses.get(s) == ref_losses[s]]
    check("all %d step losses bitwise equal to the uninterrupted run's (%d equal)" % (len(ref_losses), len(same)),
          len(same) == len(ref_losses) == STEPS)
    ref_files, run_files = done_files(ref_dir, STEPS), done_files(run_dir, STEPS)
    for name, size, _ in ref_files:
        a, b = os.path.join(ref_dir, name), os.path.join(run_dir, name)
        check("final %s bitwise equal (%s bytes)" % (name, size), os.path.exists(b) and read(a) == read(b))
    check("the final DONEs list the same %d files, sizes and hashes" % len(ref_files),
          ref_files == run_files and len(ref_files) == max(len(MODEL_FOLDER_FILES), 1) + 1)
    last_samples = [l for l in outputs[-1].splitlines() if "sample:" in l]
    check("the sample at step %d equals the uninterrupted run's" % STEPS,
          bool(last_samples) and last_samples[-1] == ref_samples[-1])
    # the logs after the kills and resumes: every line whole, every step once
    records = [json.loads(l) for l in open(os.path.join(run_dir, "main.jsonl"))]
    loss_steps = [r["step"] for r in records if "loss" in r]
    val_steps = [r["step"] for r in records if "val_loss" in r]
    trl = [l.split()[0] for l in open(os.path.join(run_dir, "main.log")) if " trl:" in l]
    check("main.jsonl: %d whole records, steps 1..%d once each, val at %s once each; main.log likewise"
          % (len(records), STEPS, val_steps),
          loss_steps == list(range(1, STEPS + 1)) and val_steps == list(range(0, STEPS + 1, VAL)) and
          trl == ["s:%d" % s for s in range(STEPS)])
    names = sorted(os.listdir(run_dir))
    done = [n for n in names if n.startswith("DONE_")]
    kept = (STEPS - 2 * EVERY, STEPS - EVERY, STEPS)
    check("-nk 3 keeps the newest 3 complete checkpoints (%s), no temp files left" % " ".join(done),
          done == ["DONE_%08d" % s for s in kept] and not any(n.endswith(".tmp") for n in names))
    models = [n for n in names if n.startswith("model_")]
    folders_whole = all(os.path.isdir(os.path.join(run_dir, n)) and not os.path.islink(os.path.join(run_dir, n)) and
                        sorted(os.listdir(os.path.join(run_dir, n))) == MODEL_FOLDER_FILES for n in models)
    check("the models left are the kept ones' (%s)%s" % (" ".join(models), ", each a folder of exactly %s" %
                                                          " and ".join(MODEL_FOLDER_FILES) if LLAMA else ""),
          models == [model_name(s) for s in kept] and (folders_whole or not LLAMA))
    shutil.rmtree(work)


main()
check.tally("test_resume")
sys.exit(1 if check.failed else 0)
