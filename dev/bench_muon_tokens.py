#!/usr/bin/env python3
"""Tokens to the same loss, AdamW against Muon (docs/muon.md): a small GPT-2 on
Tiny Shakespeare (GPT-2 tokens), the fp32 CPU trainer.

For each optimizer the peak lr is tuned on a grid of the same size (AdamW: -l;
Muon: --muon-lr, with its AdamW part, embeddings, head, gains and biases, at
AdamW's best -l of this run, unless --muon-adamw-lr), every point with each
seed (--seed: the weight init; the data order is the same in every run), the
same steps, batch and schedule, the val loss every --eval-every steps. The
best lr of each has the lowest mean final val loss over the seeds. Then: the
first step at which Muon's mean val curve (at its best lr) reaches AdamW's
best final val loss, linearly interpolated between the two evaluations around
it, and that step over AdamW's steps.

usage: python3 dev/bench_muon_tokens.py [--out DIR] [--steps N] [--jobs J] ...   (--help)

The run folders, bench_muon_tokens.json, .md (the table) and .png (the plot;
one SKIP line where matplotlib is absent) go to --out (default build/bench-muon).
The token shards are made there from $SHARED_DATA/tinyshakespeare.txt (default
../shared/data) with build/host/prepro, llm.c's recipe, then the ids renumbered
to the 11,707 that occur (the model's V; --full-vocab: GPT-2's 50257, 4.3x the
CPU time of the embedding and head). Any problem: one "error: ..." line, exit
status 1.
"""
import argparse
import array
import concurrent.futures
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BenchError(Exception):
    pass


class Diverged(BenchError):
    """The trainer stopped on a non-finite loss: at that lr the run diverged (a result, not a failure)."""


# ---- shared with dev/lr_scaling.py -------------------------------------------------
def log_grid(low, high, count):
    """count log-spaced values from low to high, rounded to 3 significant digits."""
    return [float("%.3g" % (low * (high / low) ** (i / (count - 1)))) for i in range(count)]


def run_trainer(trainer, run_dir, args, workers):
    """Trains into a fresh run_dir; -> the steps of its main.jsonl. A failure is an error naming the run."""
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, CPUCUDA_WORKERS=str(workers))
    cmd = [trainer] + args + ["-o", run_dir]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    except OSError as e:
        raise BenchError("%s: %s" % (trainer, e))
    if p.returncode != 0:
        tail = " | ".join(p.stdout.strip().splitlines()[-3:])
        raise (Diverged if "not finite" in tail else BenchError)("%s exited with %d: %s" % (" ".join(cmd), p.returncode, tail))
    with open(os.path.join(run_dir, "main.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def val_curve(log):
    """[(step, val loss)] of a run's log."""
    return [(s["step"], s["val_loss"]) for s in log if "val_loss" in s]


def eval_steps(steps, every):
    """The steps the trainer evaluates at with -x steps -v every: 0, every multiple of every, the last."""
    return sorted(set(range(0, steps + 1, every)) | {steps})


def val_curve_or_diverged(trainer, run_dir, args, workers, steps, every):
    """A run's val curve; a diverged run's is infinite at every evaluation."""
    try:
        return val_curve(run_trainer(trainer, run_dir, args, workers))
    except Diverged:
        return [(s, math.inf) for s in eval_steps(steps, every)]


def run_all(runs, jobs, progress):
    """runs: [(name, fn)]; runs fn() for each, jobs at a time; -> {name: result}. progress(i, n, name, result, s)."""
    results, start = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        def timed(name, fn):
            start[name] = time.time()
            return fn()
        futures = {pool.submit(timed, name, fn): name for name, fn in runs}
        for i, future in enumerate(concurrent.futures.as_completed(futures), 1):
            name = futures[future]
            results[name] = future.result()  # a BenchError ends the benchmark
            progress(i, len(runs), name, results[name], time.time() - start[name])
    return results


def markdown_table(header, rows):
    line = lambda r: "| " + " | ".join(str(c) for c in r) + " |"
    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|"] + [line(r) for r in rows])


def workers_per_run(jobs):
    """The CPU runtime's threads per trainer: the cores shared out over the runs at once."""
    return max(1, (os.cpu_count() or 1) // jobs)


# ---- the data ----------------------------------------------------------------------
SHARD_HEADER_INTS, SHARD_MAGIC, SHARD_VERSION = 256, 20240520, 1  # llm.c's uint16 token shards


def read_shard(path):
    with open(path, "rb") as f:
        header = array.array("i")
        header.fromfile(f, SHARD_HEADER_INTS)
        tokens = array.array("H")
        tokens.frombytes(f.read())
    if header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION or header[2] != len(tokens):
        raise BenchError("%s: not a uint16 token shard of %d tokens" % (path, header[2]))
    return tokens


def write_shard(path, tokens):
    header = array.array("i", [SHARD_MAGIC, SHARD_VERSION, len(tokens)] + [0] * (SHARD_HEADER_INTS - 3))
    with open(path + ".tmp", "wb") as f:
        header.tofile(f)
        tokens.tofile(f)
    os.replace(path + ".tmp", path)


def shards(ctx):
    """-> (train shard, val shard, vocabulary size): Tiny Shakespeare in GPT-2 tokens, made in --out.

    Without --full-vocab the ids are renumbered to the 11,707 that occur (in order), so the model's
    embedding and head, most of the CPU time at V = 50257, are 4.3x smaller; the tokenization is GPT-2's."""
    prefix = os.path.join(ctx.out, "tinyshakespeare")
    train, val = prefix + "_train_000001.bin", prefix + "_val_000000.bin"
    if not (os.path.isfile(train) and os.path.isfile(val)):
        text = os.path.join(ctx.shared_data, "tinyshakespeare.txt")
        if not os.path.isfile(text):
            raise BenchError("%s: no such file (set SHARED_DATA to the folder of tinyshakespeare.txt and gpt2/)" % text)
        cmd = [ctx.prepro, "--out", prefix, "--split-on-blank-lines", "--val-tokens", "32768",
               "--gpt2-dir", os.path.join(ctx.shared_data, "gpt2"), text]
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            raise BenchError("%s: %s (make build/host/prepro)" % (ctx.prepro, e))
        if p.returncode != 0:
            raise BenchError("%s exited with %d: %s" % (" ".join(cmd), p.returncode, p.stdout.strip()[-200:]))
    if ctx.full_vocab:
        return train, val, 50257
    data = {path: read_shard(path) for path in (train, val)}
    ids = sorted(set(data[train]) | set(data[val]))
    index = {t: i for i, t in enumerate(ids)}
    compact = []
    for path in (train, val):
        out = path.replace("tinyshakespeare_", "tinyshakespeare_compact_")
        write_shard(out, array.array("H", (index[t] for t in data[path])))
        compact.append(out)
    return compact[0], compact[1], len(ids)


# ---- the grid ------------------------------------------------------------------------
def trainer_args(ctx, train, val, seed):
    """What every run shares: the model, data, batch, steps, schedule and evaluations."""
    return ["-i", train, "-j", val, "-e", ctx.model, "-b", str(ctx.batch), "-t", str(ctx.seq), "-x", str(ctx.steps),
            "-u", str(ctx.warmup), "-k", "cosine", "-q", "0.1", "-v", str(ctx.eval_every), "-m", str(ctx.val_batches),
            "--seed", str(seed)]


def grid(ctx, optimizer, lrs, extra, train, val):
    """Every lr with every seed; -> {lr: [val curve per seed]}."""
    flag = "-l" if optimizer == "adamw" else "--muon-lr"
    runs = []
    for lr in lrs:
        for seed in ctx.seeds:
            name = (optimizer, lr, seed)
            run_dir = os.path.join(ctx.out, "%s_lr%g_seed%d" % name)
            args = trainer_args(ctx, train, val, seed) + ["--optimizer", optimizer, flag, "%g" % lr] + extra
            runs.append((name, lambda run_dir=run_dir, args=args: val_curve_or_diverged(
                ctx.trainer, run_dir, args, ctx.workers, ctx.steps, ctx.eval_every)))

    def progress(i, n, name, curve, seconds):
        print("%s run %d/%d: lr %g seed %d: val loss %.4f at step %d (%.0f s)"
              % (name[0], i, n, name[1], name[2], curve[-1][1], curve[-1][0], seconds))
    done = run_all(runs, ctx.jobs, progress)
    return {lr: [done[(optimizer, lr, seed)] for seed in ctx.seeds] for lr in lrs}


def mean_curve(curves):
    steps = [s for s, _ in curves[0]]
    if any([s for s, _ in c] != steps for c in curves):
        raise BenchError("the seeds' runs evaluated at different steps")
    return [(s, statistics.mean(c[i][1] for c in curves)) for i, s in enumerate(steps)]


def best_lr(by_lr):
    """The lr of the lowest mean final val loss (a non-finite loss never wins)."""
    finals = {lr: mean_curve(curves)[-1][1] for lr, curves in by_lr.items()}
    return min(finals, key=lambda lr: finals[lr] if math.isfinite(finals[lr]) else math.inf)


def first_reach(curve, target):
    """The first step at which curve reaches target, linear between evaluations; None if it never does."""
    for (s0, v0), (s1, v1) in zip(curve, curve[1:]):
        if v1 <= target:
            return s0 + (s1 - s0) * (v0 - target) / (v0 - v1) if v0 > target else s0
    return None


# ---- the report -------------------------------------------------------------------
def report(ctx, results):
    adamw, muon = results["adamw"], results["muon"]
    lrs = lambda r: sorted(float(k) for k in r["runs"])
    rows = []
    for name, r in (("AdamW (-l)", adamw), ("Muon (--muon-lr)", muon)):
        for lr in lrs(r):
            finals = [c[-1][1] for c in r["runs"]["%g" % lr]]
            mark = " **best**" if lr == r["best_lr"] else ""
            rows.append([name, "%g%s" % (lr, mark), "%.4f" % statistics.mean(finals),
                         " / ".join("%.4f" % v for v in finals)])
    table = markdown_table(["optimizer", "peak lr", "final val loss (mean)", "per seed (%s)"
                            % ", ".join(str(s) for s in ctx.seeds)], rows)
    reach = results["muon_steps_to_target"]
    summary = ("AdamW's best final val loss %.4f (lr %g, %d steps); Muon (--muon-lr %g, its AdamW part at -l %g) "
               % (results["target"], adamw["best_lr"], ctx.steps, muon["best_lr"], muon["adamw_lr"]))
    if reach is None:
        summary += "does not reach it in %d steps." % ctx.steps
    else:
        summary += ("first reaches it at step %.1f (linear between evaluations every %d steps): "
                    "Muon steps / AdamW steps = %.2f." % (reach, ctx.eval_every, results["ratio"]))
    edges = [n for n, r in (("AdamW", adamw), ("Muon", muon)) if r["best_lr"] in (min(lrs(r)), max(lrs(r)))]
    if edges:
        summary += " The best lr of %s is at an edge of the grid." % " and ".join(edges)
    return table + "\n\n" + summary + "\n"


def plot(ctx, results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed; chosen before pyplot is imported
        import matplotlib.pyplot as plt
    except ImportError:
        print("SKIP plot: matplotlib is not installed (pip install matplotlib)")
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for colour, (name, r) in zip(("C0", "C1"), (("AdamW", results["adamw"]), ("Muon", results["muon"]))):
        curves = r["runs"]["%g" % r["best_lr"]]
        for c in curves:
            left.plot([s for s, _ in c], [v for _, v in c], color=colour, alpha=0.3, linewidth=0.8)
        mean = mean_curve(curves)
        left.plot([s for s, _ in mean], [v for _, v in mean], color=colour, label="%s, best lr %g (mean of %d seeds)"
                  % (name, r["best_lr"], len(curves)))
        lrs = sorted(float(k) for k in r["runs"])
        right.plot(lrs, [mean_curve(r["runs"]["%g" % lr])[-1][1] for lr in lrs], "o-", color=colour,
                   label="%s (%s)" % (name, "-l" if name == "AdamW" else "--muon-lr"))
    left.axhline(results["target"], color="grey", linestyle=":", label="AdamW's best final val loss")
    if results["muon_steps_to_target"] is not None:
        left.axvline(results["muon_steps_to_target"], color="C1", linestyle=":",
                     label="Muon reaches it: step %.1f (x%.2f)" % (results["muon_steps_to_target"], results["ratio"]))
    low = min([results["target"]] + [c[-1][1] for r in (results["adamw"], results["muon"])
                                     for curves in r["runs"].values() for c in curves])
    fig.suptitle("GPT-2 %s on Tiny Shakespeare, %d tokens per step" % (ctx.model, ctx.batch * ctx.seq))
    left.set(title="val loss at each optimizer's best lr", xlabel="step", ylabel="val loss",
             ylim=(low - 0.2, low + 3))
    left.legend(fontsize=8)
    right.set(xscale="log", title="final val loss per peak lr (%d steps)" % ctx.steps, xlabel="peak lr",
              ylabel="final val loss (mean over seeds)")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print("plot: %s" % path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/bench-muon", help="run folders, shards, results")
    ap.add_argument("--trainer", default="build/cpu-fp32/train_gpt")
    ap.add_argument("--prepro", default="build/host/prepro")
    ap.add_argument("--shared-data", default=os.environ.get("SHARED_DATA", "../shared/data"))
    ap.add_argument("--full-vocab", action="store_true", help="GPT-2's 50257 ids, not the ones that occur")
    ap.add_argument("--model", default="L=4,C=64,H=4,maxT=64", help="-e of every run, V= added")
    ap.add_argument("--batch", type=int, default=4, help="-b (sequences per step)")
    ap.add_argument("--seq", type=int, default=64, help="-t")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--val-batches", type=int, default=2, help="-m")
    ap.add_argument("--seeds", default="1,2", help="--seed of the runs (comma-separated)")
    ap.add_argument("--adamw-lrs", default="0.003:0.048:5", help="LOW:HIGH:COUNT, log-spaced")
    ap.add_argument("--muon-lrs", default="0.01:0.16:5", help="LOW:HIGH:COUNT, log-spaced")
    ap.add_argument("--muon-adamw-lr", type=float, help="-l of the Muon runs (default: AdamW's best)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (the CPU runtime's threads shared out)")
    ctx = ap.parse_args()
    for name in ("out", "trainer", "prepro", "shared_data"):
        setattr(ctx, name, os.path.abspath(getattr(ctx, name)))
    sys.stdout.reconfigure(line_buffering=True)  # one progress line per run as it ends
    try:
        ctx.seeds = [int(s) for s in ctx.seeds.split(",")]
        grids = {}
        for opt in ("adamw", "muon"):
            low, high, count = getattr(ctx, opt + "_lrs").split(":")
            grids[opt] = log_grid(float(low), float(high), int(count))
        if len(grids["adamw"]) != len(grids["muon"]):
            raise BenchError("the two lr grids must be the same size (%d, %d)" % (len(grids["adamw"]), len(grids["muon"])))
    except ValueError as e:
        print("error: --seeds / --adamw-lrs / --muon-lrs: %s" % e, file=sys.stderr)
        return 1
    ctx.workers = workers_per_run(ctx.jobs)
    try:
        if not os.access(ctx.trainer, os.X_OK):
            raise BenchError("%s: no such program (make build/cpu-fp32/train_gpt, or make bench-muon)" % ctx.trainer)
        os.makedirs(ctx.out, exist_ok=True)
        train, val, vocab = shards(ctx)
        ctx.model += ",V=%d" % vocab
        print("bench-muon: %s, %d x %d tokens per step, %d steps, seeds %s, %d runs at once"
              % (ctx.model, ctx.batch, ctx.seq, ctx.steps, ctx.seeds, ctx.jobs))
        adamw = grid(ctx, "adamw", grids["adamw"], [], train, val)
        adamw_best = best_lr(adamw)
        muon_adamw_lr = ctx.muon_adamw_lr if ctx.muon_adamw_lr is not None else adamw_best
        muon = grid(ctx, "muon", grids["muon"], ["-l", "%g" % muon_adamw_lr], train, val)
        muon_best = best_lr(muon)
        target = mean_curve(adamw[adamw_best])[-1][1]
        reach = first_reach(mean_curve(muon[muon_best]), target)
        results = {"model": ctx.model, "tokens_per_step": ctx.batch * ctx.seq, "steps": ctx.steps,
                   "warmup": ctx.warmup, "eval_every": ctx.eval_every, "val_batches": ctx.val_batches,
                   "seeds": ctx.seeds, "target": target, "muon_steps_to_target": reach,
                   "ratio": None if reach is None else reach / ctx.steps,
                   "adamw": {"best_lr": adamw_best, "runs": {"%g" % lr: c for lr, c in adamw.items()}},
                   "muon": {"best_lr": muon_best, "adamw_lr": muon_adamw_lr,
                            "runs": {"%g" % lr: c for lr, c in muon.items()}}}
        with open(os.path.join(ctx.out, "bench_muon_tokens.json"), "w") as f:
            json.dump(results, f, indent=1)
        text = report(ctx, results)
        with open(os.path.join(ctx.out, "bench_muon_tokens.md"), "w") as f:
            f.write(text)
        print("\n" + text)
    except BenchError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    plot(ctx, results, os.path.join(ctx.out, "bench_muon_tokens.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
