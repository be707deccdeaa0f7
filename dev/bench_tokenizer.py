#!/usr/bin/env python3
"""Benchmarks build/host/prepro against tiktoken on the same text, in the same run, for
GPT-2's tokenizer and for Llama 3's pattern (a tiktoken ranks file), on 1 thread and on all
cores, and prints tokens/s, MB/s and the ratios (printed, never asserted).

Input: tinyshakespeare repeated --repeat times, split into documents on "\\n\\n" (the llm.c
recipe; prepro --split-on-blank-lines, tiktoken gets the same list of sections). prepro is
timed end to end as a process (tokenizer load, reading, encoding, writing shards); its own
encode-only rate (printed by prepro) is shown too. tiktoken is timed on the
encode_ordinary_batch call only. Best of --trials runs each. Also checks that both give the
same number of tokens (prepro's include one document token per document).

Llama 3's tokenizer.model cannot be downloaded here: the llama3 rows use GPT-2's 50,256 ranks
rewritten as a tiktoken ranks file with Llama 3's pattern and specials (--ranks FILE: a real
one, e.g. Llama 3's tokenizer.model).

usage: python3 dev/bench_tokenizer.py [--repeat 10] [--trials 3] [--input FILE] [--ranks FILE]
needs: pip install tiktoken regex; make build/host/prepro
"""
import argparse
import base64
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_cases import gpt2_ranks, llama3_encoding, load_encoding  # noqa: E402


def main():
    shared = os.environ.get("SHARED_DATA", "../shared/data")
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", default=os.path.join(shared, "tinyshakespeare.txt"))
    ap.add_argument("--gpt2-dir", default=os.path.join(shared, "gpt2"))
    ap.add_argument("--ranks", help="a tiktoken ranks file for the llama3 rows (default: GPT-2's ranks)")
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
    ncpu = os.cpu_count()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "input.txt")
        with open(path, "wb") as f:
            f.write(data)
        print(f"input: {args.input} x {args.repeat} = {mb:.1f} MB, {len(docs)} documents; "
              f"{ncpu} CPUs; best of {args.trials}")
        ranks_path = args.ranks
        if ranks_path:
            from tiktoken.load import load_tiktoken_bpe
            ranks = load_tiktoken_bpe(ranks_path)
        else:
            ranks = gpt2_ranks(args.gpt2_dir)
            ranks_path = os.path.join(tmp, "gpt2.ranks")
            with open(ranks_path, "w") as f:
                for t, r in sorted(ranks.items(), key=lambda x: x[1]):
                    f.write(f"{base64.b64encode(t).decode()} {r}\n")
        families = [("gpt2", load_encoding(args.gpt2_dir), ["--gpt2-dir", args.gpt2_dir]),
                    ("llama3", llama3_encoding(ranks), ["--tiktoken", ranks_path])]
        for family, enc, flags in families:
            rows = {}
            for threads in sorted({1, ncpu}):
                best_tt, tt_tokens = float("inf"), 0
                for _ in range(args.trials):
                    t0 = time.perf_counter()
                    out = enc.encode_ordinary_batch(docs, num_threads=threads)
                    best_tt = min(best_tt, time.perf_counter() - t0)
                    tt_tokens = sum(len(x) + 1 for x in out)  # + the document token, as prepro writes
                best, inner, ntok = float("inf"), 0.0, 0
                for _ in range(args.trials):
                    cmd = [args.prepro, "--replace", "--out", os.path.join(tmp, "out"), "--split-on-blank-lines",
                           "--threads", str(threads)] + flags + [path]
                    t0 = time.perf_counter()
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    dt = time.perf_counter() - t0
                    if r.returncode != 0:
                        sys.exit(f"error: prepro failed: {r.stderr.strip()}")
                    m = re.search(r"-> ([\d,]+) tokens .*?([\d.]+) MB/s", r.stdout)
                    ntok = int(m.group(1).replace(",", ""))
                    if dt < best:
                        best, inner = dt, float(m.group(2))
                ok = "same token count" if ntok == tt_tokens else f"TOKEN COUNT DIFFERS ({ntok} vs {tt_tokens})"
                rows[threads] = (ntok / best) / (tt_tokens / best_tt)
                print(f"{family:6s} {threads:2d} thread(s): tiktoken {tt_tokens / best_tt / 1e6:6.2f} M tokens/s "
                      f"({mb / best_tt:6.2f} MB/s); prepro {ntok / best / 1e6:6.2f} M tokens/s ({mb / best:6.2f} MB/s "
                      f"end to end, encode only {inner:.1f} MB/s); prepro/tiktoken {rows[threads]:.2f}x; {ok}")
            print(f"{family}: prepro/tiktoken tokens/s " +
                  ", ".join(f"{t} thread(s) {x:.2f}x" for t, x in rows.items()))


if __name__ == "__main__":
    main()
