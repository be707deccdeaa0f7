#!/usr/bin/env python3
"""Draws the lesson's curves (dev/lesson.py's lesson.json) into one PNG:
left, claim 1: the train loss of each (B_micro, N, A) split of 512 tokens per
step, on top of each other; right, claim 7: the train loss against tokens
seen for each learning rate at the two batch sizes.

usage: python3 dev/plot_lesson.py LESSON_JSON [--out FILE.png]   (default: lesson.png beside it)

Without matplotlib it prints why and exits 0 (the plot is optional). Any other
problem: one "error: ..." line on stderr and exit status 1.
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lesson_json")
    ap.add_argument("--out")
    args = ap.parse_args()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.lesson_json)), "lesson.png")
    try:
        with open(args.lesson_json) as f:
            results = json.load(f)
        splits, lr_runs = results["claim1"]["splits"], results["claim7"]["curves"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print("error: %s: not a lesson.json of dev/lesson.py (%s)" % (args.lesson_json, e), file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed; chosen before pyplot is imported
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: skipped, matplotlib is not installed (pip install matplotlib)")
        return 0
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, s in enumerate(splits):  # dashes of growing gaps, so that curves on top of each other all show
        left.plot(range(1, len(s["losses"]) + 1), s["losses"], dashes=(4, 2 * i) if i else (), linewidth=1.5,
                  label="(B_micro, N, A) = (%d, %d, %d)" % tuple(s["split"]))
    left.set(title="claim 1: one run, however the 512 tokens of a step are split", xlabel="step", ylabel="train loss")
    left.legend()
    styles = {512: "-", 2048: "--"}
    colours = {}
    for c in lr_runs:
        colour = colours.setdefault(c["lr"], "C%d" % len(colours))
        tokens = [s * c["tokens_per_step"] for s in c["steps"]]
        right.plot(tokens, c["losses"], styles.get(c["tokens_per_step"], ":"), color=colour,
                   label="%d tokens/step, lr %g" % (c["tokens_per_step"], c["lr"]))
    right.set(title="claim 7: learning rate against tokens per step", xlabel="tokens seen", ylabel="train loss")
    right.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        print("error: %s: %s" % (out, e), file=sys.stderr)
        return 1
    print("plot: %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
