#!/usr/bin/env python3
"""The C++/CUDA sources' one layout: clang-format 19.1.7 with .clang-format.

The version is pinned because another one lays the same code out differently.

    python3 dev/format_check.py [--clang-format PATH] FILE...        (make format-check)
    python3 dev/format_check.py [--clang-format PATH] --fix FILE...  (make format)
    python3 dev/format_check.py --find

The check asks `clang-format --dry-run --Werror` about each file, prints a FAIL
line for each file it would change (with the first place) and ends with
"format_check: N passed, M failed" (N files as clang-format lays them out, M
not); it exits 1 when M > 0. Where clang-format 19.1.7 is not found (absent,
or another version) it prints one SKIP line saying what it found and a 0/0
tally and exits 0, so that a machine without it still runs `make test`.
--fix rewrites the files in place, and fails without 19.1.7.

--find prints the clang-format to use (the Makefile's CLANG_FORMAT): the
binary of the PyPI wheel clang-format==19.1.7 (dev/install_deps.sh installs
it) where this python3 imports it, else `clang-format` from PATH.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

VERSION = "19.1.7"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, ".clang-format")
STYLE = "--style=file:" + CONFIG
INSTALL = "dev/install_deps.sh installs it (python3 -m pip install clang-format==%s)" % VERSION


def find():
    try:
        import clang_format
        wheel = os.path.join(os.path.dirname(clang_format.__file__), "data", "bin", "clang-format")
        if os.access(wheel, os.X_OK):
            return wheel
    except ImportError:
        pass
    return "clang-format"


def version(tool):
    """clang-format's version ("19.1.7"), or None where tool does not run."""
    path = shutil.which(tool)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    m = re.search(r"version (\d+\.\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clang-format", default=None, help="the clang-format to run (default: --find's)")
    ap.add_argument("--fix", action="store_true", help="rewrite the files in place")
    ap.add_argument("--find", action="store_true", help="print the clang-format to use and exit")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    if args.find:
        print(find())
        return 0
    tool = args.clang_format or find()
    found = version(tool)
    if found != VERSION:
        what = "%s is version %s" % (tool, found) if found else "no %s" % tool
        if args.fix:
            print("error: make format needs clang-format %s (%s); %s" % (VERSION, what, INSTALL))
            return 1
        print("SKIP format_check: clang-format %s not found (%s); %s" % (VERSION, what, INSTALL))
        print("format_check: 0 passed, 0 failed")
        return 0
    if not os.path.isfile(CONFIG):
        print("error: %s not found" % CONFIG)
        return 1
    if args.fix:
        return subprocess.run([tool, "-i", STYLE, *args.files]).returncode
    passed = failed = 0
    for f in args.files:
        r = subprocess.run([tool, "--dry-run", "--Werror", STYLE, f], capture_output=True, text=True)
        if r.returncode == 0:
            passed += 1
            continue
        failed += 1
        first = (r.stderr.strip().splitlines() or ["clang-format exited %d" % r.returncode])[0]
        m = re.match(r"(.*?):(\d+):\d+: error: code should be clang-formatted", first)
        where = "first at line %s" % m.group(2) if m else first
        print("FAIL %s: not laid out as clang-format %s does (%s); make format fixes it" % (f, VERSION, where))
    print("format_check: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
