#!/usr/bin/env python3
"""Draws the lesson's curves (dev/lesson.py's lesson.json) into one PNG:
left, claim 1: the train loss of each (B_micro, N, A) split of 512 tokens per
step, on top of each other; right, claim 7: the final val loss against the
peak learning rate at each tokens-per-step size, AdamW and Muon (the committed
grid of dev/lr_scaling.py), the best lr of each size marked.

usage: python3 dev/plot_lesson.py LESSON_JSON [--out FILE.png]   (default: lesson.png beside it)

Without matplotlib it prints why and exits 0 (the plot is optional). Any other
problem: one "error: ..." line on stderr and exit status 1.
"""
import argparse
import json
import math
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
        splits, grid = results["claim1"]["splits"], results["claim7"]
        sizes = {opt: (grid["runs"][opt]["lrs"], grid["runs"][opt]["sizes"], grid["fits"][opt]["best_lr"])
                 for opt in ("adamw", "muon")}
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
    styles = {"adamw": "o-", "muon": "s--"}
    for opt, (lrs, losses, best) in sizes.items():
        for i, tokens in enumerate(sorted(losses, key=int)):
            line, = right.plot(lrs, losses[tokens], styles[opt], color="C%d" % i, markersize=3,
                               label="%s, %s tokens/step (best %.3g)" % (opt, tokens, best[tokens]))
            right.plot([best[tokens]], [min(losses[tokens])], "v", color=line.get_color(), markersize=8)
    finite = [v for _, losses, _ in sizes.values() for vs in losses.values() for v in vs if math.isfinite(v)]
    right.set_ylim(min(finite) - 0.1, min(max(finite), min(finite) + 2.5) + 0.1)  # a diverged lr off the top
    right.set(xscale="log", title="claim 7: final val loss per peak lr (-l; Muon: --muon-lr), the same tokens",
              xlabel="peak lr", ylabel="final val loss")
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
