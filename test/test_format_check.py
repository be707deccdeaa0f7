#!/usr/bin/env python3
"""dev/format_check.py, the checker of `make format-check`: a copy of a source
as clang-format 19.1.7 lays it out passes; the same copy with its layout broken
fails, named, beside a clean one that passes; --fix lays it out again. Another
version of clang-format, or none, makes the check a SKIP that exits 0, and
--fix an error. The cases that run clang-format are skipped, saying so, where
19.1.7 is not installed.

Usage: test/test_format_check.py
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # test/checks.py
from checks import Checks  # noqa: E402

SCRIPT = os.path.join(ROOT, "dev", "format_check.py")
SOURCE = os.path.join(ROOT, "llmc", "kernels", "rmsnorm.cuh")  # any source with indented blocks
check = Checks()


def run(*args):
    """(exit status, output) of dev/format_check.py with these arguments."""
    r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def expect(what, result, ok, *patterns):
    rc, out = result
    good = (rc == 0) == ok and all(p in out for p in patterns)
    check("%s: %s" % ("passes" if ok else "fails", what), good)
    if not good:
        print(out, end="")


def other_versions(tmp):
    fake = os.path.join(tmp, "clang-format-14")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\necho 'Debian clang-format version 14.0.6'\n")
    os.chmod(fake, 0o755)
    missing = os.path.join(tmp, "no-such-clang-format")
    expect("the check with clang-format 14.0.6 (SKIP, naming the version)", run("--clang-format", fake, SOURCE),
           True, "SKIP format_check: clang-format 19.1.7 not found", "version 14.0.6", "format_check: 0 passed, 0 failed")
    expect("the check without clang-format (SKIP)", run("--clang-format", missing, SOURCE), True,
           "SKIP format_check", "no " + missing)
    expect("--fix with clang-format 14.0.6 (an error)", run("--clang-format", fake, "--fix", SOURCE), False,
           "error: make format needs clang-format 19.1.7")


def layout(tmp, tool):
    clean, broken = os.path.join(tmp, "clean.cuh"), os.path.join(tmp, "broken.cuh")
    for path in (clean, broken):
        shutil.copy(SOURCE, path)
    expect("--fix lays out the copies", run("--clang-format", tool, "--fix", clean, broken), True)
    expect("the copy as laid out", run("--clang-format", tool, clean), True, "format_check: 1 passed, 0 failed")
    text = open(broken).read()
    at = text.index("\n    ") + 1  # the first indented line loses an indent level
    open(broken, "w").write(text[:at] + text[at + 4:])
    expect("the copy with a line out of its indent", run("--clang-format", tool, clean, broken), False,
           "FAIL %s: not laid out" % broken, "format_check: 1 passed, 1 failed")
    with open(broken, "a") as f:
        f.write("int  two_blanks ( int x ) { return x ; }\n")
    expect("--fix lays it out again", run("--clang-format", tool, "--fix", broken), True)
    expect("the copy after --fix", run("--clang-format", tool, broken), True, "format_check: 1 passed, 0 failed")


def main():
    tool = subprocess.run([sys.executable, SCRIPT, "--find"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        other_versions(tmp)
        rc, out = run("--clang-format", tool, SOURCE)
        if "SKIP" in out:
            print("SKIP the cases that run clang-format: " + out.splitlines()[0][len("SKIP format_check: "):])
        else:
            layout(tmp, tool)
    check.tally("test_format_check")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
