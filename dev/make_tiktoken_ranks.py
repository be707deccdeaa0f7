#!/usr/bin/env python3
"""Trains a small byte-level BPE and writes it as a tiktoken ranks file (the format of
Llama 3's tokenizer.model: one "<base64 token> <rank>" line per token), the committed test
vocabulary test/data/tiktoken_test.ranks of test/host/test_tokenizer.cpp.

Meta's tokenizer.model cannot be downloaded here, so the Llama 3 path is tested with this
file instead: the 256 single bytes (ranks 0..255, in byte order), then --merges merges
learnt from the project's own documentation (README.md, data/README.md, dev/README.md)
pre-tokenised by Llama 3's pattern. Each merge joins the most frequent adjacent pair
(ties: the pair of lowest ranks) and its token gets the next rank, so every token is two
tokens of lower rank joined (what llmc/data/tokenizer.h checks of a ranks file). A pair whose
join is already a token is never merged again (tiktoken's ranks hold each token once).

The ranks depend on the documentation at the time they were made; the reference ids
(dev/make_tokenizer_cases.py --family llama3) are made from the committed file.

usage: python3 dev/make_tiktoken_ranks.py [--merges 2000] [--out test/data/tiktoken_test.ranks]
needs: pip install regex
"""
import argparse
import base64
import collections

import regex

LLAMA3_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
              r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
SOURCES = ["README.md", "data/README.md", "dev/README.md"]


def train(words, merges):
    """words: {tuple of token ids: count}; returns the token bytes by rank."""
    tokens = [bytes([b]) for b in range(256)]
    known = set(tokens)
    words = dict(words)
    for _ in range(merges):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        best = None
        for (a, b), n in pairs.items():
            if tokens[a] + tokens[b] in known:
                continue
            key = (-n, a, b)
            if best is None or key < best:
                best = key
        if best is None:
            break
        _, a, b = best
        new = len(tokens)
        tokens.append(tokens[a] + tokens[b])
        known.add(tokens[-1])
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--merges", type=int, default=2000)
    ap.add_argument("--out", default="test/data/tiktoken_test.ranks")
    args = ap.parse_args()
    counts = collections.Counter()
    for path in SOURCES:
        with open(path, encoding="utf-8") as f:
            counts.update(regex.findall(LLAMA3_PAT, f.read()))
    words = {tuple(p.encode("utf-8")): n for p, n in counts.items()}
    tokens = train(words, args.merges)
    with open(args.out, "w") as f:
        for rank, t in enumerate(tokens):
            f.write(f"{base64.b64encode(t).decode()} {rank}\n")
    longest = max(tokens, key=len)
    print(f"{args.out}: {len(tokens)} ranks from {sum(counts.values())} pieces of {', '.join(SOURCES)}; "
          f"longest token {longest!r}")


if __name__ == "__main__":
    main()
