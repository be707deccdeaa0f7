#!/usr/bin/env python3
"""dev/fuzz_loaders.py, checked: its verdicts on made-up outcomes (one error line passes; a
signal, a sanitizer report, a second line, an out-of-memory line, control bytes do not); the
planted loader (--plant) is reported, its crash and its traceback, each saved with a command
that reproduces it; and a short deterministic run over the real trainers (every loader, a few
cases each, bounded by count, not time) has no finding.

Usage: test/trainer/test_fuzz_loaders.py [TRAIN_GPT]   (default build/cpu-asan/train_gpt; its
       folder's train_llama3 is the other trainer)
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # test/checks.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "dev"))
from checks import Checks  # noqa: E402
import fuzz_loaders  # noqa: E402

BUILD = os.path.dirname(sys.argv[1] if len(sys.argv) > 1 else "build/cpu-asan/train_gpt")
RUNS = 3  # cases per loader in the real run
check = Checks()


def verdict(rc, stderr):
    return fuzz_loaders.judge(rc, stderr)[0]


check("judge: exit 1 with one error line is a refusal", verdict(1, "error: x: bad\n") == "refused")
check("judge: exit 0 (with a warning line) is accepted", verdict(0, "warning: x; falling back\n") == "accepted")
check("judge: exit 0 with another stderr line is a finding", verdict(0, "oops\n") != "accepted")
check("judge: a warning line, then one error line, is a refusal", verdict(1, "warning: w\nerror: x\n") == "refused")
check("judge: a signal is a finding", verdict(-11, "") == "signal SIGSEGV")
check("judge: a second line is a finding", verdict(1, "error: x\nTraceback\n").startswith("exit 1 with 2"))
check("judge: exit 2 is a finding", verdict(2, "error: x\n").startswith("exit 2"))
check("judge: a sanitizer report is a finding",
      verdict(1, "==12==ERROR: AddressSanitizer: heap-buffer-overflow\n") == "sanitizer report")
check("judge: an out-of-memory error line is a finding (a huge allocation)",
      verdict(1, "error: out of host memory\n").startswith("out of memory") and
      verdict(1, "error: out of device memory for the weights\n").startswith("out of memory"))
check("judge: control bytes in the error line are a finding",
      verdict(1, "error: a\rb\n") == "control bytes in the error line")
check("judge: a hang is a finding", verdict(None, "") == "hang")

with tempfile.TemporaryDirectory(prefix="test_fuzz_loaders.") as tmp:
    findings = os.path.join(tmp, "findings")
    r = subprocess.run([sys.executable, "dev/fuzz_loaders.py", "--plant", "--runs", "40", "--loaders",
                        "gpt2-folder,shards-u16", "--findings", findings], capture_output=True, text=True)
    out = r.stdout + r.stderr
    check(f"--plant: exit 1 with findings (exit {r.returncode})", r.returncode == 1 and re.search(r"[1-9]\d* findings$",
                                                                                                  out.strip()))
    check("--plant: the planted crash (a shard's token count past its end) is reported as a signal",
          re.search(r"FINDING shards-u16 #\d+: signal SIGSEGV \[data/train_\d\.bin: header\[2\]", out) is not None)
    check("--plant: the planted traceback (a header length past the end) is reported as more than one line",
          re.search(r"FINDING gpt2-folder #\d+: exit 1 with \d+ stderr lines \[.*header length", out) is not None)
    saved = sorted(os.listdir(findings)) if os.path.isdir(findings) else []
    crash = next((d for d in saved if d.startswith("shards-u16")), None)
    if crash:
        text = open(os.path.join(findings, crash, "FINDING.txt")).read()
        command = text.split("reproduce (in this folder):\n", 1)[1].strip()
        again = subprocess.run(shlex.split(command), cwd=os.path.join(findings, crash), capture_output=True)
        check("--plant: the saved case and its command reproduce the crash", again.returncode == -11)
    else:
        check("--plant: the crash's case is saved", False)

    r = subprocess.run([sys.executable, "dev/fuzz_loaders.py", "--runs", str(RUNS), "--build", BUILD, "--findings",
                        findings + "-real"], capture_output=True, text=True)
    last = (r.stdout.strip().splitlines() or [""])[-1]
    loaders = len(fuzz_loaders.loaders(BUILD))
    check(f"{BUILD}: {RUNS} cases of each of the {loaders} loaders, 0 findings ({last})",
          r.returncode == 0 and last == f"fuzz_loaders: {RUNS * loaders} runs over {loaders} loaders, 0 findings")
    if r.returncode != 0:
        print(r.stdout[-3000:] + r.stderr[-2000:])

check.tally("test_fuzz_loaders")
