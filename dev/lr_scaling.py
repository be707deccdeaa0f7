#!/usr/bin/env python3
"""The best learning rate per tokens per step (the lesson's claim 7, docs/lesson.md):
AdamW (-l) and Muon (--muon-lr, its AdamW part at a fixed -l) on the built-in
corpus and model, the fp32 CPU trainer, the same tokens seen at every size.

For each optimizer, each tokens-per-step size and each lr of a log-spaced grid:
one run (--seed fixed), cosine to 0.1 x the peak after a warmup of 1/8 of the
steps, its final val loss. The best lr of a size: the minimum of the parabola
through the grid's best point and its two neighbours on log lr (at an edge of
the grid: that point, flagged). The scaling: the least-squares slope of
log(best lr) against log(tokens per step); within 0.2 of 1 it is called
linear, within 0.2 of 0.5 square-root, else neither.

usage: python3 dev/lr_scaling.py [--out DIR] [--budget TOKENS] [--jobs J] ...   (--help)

Writes lr_scaling.json, lr_scaling.md (the table) and lr_scaling.png (one SKIP
line where matplotlib is absent) to --out (default build/lr-grid); `make
lesson` prints the table of the committed docs/lr_scaling.json. Any problem:
one "error: ..." line, exit status 1.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_muon_tokens import BenchError, log_grid, markdown_table, run_all, val_curve_or_diverged  # noqa: E402
from bench_muon_tokens import workers_per_run  # noqa: E402

OPTIMIZERS = ("adamw", "muon")
LR_FLAG = {"adamw": "-l", "muon": "--muon-lr"}
LINEAR, SQRT, TOLERANCE = 1.0, 0.5, 0.2


# ---- the fit: also what test/trainer/test_lesson.py recomputes from the json's losses ----
def parabola_minimum(lrs, losses):
    """-> (best lr, at_edge): the vertex of the parabola through the lowest loss and its neighbours on log lr."""
    i = min(range(len(lrs)), key=lambda k: losses[k] if math.isfinite(losses[k]) else math.inf)
    if i == 0 or i == len(lrs) - 1:
        return lrs[i], True
    x = [math.log(lrs[k]) for k in (i - 1, i, i + 1)]
    y = [losses[k] for k in (i - 1, i, i + 1)]
    # the vertex of the Lagrange parabola; the middle point is the lowest, so it opens upwards
    num = (x[1] - x[0]) ** 2 * (y[1] - y[2]) - (x[1] - x[2]) ** 2 * (y[1] - y[0])
    den = (x[1] - x[0]) * (y[1] - y[2]) - (x[1] - x[2]) * (y[1] - y[0])
    return math.exp(x[1] - 0.5 * num / den) if den != 0 else lrs[i], False


def scaling_exponent(tokens, best_lrs):
    """The least-squares slope of log(best lr) on log(tokens per step)."""
    x, y = [math.log(t) for t in tokens], [math.log(lr) for lr in best_lrs]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def verdict(exponent):
    if abs(exponent - LINEAR) <= TOLERANCE:
        return "linear"
    if abs(exponent - SQRT) <= TOLERANCE:
        return "square-root"
    return "neither"


def analyse(runs):
    """runs: {optimizer: {"lrs": [...], "sizes": {tokens: [final val loss per lr]}}} -> the fits per optimizer."""
    fits = {}
    for opt, r in runs.items():
        tokens = sorted(int(t) for t in r["sizes"])
        best = {t: parabola_minimum(r["lrs"], r["sizes"][str(t)]) for t in tokens}
        exponent = scaling_exponent(tokens, [best[t][0] for t in tokens])
        fits[opt] = {"best_lr": {str(t): best[t][0] for t in tokens}, "at_edge": {str(t): best[t][1] for t in tokens},
                     "exponent": exponent, "verdict": verdict(exponent)}
    return fits


def table(results, opt):
    """(header, rows) of claim 7's table of one optimizer: one row per tokens per step."""
    r, fit = results["runs"][opt], results["fits"][opt]
    header = ["tokens per step", "steps"] + ["%s %g" % (LR_FLAG[opt], lr) for lr in r["lrs"]] + ["best lr"]
    rows = []
    for t in sorted(int(t) for t in r["sizes"]):
        edge = " (grid edge)" if fit["at_edge"][str(t)] else ""
        rows.append([str(t), str(results["budget"] // t)] + ["%.4f" % v for v in r["sizes"][str(t)]]
                    + ["%.3g%s" % (fit["best_lr"][str(t)], edge)])
    return header, rows


def title(results, opt):
    extra = ", its AdamW part at -l %g" % results["muon_adamw_lr"] if opt == "muon" else ""
    return ("%s%s: final val loss after %d tokens (cosine to 0.1x, warmup 1/8 of the steps), per peak lr"
            % ({"adamw": "AdamW", "muon": "Muon"}[opt], extra, results["budget"]))


def conclusion(results, opt):
    fit = results["fits"][opt]
    return ("%s: best lr ~ (tokens per step)^%.2f: %s (linear 1, square-root 0.5, each +-%g)"
            % (opt, fit["exponent"], fit["verdict"], TOLERANCE))


def markdown(results):
    parts = []
    for opt in OPTIMIZERS:
        parts += [title(results, opt) + "\n", markdown_table(*table(results, opt)) + "\n", conclusion(results, opt) + "\n"]
    return "\n".join(parts)


def check_results(results):
    """A well-formed lr_scaling.json, or a BenchError naming what is not."""
    try:
        if not isinstance(results["budget"], int) or results["budget"] <= 0:
            raise BenchError("budget %r" % results["budget"])
        for opt in OPTIMIZERS:
            r = results["runs"][opt]
            if len(r["lrs"]) < 7 or r["lrs"] != sorted(r["lrs"]) or len(r["sizes"]) != 3:
                raise BenchError("%s: %d lrs and %d sizes (>= 7 increasing lrs and 3 sizes)"
                                 % (opt, len(r["lrs"]), len(r["sizes"])))
            if any(len(v) != len(r["lrs"]) for v in r["sizes"].values()):
                raise BenchError("%s: a size without one loss per lr" % opt)
            results["fits"][opt]["exponent"]
    except (KeyError, TypeError) as e:
        raise BenchError("not an lr_scaling.json of dev/lr_scaling.py (%r)" % e)


# ---- the runs ----------------------------------------------------------------------
def measure(ctx):
    grids = {"adamw": log_grid(ctx.adamw_low, ctx.adamw_high, ctx.points),
             "muon": log_grid(ctx.muon_low, ctx.muon_high, ctx.points)}
    jobs = []
    for opt in OPTIMIZERS:
        for t in ctx.sizes:
            steps = ctx.budget // t
            for lr in grids[opt]:
                args = ["-b", str(t // ctx.seq), "-t", str(ctx.seq), "-d", str(t), "-x", str(steps),
                        "-u", str(max(1, steps // 8)), "-k", "cosine", "-q", "0.1", "-v", str(steps),
                        "-m", str(ctx.val_tokens // t), "--seed", str(ctx.seed), "--optimizer", opt,
                        LR_FLAG[opt], "%g" % lr]
                if opt == "muon":
                    args += ["-l", "%g" % ctx.muon_adamw_lr]
                run_dir = os.path.join(ctx.out, "%s_%d_lr%g" % (opt, t, lr))
                jobs.append(((opt, t, lr), lambda d=run_dir, a=args, s=steps: val_curve_or_diverged(
                    ctx.trainer, d, a, ctx.workers, s, s)))

    def progress(i, n, name, curve, seconds):
        print("lr-grid run %d/%d: %s %d tokens/step %s %g: val loss %.4f -> %.4f (%.0f s)"
              % (i, n, name[0], name[1], LR_FLAG[name[0]], name[2], curve[0][1], curve[-1][1], seconds))
    done = run_all(jobs, ctx.jobs, progress)
    if any(not done[k][-1][1] < done[k][0][1] for k in done):
        print("note: some runs end at or above their initial val loss (diverged at that lr)")
    runs = {opt: {"lrs": grids[opt], "sizes": {str(t): [done[(opt, t, lr)][-1][1] for lr in grids[opt]]
                                               for t in ctx.sizes}} for opt in OPTIMIZERS}
    results = {"corpus": "built-in", "seq": ctx.seq, "budget": ctx.budget, "seed": ctx.seed,
               "val_tokens": ctx.val_tokens, "muon_adamw_lr": ctx.muon_adamw_lr, "runs": runs,
               "val_start": {opt: done[(opt, ctx.sizes[0], grids[opt][0])][0][1] for opt in OPTIMIZERS}}
    results["fits"] = analyse(runs)
    return results


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed; chosen before pyplot is imported
        import matplotlib.pyplot as plt
    except ImportError:
        print("SKIP plot: matplotlib is not installed (pip install matplotlib)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, opt in zip(axes, OPTIMIZERS):
        r, fit = results["runs"][opt], results["fits"][opt]
        for i, t in enumerate(sorted(int(t) for t in r["sizes"])):
            ax.plot(r["lrs"], r["sizes"][str(t)], "o-", color="C%d" % i, label="%d tokens/step (%d steps)"
                    % (t, results["budget"] // t))
            ax.axvline(fit["best_lr"][str(t)], color="C%d" % i, linestyle=":")
        finals = [v for vs in r["sizes"].values() for v in vs if math.isfinite(v)]
        extra = " (-l %g)" % results["muon_adamw_lr"] if opt == "muon" else ""
        ax.set(xscale="log", xlabel="peak %s%s" % (LR_FLAG[opt], extra), ylabel="final val loss",
               ylim=(min(finals) - 0.1, min(max(finals), min(finals) + 2.5) + 0.1),
               title="%s: best lr ~ tokens^%.2f (%s), %d tokens seen" % (opt, fit["exponent"], fit["verdict"],
                                                                        results["budget"]))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print("plot: %s" % path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/lr-grid", help="run folders and results")
    ap.add_argument("--trainer", default="build/cpu-fp32/train_gpt")
    ap.add_argument("--budget", type=int, default=16384, help="tokens seen by every run")
    ap.add_argument("--sizes", default="64,128,256", help="tokens per step (multiples of --seq)")
    ap.add_argument("--seq", type=int, default=64, help="-t")
    ap.add_argument("--points", type=int, default=7, help="lrs per grid")
    ap.add_argument("--adamw-low", type=float, default=0.001)
    ap.add_argument("--adamw-high", type=float, default=0.064)
    ap.add_argument("--muon-low", type=float, default=0.005)
    ap.add_argument("--muon-high", type=float, default=0.32)
    ap.add_argument("--muon-adamw-lr", type=float, default=0.008, help="-l of the Muon runs")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--val-tokens", type=int, default=2048, help="the val loss over this many tokens (-m of each size)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (the CPU runtime's threads shared out)")
    ctx = ap.parse_args()
    ctx.out, ctx.trainer = os.path.abspath(ctx.out), os.path.abspath(ctx.trainer)
    ctx.workers = workers_per_run(ctx.jobs)
    sys.stdout.reconfigure(line_buffering=True)  # one progress line per run as it ends
    try:
        try:
            ctx.sizes = [int(t) for t in ctx.sizes.split(",")]
        except ValueError:
            raise BenchError("--sizes %r: not comma-separated integers" % ctx.sizes)
        if (len(ctx.sizes) != 3 or ctx.sizes != sorted(set(ctx.sizes)) or ctx.points < 3
                or any(t % ctx.seq or ctx.budget // t < 8 or ctx.val_tokens % t for t in ctx.sizes)):
            raise BenchError("--sizes: 3 increasing multiples of --seq, each with at least 8 steps in --budget and dividing "
                             "--val-tokens; "
                             "--points >= 3")
        if not os.access(ctx.trainer, os.X_OK):
            raise BenchError("%s: no such program (make build/cpu-fp32/train_gpt, or make lr-grid)" % ctx.trainer)
        os.makedirs(ctx.out, exist_ok=True)
        results = measure(ctx)
        with open(os.path.join(ctx.out, "lr_scaling.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(ctx.out, "lr_scaling.md"), "w") as f:
            f.write(markdown(results))
        print("\n" + markdown(results))
    except BenchError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    plot(results, os.path.join(ctx.out, "lr_scaling.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
