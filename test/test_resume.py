#!/usr/bin/env python3
"""Checkpoint and resume: a run killed with SIGKILL at random moments (and
while a checkpoint file is being written) and resumed with -y 1 each time
ends with bitwise the losses, model and optimizer state of a run that was
never interrupted.

Usage: test/test_resume.py [path/to/train_gpt]   (default build/cpu/train_gpt)
"""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/cpu/train_gpt"
STEPS = 24
# the built-in corpus and model; a checkpoint every 3 steps, the newest 3 kept
ARGS = ["-x", str(STEPS), "-n", "3", "-nk", "3", "-v", "8", "-s", "12", "-g", "8"]
passed = failed = 0


def check(name, ok):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + name, flush=True)
    if ok:
        passed += 1
    else:
        failed += 1


def train_losses(run_dir):
    """step -> loss text of main.jsonl; for a step logged twice (run again
    after a resume) the later line, which must equal the earlier anyway."""
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


def kill_when_writing(proc, run_dir, deadline):
    """SIGKILL as soon as a checkpoint temp file exists; True if one did."""
    while time.time() < deadline and proc.poll() is None:
        try:
            if any(name.endswith(".tmp") for name in os.listdir(run_dir)):
                proc.send_signal(signal.SIGKILL)
                return True
        except FileNotFoundError:
            pass
    return False


def main():
    work = tempfile.mkdtemp()
    ref_dir, run_dir = os.path.join(work, "ref"), os.path.join(work, "run")
    r = subprocess.run([BIN, *ARGS, "-o", ref_dir], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check("uninterrupted run of %d steps (exit %d)" % (STEPS, r.returncode), r.returncode == 0)
    if r.returncode != 0:
        print(r.stdout[-2000:])
        return
    ref_samples = [l for l in r.stdout.splitlines() if "sample:" in l]

    rng = random.Random(20261129)
    kills = kills_in_write = starts = 0
    outputs = []
    while starts < 40:
        starts += 1
        proc = subprocess.Popen([BIN, *ARGS, "-o", run_dir, "-y", "1"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        if kills_in_write < 2 and starts <= 12:  # the first kills aim at a checkpoint write
            if kill_when_writing(proc, run_dir, time.time() + 20):
                kills_in_write += 1
                kills += 1
        elif kills < 8:
            time.sleep(rng.uniform(0.5, 3.5))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        out, _ = proc.communicate()
        outputs.append(out)
        if proc.returncode == 0:
            break
        if proc.returncode != -signal.SIGKILL:
            print(out[-2000:])
            break
    check("the interrupted run finished after %d starts, %d SIGKILLs, %d of them while a checkpoint file was "
          "being written" % (starts, kills, kills_in_write),
          proc.returncode == 0 and kills >= 4 and kills_in_write >= 1)
    if proc.returncode != 0:
        return
    resumed = [o.split("resuming from step ")[1].split()[0] for o in outputs if "resuming from step" in o]
    check("%d of the starts resumed from a complete checkpoint (steps %s)" % (len(resumed), " ".join(resumed)),
          len(resumed) >= 3)

    ref_losses, run_losses = train_losses(ref_dir), train_losses(run_dir)
    same = [s for s in ref_losses if run_losses.get(s) == ref_losses[s]]
    check("all %d step losses bitwise equal to the uninterrupted run's (%d equal)" % (len(ref_losses), len(same)),
          len(same) == len(ref_losses) == STEPS)
    final = "%08d" % STEPS
    for name in ["model_%s.bin" % final, "state_%s_00000.bin" % final]:
        a, b = os.path.join(ref_dir, name), os.path.join(run_dir, name)
        check("final %s bitwise equal (%d bytes)" % (name, os.path.getsize(a)),
              os.path.exists(b) and read(a) == read(b))
    last_samples = [l for l in outputs[-1].splitlines() if "sample:" in l]
    check("the sample at step %d equals the uninterrupted run's" % STEPS,
          bool(last_samples) and last_samples[-1] == ref_samples[-1])
    names = sorted(os.listdir(run_dir))
    done = [n for n in names if n.startswith("DONE_")]
    check("-nk 3 keeps the newest 3 complete checkpoints (%s), no temp files left" % " ".join(done),
          done == ["DONE_%08d" % s for s in (STEPS - 6, STEPS - 3, STEPS)] and not any(n.endswith(".tmp") for n in names))


main()
print("test_resume: %d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
