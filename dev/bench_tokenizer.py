#!/usr/bin/env python3
"""Benchmarks build/host/prepro (1 and 2 threads) against tiktoken's single-thread
encode_ordinary_batch on the same text, in the same run, and prints MB/s and the ratios.

Input: tinyshakespeare repeated --repeat times, split into documents on "\\n\\n" (the llm.c
recipe; prepro --split-on-blank-lines, tiktoken gets the same list of sections). prepro is
timed end to end as a process (tokenizer load, reading, encoding, writing shards); its own
encode-only rate (printed by prepro) is shown too. tiktoken is timed on the encode call only.
Best of --trials runs each. Also checks that both give the same number of tokens.

usage: python3 dev/bench_tokenizer.py [--repeat 10] [--trials 3] [--input FILE]
needs: pip install tiktoken regex; make build/host/prepro
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_cases import load_encoding  # noqa: E402


def main():
    shared = os.environ.get("SHARED_DATA", "../shared/data")
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", default=os.path.join(shared, "tinyshakespeare.txt"))
    ap.add_argument("--gpt2-dir", default=os.path.join(shared, "gpt2"))
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--prepro", default="build/host/prepro")
    args = ap.parse_args()
    for p in (args.input, args.prepro, os.path.join(args.gpt2_dir, "encoder.json")):
        if not os.path.exists(p):
            sys.exit(f"error: {p} not found")

    with open(args.input, encoding="utf-8") as f:
        text = f.read()
    if not text.endswith("\n\n"):
        text += "\n\n"
    text = text * args.repeat
    data = text.encode("utf-8")
    mb = len(data) / 1e6
    sections = text.split("\n\n")
    docs = [s + "\n\n" for s in sections[:-1]] + [sections[-1]]

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "input.txt")
        with open(path, "wb") as f:
            f.write(data)
        print(f"input: {args.input} x {args.repeat} = {mb:.1f} MB, {len(docs)} documents; "
              f"{os.cpu_count()} CPUs; best of {args.trials}")

        enc = load_encoding(args.gpt2_dir)
        best_tt, tt_tokens = float("inf"), 0
        for _ in range(args.trials):
            t0 = time.perf_counter()
            out = enc.encode_ordinary_batch(docs, num_threads=1)
            best_tt = min(best_tt, time.perf_counter() - t0)
            tt_tokens = sum(len(x) + 1 for x in out)  # + EOT per document, as prepro writes
        tt_rate = mb / best_tt
        print(f"tiktoken encode_ordinary_batch(num_threads=1): {best_tt:.3f} s  {tt_rate:6.2f} MB/s  "
              f"({tt_tokens} tokens incl. one EOT per document)")

        rates = {}
        for threads in (1, 2):
            best, inner, ntok = float("inf"), 0.0, 0
            for _ in range(args.trials):
                cmd = [args.prepro, "--out", os.path.join(tmp, "out"), "--split-on-blank-lines",
                       "--threads", str(threads), "--gpt2-dir", args.gpt2_dir, path]
                t0 = time.perf_counter()
                r = subprocess.run(cmd, capture_output=True, text=True)
                dt = time.perf_counter() - t0
                if r.returncode != 0:
                    sys.exit(f"error: prepro failed: {r.stderr.strip()}")
                m = re.search(r"-> ([\d,]+) tokens .*?([\d.]+) MB/s", r.stdout)
                ntok = int(m.group(1).replace(",", ""))
                if dt < best:
                    best, inner = dt, float(m.group(2))
            rates[threads] = mb / best
            ok = "same token count" if ntok == tt_tokens else f"TOKEN COUNT DIFFERS ({ntok} vs {tt_tokens})"
            print(f"prepro --threads {threads}: {best:.3f} s  {mb / best:6.2f} MB/s end to end "
                  f"(encode only {inner:.1f} MB/s); {ratio(mb / best, tt_rate)} tiktoken; {ok}")
        print(f"ratios vs tiktoken (end to end): 1 thread {rates[1] / tt_rate:.2f}x (goal >= 1), "
              f"2 threads {rates[2] / tt_rate:.2f}x (goal >= 1.8)")


def ratio(a, b):
    return f"{a / b:.2f}x"


if __name__ == "__main__":
    main()
