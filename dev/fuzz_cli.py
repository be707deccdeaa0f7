#!/usr/bin/env python3
"""A bounded fuzzer of the trainer's inputs: random and mutated flag values,
model-file headers (through --memory-plan 1), DONE markers and state-file
headers (through -y 1). Every run must end by itself with exit 0, or with
exit 1 and exactly one stderr line starting "error:" (a warning: line may
precede it on a resume); a signal, an exit past 1, more lines, or running past
the hang guard is a finding. Prints runs / crashes / hangs / bad exits per
target, and ends with one error line and exit 1 if there was a finding.

The flags and their value forms (<int>, <float>, <0|1>, <packed|slots>,
<path>, ...) are read from `train_gpt --help`, so a new flag is fuzzed as soon
as the trainer offers it.

Usage: dev/fuzz_cli.py [path/to/train_gpt] [--seconds-per-target N | --runs-per-target N] [--seed S]
       (defaults: build/cpu/train_gpt, 120 seconds, seed 1)
       dev/fuzz_cli.py [path/to/train_gpt] --list-flags   (the flags and forms it read, one a line)
"""
import argparse
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("bin", nargs="?", default="build/cpu/train_gpt")
ap.add_argument("--seconds-per-target", type=float, default=120)
ap.add_argument("--runs-per-target", type=int, default=0, help="a fixed number of runs instead of a time budget")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--list-flags", action="store_true")
args = ap.parse_args()
rng = random.Random(args.seed)
GUARD = 120  # a hang guard: nothing here should take a fraction of it
TINY = "L=1,C=32,H=2,V=256,maxT=32"


def fail(message):
    print("error: " + message, file=sys.stderr)
    sys.exit(1)


def help_flags(binary):
    """[(flag, value form)] of --help's lines "  -x <int>   help" (--help itself has no form)."""
    try:
        r = subprocess.run([binary, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=GUARD)
    except (OSError, subprocess.TimeoutExpired) as e:
        fail("%s --help: %s" % (binary, e))
    flags = re.findall(r"^  (-\S+) (<\S+>)", r.stdout, re.M)
    if r.returncode != 0 or not flags:
        fail("%s --help: exit %d and %d flags listed" % (binary, r.returncode, len(flags)))
    return flags


FLAGS = help_flags(args.bin)
if args.list_flags:
    for flag, form in FLAGS:
        print(flag, form)
    sys.exit(0)
work = tempfile.mkdtemp()


def shard(path, n=5000):
    with open(path, "wb") as f:
        # 20240520, 1: the uint16 shard magic and version (DATALOADER_MAGIC_U16, llmc/data/dataloader.h)
        f.write(struct.pack("<256i", 20240520, 1, n, *[0] * 253))
        f.write(struct.pack("<%dH" % n, *[(i * 7) % 256 for i in range(n)]))


DATA = os.path.join(work, "good.bin")
shard(DATA)
BASE = ["-e", TINY, "-i", DATA, "-b", "2", "-t", "16", "-v", "0"]

NUMBERS = ["0", "-0", "1", "-1", "2", "4294967297", "2147483648", "-2147483649", "99999999", "100000000", "1e-50",
           "1e-40", "1e308", "nan", "inf", "-inf", "0x10", " 3", "3 ", "3k", "", "auto", "1.5", "-0.5", "1e3",
           "9223372036854775808", "00000001", "+4", "\t1"]
WORDS = ["stairs", "none", "", "-"]  # wrong words; an enumerated flag's names come from its --help form
# a large value of these is a long run (steps, tokens per step, val batches, sample tokens), not a finding:
# it is drawn again (their parsing of large numbers is the same as every other flag's)
LONG_RUN = {"-x", "-d", "-m", "-g", "--ramp-tokens", "--ramp-steps"}


def noise():
    return "".join(rng.choice("0123456789-+.eE xa,=/") for _ in range(rng.randint(0, 8)))


def number():
    return rng.choice(NUMBERS) if rng.random() < 0.7 else noise()


def long_run(flag, text):
    try:
        return flag in LONG_RUN and int(text) > 1024
    except ValueError:
        return False


def value(flag, form, i):
    """A value for flag of --help's form: mostly of that form, sometimes anything."""
    inner = form[1:-1]
    if inner in ("glob", "path"):
        v = rng.choice([DATA, DATA, os.path.join(work, "missing_*.bin"), work, "/dev/null", "", number()])
    elif inner == "dir":
        v = rng.choice([os.path.join(work, "o%d" % i)] * 3 + [DATA, "", number()])
    elif inner == "init":
        v = rng.choice([TINY, TINY, "L=1,C=32,H=2,V=256,maxT=16", "L=1,C=30,H=4,V=256,maxT=32", DATA, "d", noise()])
    elif "|" in inner and rng.random() < 0.7:
        v = rng.choice(inner.split("|"))
    elif inner in ("int", "float", "int|auto") or "|" in inner:
        v = number()
    else:  # <name>, <rule>: a word
        v = rng.choice(WORDS) if rng.random() < 0.7 else noise()
    while long_run(flag, v):
        v = number()
    return v


def target_flags(i):
    chosen = dict(zip(BASE[::2], BASE[1::2]))
    chosen["-x"] = "1"
    repeated = []
    for _ in range(rng.randint(1, 3)):
        flag, form = rng.choice(FLAGS)
        v = value(flag, form, i)
        if rng.random() < 0.05:
            repeated += [flag, v]  # a flag given twice must be refused, not take the last value
        else:
            chosen[flag] = v
    return [a for kv in chosen.items() for a in kv] + repeated


def target_model_header(i):
    path = os.path.join(work, "m%d.bin" % (i % 8))
    pick = lambda: rng.choice([0, -1, 1, 2, 3, 4, 32, 64, 128, 256, 1 << 24, (1 << 24) + 1, 2 ** 31 - 1, -2 ** 31,
                               rng.randint(-2 ** 31, 2 ** 31 - 1)])
    fields = [pick() for _ in range(6)]  # maxT V L NH C Vp
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240326, rng.choice([3, 5, 4]), *fields, *[0] * 248))
        f.write(os.urandom(rng.choice([0, 16, 4096])))
    return ["-e", path, "--memory-plan", rng.choice(["1", "0"]), "-b", "1", "-t", "16", "-i", DATA, "-x", "1", "-v", "0"]


CKPT = os.path.join(work, "ck")


def fresh_checkpoint():
    shutil.rmtree(CKPT, ignore_errors=True)
    subprocess.run([args.bin, *BASE, "-x", "2", "-n", "1", "-o", CKPT], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=GUARD)


def mutate(path, header_only):
    d = bytearray(open(path, "rb").read())
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.2 and len(d) > 1:
            d = d[:rng.randrange(len(d))]
        elif d:
            i = rng.randrange(min(len(d), 1024) if header_only else len(d))
            d[i] = rng.randrange(256)
    open(path, "wb").write(bytes(d))


def target_resume(i):
    fresh_checkpoint()
    name = rng.choice(["DONE_00000002", "state_00000002_00000.bin", "model_00000002.bin", "DONE_00000001"])
    mutate(os.path.join(CKPT, name), header_only=not name.startswith("DONE"))
    return BASE + ["-x", "3", "-o", CKPT, "-y", "1"]


def judge(argv):
    try:
        r = subprocess.run([args.bin, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           errors="replace", timeout=GUARD)
    except subprocess.TimeoutExpired:
        return "hang"
    if r.returncode < 0:
        return "crash"
    lines = [l for l in r.stderr.splitlines() if not l.startswith("warning: ")]
    if r.returncode == 0:
        return "ok"
    if r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "):
        return "ok"
    return "bad exit"


def budget_left(i, deadline):
    return i < args.runs_per_target if args.runs_per_target > 0 else time.time() < deadline


findings = 0
for name, target in [("flags", target_flags), ("model header", target_model_header), ("resume", target_resume)]:
    counts = {"ok": 0, "crash": 0, "hang": 0, "bad exit": 0}
    deadline = time.time() + args.seconds_per_target  # the budget only; no verdict depends on it
    i = 0
    while budget_left(i, deadline):
        argv = target(i)
        verdict = judge(argv)
        counts[verdict] += 1
        if verdict != "ok":
            print("  %s: %s" % (verdict, " ".join(repr(a) for a in argv)), flush=True)
            findings += 1
        i += 1
    print("%s: %d runs, %d crashes, %d hangs, %d bad exits" % (name, i, counts["crash"], counts["hang"],
                                                                  counts["bad exit"]), flush=True)
shutil.rmtree(work)
if findings:
    fail("%d findings (listed above)" % findings)
