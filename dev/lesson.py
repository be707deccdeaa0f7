#!/usr/bin/env python3
"""The lesson in numbers: small experiments that show, with measured numbers,
what large-batch training with gradient accumulation does and does not do.
One table per claim (README.md, "The lesson in numbers").

usage: python3 dev/lesson.py [--quick] [--out DIR] [--json FILE] [--no-plot]
                             [--trainer BIN] [--trainer-bf16 BIN] [--lesson BIN]

Runs the trainer (default build/cpu-fp32/train_gpt: fp32, so that splits agree
to float rounding) on its built-in corpus, and dev/lesson.cu's program
(build/cpu-fp32/lesson) where a claim needs the trainer's functions in-process:
  1 the same tokens per step split as (B_micro, N, A): same losses, same weights
  2 the loss normalised by the global count of targets, against the mean of
    micro-batch means, on packed and on padded (slot) data
  3 weights frozen between micro-batches; one optimizer step per global batch
  4 the memory plan per part (d12, T = 1024) for B_micro, -r, -z and precision
  5 tokens/s per split; the model FLOPs per step and the launches per step
  6 NCCL calls and bytes per optimizer step for A = 1, 2, 4, 8
  7 the best learning rate at three tokens-per-step sizes, the same tokens seen,
    AdamW and Muon: the committed table of `make lr-grid` (docs/lr_scaling.json)
  8 BatchNorm against LayerNorm on micro-batches (arithmetic, no run)
--quick runs fewer steps (test/trainer/test_lesson.py). The run folders, the results
(lesson.json) and the plot (lesson.png, dev/plot_lesson.py) go to --out
(default build/lesson). Any problem: one "error: ..." line, exit status 1.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none", "-x", "CPUCUDA_WORKERS=1"]
MODEL_HEADER_INTS = 256
sys.path.insert(0, os.path.join(ROOT, "dev"))
import lr_scaling  # noqa: E402  (claim 7's table)


class LessonError(Exception):
    pass


def execute(cmd, env=None):
    """stdout + stderr of cmd; a failure is an error naming the command."""
    full_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **(env or {}))
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env)
    except OSError as e:
        raise LessonError("%s: %s" % (cmd[0], e))
    if p.returncode != 0:
        tail = p.stdout.strip().splitlines()[-3:]
        raise LessonError("%s exited with %d: %s" % (" ".join(cmd), p.returncode, " | ".join(tail)))
    return p.stdout


def launch(binary, ranks, args):
    return (MPIRUN + ["-np", str(ranks)] if ranks > 1 else []) + [binary] + args


def train(ctx, name, args, ranks=1, env=None):
    """Runs the trainer into a fresh folder; -> (its steps from main.jsonl, its output, the folder)."""
    run_dir = os.path.join(ctx.out, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    output = execute(launch(ctx.trainer, ranks, args + ["-o", run_dir]), env)
    with open(os.path.join(run_dir, "main.jsonl")) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    return steps, output, run_dir


def check_split(output, split):
    """The trainer's own account of the batch is the split the table names."""
    m = re.search(r"^batch: B=(\d+) x T=\d+ x N=(\d+) x A=(\d+)", output, re.M)
    if not m or tuple(int(v) for v in m.groups()) != tuple(split):
        raise LessonError("the trainer ran %s, not (B_micro, N, A) = %s" % (m.group(0) if m else "no batch line", split))


def model_weights(run_dir):
    """The weights of the newest model_*.bin of a run (fp32: version 3)."""
    names = sorted(n for n in os.listdir(run_dir) if re.fullmatch(r"model_\d+\.bin", n))
    with open(os.path.join(run_dir, names[-1]), "rb") as f:
        header = struct.unpack("<%di" % MODEL_HEADER_INTS, f.read(4 * MODEL_HEADER_INTS))
        if header[1] != 3:
            raise LessonError("%s: version %d; the weight comparison reads fp32 models (--trainer build/cpu-fp32/train_gpt)"
                              % (names[-1], header[1]))
        data = f.read()
    return struct.unpack("<%df" % (len(data) // 4), data)


def lesson_json(ctx, args, ranks=1):
    return [json.loads(line) for line in execute(launch(ctx.lesson, ranks, args)).splitlines() if line.startswith("{")]


def table(title, header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    print("\n" + title)
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


# ---- claim 1: one training run, however the tokens of a step are split ------
SPLITS_1 = [(8, 1, 1), (4, 1, 2), (2, 2, 2), (1, 4, 2)]  # (B_micro, N, A): 8 x 64 = 512 tokens per step


def claim1(ctx):
    steps = 3 if ctx.quick else 20
    runs = {}
    for B, N, A in SPLITS_1:
        log, output, run_dir = train(ctx, "split_%d_%d_%d" % (B, N, A),
                                     ["-b", str(B), "-d", "512", "-x", str(steps), "-v", "0"], ranks=N)
        check_split(output, (B, N, A))
        runs[(B, N, A)] = ([s["loss"] for s in log if "loss" in s], model_weights(run_dir))
    ref_losses, ref_w = runs[SPLITS_1[0]]
    scale = max(abs(w) for w in ref_w)
    rows, result = [], {"steps": steps, "splits": []}
    for split in SPLITS_1:
        losses, w = runs[split]
        loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses))
        w_diff = max(abs(a - b) for a, b in zip(w, ref_w)) / scale
        rows.append(["(%d, %d, %d)" % split, "%.6f" % losses[0], "%.6f" % losses[-1], "%.1e" % loss_diff, "%.1e" % w_diff])
        result["splits"].append({"split": list(split), "losses": losses, "loss_diff": loss_diff, "weight_diff": w_diff})
    table("Claim 1. 512 tokens per step as (B_micro, N, A), %d steps (fp32 build): one training run" % steps,
          ["(B_micro, N, A)", "loss step 1", "loss step %d" % steps, "max loss diff vs (8,1,1)",
           "final weights: max diff / max weight"], rows)
    return result


# ---- claim 2: the loss is a mean over the whole global batch ----------------
def claim2(ctx):
    results = lesson_json(ctx, ["normalisation"])
    rows = []
    for r in results:
        for rule, loss, err in (("1/G, G counted over the global batch (train_gpt)", r["loss_global"], r["grad_err_global"]),
                                ("mean of micro-batch means / A", r["loss_mean_of_means"], r["grad_err_mean_of_means"])):
            rows.append([r["data"], "+".join(map(str, r["counts"])) + " = %d" % r["G"], rule, "%.6f" % loss, "%.1e" % err])
    table("Claim 2. 8 sequences as 4 micro-batches of 2, against one micro-batch of 8 (loss %.6f on slots)"
          % results[1]["loss_one"], ["data", "counted targets per micro-batch", "normalisation", "loss",
                                     "gradient: max error / max |g|"], rows)
    return results


# ---- claim 3: weights frozen between micro-batches ----------------------------
def claim3(ctx):
    results = lesson_json(ctx, ["frozen"])
    rows = [[r["after"], "%.1e" % r["weight_change"], "%.1e" % r["state_change"], r["adam_steps"], "%.4e" % r["grad_max"]]
            for r in results if "after" in r]
    summary = results[-1]
    table("Claim 3. One step of 4 micro-batches of 2 sequences, lr 1e-3", ["after", "max |w - w_0|",
          "max change of w, master, m, v", "optimizer steps", "max |gradient buffer|"], rows)
    print("train_step over the 4 micro-batches gives these weights to %.1e; an optimizer step after every "
          "micro-batch (%d steps) lands %.1e away (one update moves a weight by at most %.1e)"
          % (summary["diff_train_step"], summary["adam_steps_per_micro_batch"], summary["diff_step_per_micro_batch"],
             summary["update_size"]))
    return results


# ---- claim 4: what accumulation saves, and what the other tools save --------
PLAN_PARTS = [("parameters", ["parameters"]), ("fp32 gradients", ["fp32 gradients"]),
              ("master + m + v (+ shard)", ["fp32 master weights", "AdamW m and v", "ZeRO-1 gradient shard"]),
              ("activations", ["activations (B x T x C x L)"]), ("logits", ["logits (B x T x Vp)"]),
              ("scratch", ["backward scratch", "inputs and step statistics", "cuBLASLt workspace"])]


def memory_plan(ctx, trainer, B, extra=(), ranks=1):
    out = execute(launch(trainer, ranks, ["--memory-plan", "1", "-e", "d12", "-t", "1024", "-b", str(B)] + list(extra)))
    lines = dict((m.group(1).strip(), float(m.group(2))) for m in re.finditer(r"^  (.+?)\s+([\d.]+) MiB", out, re.M))
    parts = {name: sum(lines.get(k, 0.0) for k in keys) for name, keys in PLAN_PARTS}
    parts["total"] = lines["total"]
    return parts


def claim4(ctx):
    cases = [("B_micro 64, A 1", ctx.trainer_bf16, 64, (), 1), ("B_micro 32, A 2", ctx.trainer_bf16, 32, (), 1),
             ("B_micro 16, A 4", ctx.trainer_bf16, 16, (), 1), ("B_micro 8, A 8", ctx.trainer_bf16, 8, (), 1),
             ("B_micro 8, A 8, -r 1", ctx.trainer_bf16, 8, ("-r", "1"), 1),
             ("B_micro 8, A 8, -r 2", ctx.trainer_bf16, 8, ("-r", "2"), 1),
             ("B_micro 8, N 4, A 2, -z 1", ctx.trainer_bf16, 8, ("-z", "1"), 4),
             ("B_micro 8, A 8, fp32 build", ctx.trainer, 8, (), 1)]
    result = []
    for label, trainer, B, extra, ranks in cases:
        result.append({"case": label, "B": B, "plan": memory_plan(ctx, trainer, B, extra, ranks)})
    names = [n for n, _ in PLAN_PARTS] + ["total"]
    table("Claim 4. Memory per rank (MiB), d12, T = 1024, B_global = 64 sequences; bf16 build unless said",
          ["case"] + names, [[r["case"]] + ["%.0f" % r["plan"][n] for n in names] for r in result])
    return result


# ---- claim 5: accumulation saves no compute ------------------------------------
SPLITS_5 = [(8, 1, 1), (4, 1, 2), (2, 1, 4), (1, 1, 8)]


def claim5(ctx):
    steps = 3 if ctx.quick else 8
    rows, result = [], []
    for B, N, A in SPLITS_5:
        log, output, _ = train(ctx, "speed_%d_%d_%d" % (B, N, A), ["-b", str(B), "-d", "512", "-x", str(steps), "-v", "0"],
                               env={"CPUCUDA_PROFILE": "1"})
        check_split(output, (B, N, A))
        params = int(re.search(r"(\d+) parameters", output).group(1))
        L, C = (int(v) for v in re.search(r"model: L=(\d+) C=(\d+)", output).groups())
        flops = 512 * (6.0 * params + 6.0 * L * C * 64)  # llmc/run/mfu.h flops_per_token x tokens per step
        calls = {m.group(2): int(m.group(1)) for m in re.finditer(r"^\s+[\d.]+ s\s+[\d.]+%\s+(\d+) calls\s+(\S+)", output, re.M)}
        matmuls = calls.get("cublasLtMatmul", 0) / steps
        kernels = (sum(calls.values()) - calls.get("cublasLtMatmul", 0)) / steps
        tok_s = statistics.median(s["tok_per_s"] for s in log[1:] if "tok_per_s" in s)  # step 1 warms up
        rows.append(["(%d, %d, %d)" % (B, N, A), "%.3g" % flops, "%.0f" % matmuls, "%.0f" % kernels, "%.0f" % tok_s])
        result.append({"split": [B, N, A], "flops": flops, "matmuls_per_step": matmuls, "kernels_per_step": kernels,
                       "tok_per_s": tok_s})
    table("Claim 5. 512 tokens per step, %d steps; tokens/s is the median after step 1 (printed, never asserted)" % steps,
          ["(B_micro, N, A)", "model FLOPs per step", "matmuls per step", "kernel launches per step", "tokens/s"], rows)
    return result


# ---- claim 6: communication per optimizer step --------------------------------
# What a ring sends per rank for each collective of S bytes (the counters' bytes): all-reduce
# 2 (N-1)/N S (a reduce-scatter, then an all-gather), the others (N-1)/N S.
def ring_bytes_per_rank(by_kind, N):
    return round(sum(v * (2 if k == "all_reduce" else 1) for k, v in by_kind.items()) * (N - 1) / N)


# The same per kind from the model's shapes alone: G = 4 P fp32 gradient bytes, the floatX weight
# bytes W = P x floatX (M x floatX for Muon's matrices), the step's loss and (ZeRO >= 1) the squared
# norm, 4 bytes each, all-reduced. ZeRO-0 all-reduces G once; ZeRO-1 reduce-scatters it once and
# ZeRO-2 and 3 every micro-batch (A times), then all-gather W; ZeRO-3 gathers the layers' weights
# (P_l elements) before each layer's forward and backward (2A times) and the rest once after the
# update; Muon sends its matrices' weights from their owners (broadcast) and, under ZeRO-1, reduces
# their gradients to them. (Every size here divides by N: no tails.)
def bytes_from_shapes(r):
    G, A, zero = r["gradient_bytes"], r["A"], r["zero"]
    P, X, M = G // 4, r["floatx_bytes"], r.get("muon_elements", 0)
    muon = r.get("optimizer", "adamw") == "muon"
    kinds = {"all_reduce": 4 + (4 if zero >= 1 else 0), "reduce_scatter": 0, "all_gather": 0, "broadcast": 0,
             "reduce": 0}
    if zero == 0:
        kinds["all_reduce"] += G
    else:
        times = A if zero >= 2 else 1
        kinds["reduce_scatter"] = times * 4 * (P - (M if muon else 0))
        kinds["reduce"] = times * 4 * M if muon else 0
        kinds["all_gather"] = X * (P - (M if muon else 0))
        if zero == 3:
            kinds["all_gather"] = X * (2 * A * r["layer_elements"] + P - r["layer_elements"])
    kinds["broadcast"] = X * M if muon else 0
    return {"bytes": kinds, "ring_bytes_per_rank": ring_bytes_per_rank(kinds, r["N"])}


def claim6(ctx):
    try:
        results = lesson_json(ctx, ["bytes"], ranks=2)
    except LessonError as e:  # a GPU build has no counters (and one lent GPU, no second rank)
        print("\nClaim 6. skipped: %s" % e)
        return [{"skipped": str(e)}]
    rows = []
    for r in results:
        b = r["bytes"]
        reduced = b["all_reduce"] + b["reduce_scatter"] + b["reduce"]
        r["reduced_over_gradient"] = reduced / r["gradient_bytes"]
        r["total_bytes"] = sum(b.values())
        r["ring_bytes_per_rank"] = ring_bytes_per_rank(b, r["N"])
        r["shapes"] = bytes_from_shapes(r)
        calls = sum(r["calls"].values())
        rows.append([r.get("optimizer", "adamw"), "ZeRO-%d" % r["zero"], r["A"], calls, reduced,
                     b["all_gather"] + b["broadcast"], r["gradient_bytes"], "%.5f" % r["reduced_over_gradient"],
                     r["ring_bytes_per_rank"], r["shapes"]["ring_bytes_per_rank"],
                     r["gradient_memory"], r["gradient_bytes"] // r["N"]])
    table("Claim 6. NCCL per optimizer step, N = 2 ranks, B_micro = 1 (the CPU runtime's counters)",
          ["optimizer", "ZeRO", "A", "collective calls", "bytes reduced", "bytes gathered", "gradient bytes",
           "reduced / gradient", "sent per rank (ring)", "sent per rank, from the shapes", "gradient memory per rank",
           "gradient bytes / N"], rows)
    print("(the bytes beyond one gradient: the step's loss, and under ZeRO-1 to 3 the squared norm, 4 bytes each; "
          "a ring sends (N-1)/N of each collective's bytes per rank, twice for an all-reduce; "
          "ZeRO-2 reduces every micro-batch, A gradients' worth, to hold a 2-layer staging buffer, the shard and a "
          "receive buffer instead of the whole gradient and the shard; ZeRO-3 also gathers each layer's weights "
          "before its forward and its backward, 2A times a step; "
          "Muon: each matrix reduced to its owner rank under ZeRO-1, and the owner's new weights broadcast, "
          "%d bytes each in this build)" % results[0].get("floatx_bytes", 4))
    return results


# ---- claim 7: tokens per step change the optimisation --------------------------
LR_GRID_JSON = os.path.join("docs", "lr_scaling.json")  # `make lr-grid` (dev/lr_scaling.py), about 30 minutes


def claim7(ctx):
    """The committed lr grid's tables: the grid takes half an hour, so the lesson reads it, not reruns it."""
    path = os.path.join(ROOT, LR_GRID_JSON)
    try:
        with open(path) as f:
            results = json.load(f)
        lr_scaling.check_results(results)
    except (OSError, ValueError, lr_scaling.BenchError) as e:
        raise LessonError("%s: %s (make lr-grid writes build/lr-grid/lr_scaling.json)" % (LR_GRID_JSON, e))
    for opt in lr_scaling.OPTIMIZERS:
        table("Claim 7. " + lr_scaling.title(results, opt), *lr_scaling.table(results, opt))
        print("(%s)" % lr_scaling.conclusion(results, opt))
    print("(%s, measured by `make lr-grid`; best lr: the parabola through the lowest loss and its neighbours on "
          "log lr)" % LR_GRID_JSON)
    return results


# ---- claim 8: LayerNorm is per token, BatchNorm per batch ----------------------
def normalise(values):
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return [(v - mean) / (var + 1e-5) ** 0.5 for v in values]


def claim8():
    x = [[1.0, 2.0, 6.0], [3.0, 0.0, 3.0], [8.0, 4.0, 0.0], [4.0, 6.0, 2.0]]  # 4 tokens x 3 channels
    layer = lambda rows: [normalise(r) for r in rows]  # each token over its channels
    def batch(rows):  # each channel over the tokens of the batch
        cols = [normalise([r[c] for r in rows]) for c in range(len(rows[0]))]
        return [[cols[c][t] for c in range(len(cols))] for t in range(len(rows))]
    full_ln, micro_ln = layer(x), layer(x[:2]) + layer(x[2:])
    full_bn, micro_bn = batch(x), batch(x[:2]) + batch(x[2:])
    fmt = lambda v: "[" + ", ".join("%+.3f" % a for a in v) + "]"
    rows = [["LayerNorm", fmt(full_ln[0]), fmt(micro_ln[0])], ["BatchNorm", fmt(full_bn[0]), fmt(micro_bn[0])]]
    table("Claim 8. Token 0 of a batch of 4 tokens x 3 channels %s, normalised in the batch of 4 and in "
          "micro-batches of 2" % x, ["norm", "batch of 4", "micro-batch of 2"], rows)
    diff = lambda a, b: max(abs(p - q) for ra, rb in zip(a, b) for p, q in zip(ra, rb))
    return {"layernorm_diff": diff(full_ln, micro_ln), "batchnorm_diff": diff(full_bn, micro_bn)}


def main():
    ap = argparse.ArgumentParser(description="The lesson in numbers: one table per claim.")
    ap.add_argument("--quick", action="store_true", help="fewer steps (the test)")
    ap.add_argument("--out", default="build/lesson", help="run folders, lesson.json, lesson.png")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--trainer", default="build/cpu-fp32/train_gpt", help="fp32 trainer (claims 1 and 5)")
    ap.add_argument("--trainer-bf16", default="build/cpu/train_gpt", help="bf16 trainer (claim 4's plans)")
    ap.add_argument("--lesson", default="build/cpu-fp32/lesson", help="dev/lesson.cu built (claims 2, 3, 6)")
    ctx = ap.parse_args()
    # given paths from here, defaults from the repository, whose build/markov the runs share
    for name in ("out", "json", "trainer", "trainer_bf16", "lesson"):
        value = getattr(ctx, name)
        if value:
            given = value != ap.get_default(name)
            setattr(ctx, name, os.path.abspath(value) if given else os.path.join(ROOT, value))
    os.chdir(ROOT)
    sys.stdout.reconfigure(line_buffering=True)  # each table as soon as it is measured
    try:
        for path in (ctx.trainer, ctx.trainer_bf16, ctx.lesson):
            if not os.access(path, os.X_OK):
                raise LessonError("%s: no such program (make build/cpu-fp32/train_gpt build/cpu-fp32/lesson "
                                  "build/cpu/train_gpt, or make lesson)" % path)
        os.makedirs(ctx.out, exist_ok=True)
        results = {"quick": ctx.quick}
        for n, claim in ((1, claim1), (2, claim2), (3, claim3), (4, claim4), (5, claim5), (6, claim6), (7, claim7)):
            results["claim%d" % n] = claim(ctx)
        results["claim8"] = claim8()
        for path in filter(None, (os.path.join(ctx.out, "lesson.json"), ctx.json)):
            with open(path, "w") as f:
                json.dump(results, f, indent=1)
    except LessonError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    if not ctx.no_plot:
        plot = [sys.executable, os.path.join(ROOT, "dev", "plot_lesson.py"), os.path.join(ctx.out, "lesson.json")]
        print("\n" + subprocess.run(plot, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
