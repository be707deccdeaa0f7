#!/usr/bin/env python3
"""Runs the lesson reduced (dev/lesson.py --quick) and checks that each claim
its tables print holds. Nothing depends on wall-clock time: tokens/s is
printed by the lesson, never checked here.

usage: python3 test/trainer/test_lesson.py FP32_TRAINER BF16_TRAINER FP32_LESSON
"""
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # test/checks.py
from checks import Checks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    if len(sys.argv) != 4:
        print("error: usage: test_lesson.py FP32_TRAINER BF16_TRAINER FP32_LESSON", file=sys.stderr)
        return 2
    check = Checks()
    with tempfile.TemporaryDirectory() as out:
        results_path = os.path.join(out, "results.json")
        p = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "lesson.py"), "--quick", "--no-plot",
                            "--out", out, "--json", results_path, "--trainer", sys.argv[1],
                            "--trainer-bf16", sys.argv[2], "--lesson", sys.argv[3]],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        print(p.stdout)
        check("dev/lesson.py --quick exits 0 and prints a table for each of the 8 claims",
              p.returncode == 0 and all("Claim %d." % n in p.stdout for n in range(1, 9)))
        if p.returncode != 0:
            check.tally("test_lesson")
            return 1
        with open(results_path) as f:
            r = json.load(f)
        check_claims(check, r, p.stdout)
        plot = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "plot_lesson.py"), results_path],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        check("dev/plot_lesson.py draws the PNG, or says matplotlib is absent (%s)" % plot.stdout.strip(),
              plot.returncode == 0 and (os.path.exists(os.path.join(out, "lesson.png")) or "skipped" in plot.stdout))
    check.tally("test_lesson")
    return 0 if check.failed == 0 else 1


def check_claims(check, r, printed):
    splits = r["claim1"]["splits"]
    check("claim 1: every (B_micro, N, A) split gives the losses of (8,1,1) within 1e-5 (worst %.1e)"
          % max(s["loss_diff"] for s in splits), all(s["loss_diff"] <= 1e-5 for s in splits))
    check("claim 1: and its final weights within 5e-5 of the largest weight (worst %.1e)"
          % max(s["weight_diff"] for s in splits), all(s["weight_diff"] <= 5e-5 for s in splits))

    packed, slots = r["claim2"]
    check("claim 2: on packed data (equal counts) both normalisations give the one-micro-batch gradient (%.1e, %.1e)"
          % (packed["grad_err_global"], packed["grad_err_mean_of_means"]),
          packed["grad_err_global"] <= 1e-5 and packed["grad_err_mean_of_means"] <= 1e-5)
    check("claim 2: on slots (counts %s) 1/G gives it (%.1e), the mean of micro-batch means is off by %.0f%%"
          % (slots["counts"], slots["grad_err_global"], 100 * slots["grad_err_mean_of_means"]),
          slots["grad_err_global"] <= 1e-5 and slots["grad_err_mean_of_means"] >= 1e-2
          and len(set(slots["counts"])) > 1)

    rows = [x for x in r["claim3"] if "after" in x]
    micro, update, summary = rows[:-1], rows[-1], r["claim3"][-1]
    check("claim 3: after each of the %d micro-batches the weights, master weights, m and v are bitwise the start's "
          "and no optimizer step was taken" % len(micro),
          all(x["weight_change"] == 0 and x["state_change"] == 0 and x["adam_steps"] == 0 for x in micro))
    check("claim 3: update_parameters moves them once (max %.1e, 1 step)" % update["weight_change"],
          update["weight_change"] > 0 and update["adam_steps"] == 1)
    check("claim 3: train_step gives bitwise those weights; stepping per micro-batch does not (%.1e away)"
          % summary["diff_step_per_micro_batch"],
          summary["diff_train_step"] == 0 and summary["diff_step_per_micro_batch"] > 1e-4)

    plans = {x["case"]: x["plan"] for x in r["claim4"]}
    by_b = [plans["B_micro %d, A %d" % (b, 64 // b)] for b in (64, 32, 16, 8)]
    fixed = ("parameters", "fp32 gradients", "master + m + v (+ shard)")
    check("claim 4: activations and logits halve with B_micro (64, 32, 16, 8): %s MiB"
          % ", ".join("%.0f" % p["activations"] for p in by_b),
          all(abs(a["activations"] - 2 * b["activations"]) <= 1 and abs(a["logits"] - 2 * b["logits"]) <= 1
              for a, b in zip(by_b, by_b[1:])))
    check("claim 4: parameters, gradients and optimizer state stay with B_micro",
          all(p[k] == by_b[0][k] for p in by_b for k in fixed))
    base, r1, r2 = by_b[-1], plans["B_micro 8, A 8, -r 1"], plans["B_micro 8, A 8, -r 2"]
    zero, fp32 = plans["B_micro 8, N 4, A 2, -z 1"], plans["B_micro 8, A 8, fp32 build"]
    check("claim 4: -r 1 and -r 2 cut activations only (%.0f, %.0f, %.0f MiB)"
          % (base["activations"], r1["activations"], r2["activations"]),
          base["activations"] > r1["activations"] > r2["activations"] and all(p[k] == base[k] for p in (r1, r2) for k in fixed))
    check("claim 4: ZeRO-1 on 4 ranks cuts master + m + v (%.0f -> %.0f MiB) and nothing else"
          % (base[fixed[2]], zero[fixed[2]]),
          zero[fixed[2]] < base[fixed[2]] / 2 and all(zero[k] == base[k] for k in ("parameters", "activations")))
    check("claim 4: bf16 against the fp32 build halves the weights and the activations",
          abs(fp32["parameters"] - 2 * base["parameters"]) <= 1 and fp32["activations"] > 1.9 * base["activations"])

    speed = r["claim5"]
    check("claim 5: every split costs the same model FLOPs per step (%.3g)" % speed[0]["flops"],
          all(s["flops"] == speed[0]["flops"] for s in speed))
    check("claim 5: A micro-batches run A times the matmuls (%s per step)"
          % ", ".join("%.0f" % s["matmuls_per_step"] for s in speed),
          all(s["matmuls_per_step"] == s["split"][2] * speed[0]["matmuls_per_step"] for s in speed))

    for zero in (0, 1):
        comm = [x for x in r["claim6"] if x.get("zero") == zero and x.get("optimizer") == "adamw"]
        ratio = comm[0]["reduced_over_gradient"] if comm else float("nan")  # (none: skipped, see the output)
        check("claim 6: ZeRO-%d, A = %s: the same collectives and bytes every step, one gradient's worth reduced "
              "(ratio %.5f)" % (zero, [x["A"] for x in comm], ratio),
              len(comm) == 4 and all(x["calls"] == comm[0]["calls"] and x["bytes"] == comm[0]["bytes"] for x in comm)
              and 1 <= ratio <= 1 + 1e-4)

    comm = [x for x in r["claim6"] if x.get("zero") == 2 and x.get("optimizer") == "adamw"]
    one = [x for x in r["claim6"] if x.get("zero") == 1 and x.get("optimizer") == "adamw"]
    check("claim 6: ZeRO-2, A = %s: A gradients' worth reduced (ratios %s), the weights gathered as ZeRO-1's"
          % ([x["A"] for x in comm], ", ".join("%.5f" % x["reduced_over_gradient"] for x in comm)),
          len(comm) == 4 and len(one) == 4
          and all(x["A"] <= x["reduced_over_gradient"] <= x["A"] + 1e-4 for x in comm)
          and all(x["bytes"]["all_gather"] == one[0]["bytes"]["all_gather"] for x in comm)
          or "skipped" in str(r["claim6"][0]))

    rows = [x for x in r["claim6"] if "bytes" in x]
    off = [(x.get("optimizer"), x["zero"], x["A"]) for x in rows if x["bytes"] != x["shapes"]["bytes"]]
    check("claim 6: every row's bytes of each kind are what the shapes predict (%d rows; off: %s)" % (len(rows), off),
          len(rows) >= 18 and not off)
    muon = {x["zero"]: x for x in r["claim6"] if x.get("optimizer") == "muon"}
    adamw1 = [x for x in r["claim6"] if x.get("optimizer") == "adamw" and x.get("zero") == 1]
    if len(muon) == 2 and adamw1:
        m0, m1 = muon[0], muon[1]
        check("claim 6: Muon, ZeRO-0: the gradient (and loss) all-reduced, then its matrices' new weights "
              "broadcast once (%d of %d bytes)" % (m0["bytes"]["broadcast"], m0["floatx_bytes"] * m0["muon_elements"]),
              m0["bytes"]["broadcast"] == m0["floatx_bytes"] * m0["muon_elements"] > 0
              and m0["bytes"]["all_reduce"] == m0["gradient_bytes"] + 4)
        check("claim 6: Muon, ZeRO-1: its matrices reduced to their owners and broadcast, the rest as AdamW's "
              "ZeRO-1: the same bytes in all (%d and %d)" % (m1["total_bytes"], adamw1[0]["total_bytes"]),
              m1["total_bytes"] == adamw1[0]["total_bytes"] and m1["bytes"]["reduce"] == 4 * m1["muon_elements"]
              and m1["bytes"]["broadcast"] == m1["floatx_bytes"] * m1["muon_elements"])
    else:
        check("claim 6: Muon's rows (ZeRO-0 and ZeRO-1) are there", "skipped" in str(r["claim6"][0]))

    check_claim7(check, r["claim7"], printed)

    norms = r["claim8"]
    check("claim 8: LayerNorm gives the same outputs in micro-batches (%.1e); BatchNorm does not (%.2f)"
          % (norms["layernorm_diff"], norms["batchnorm_diff"]),
          norms["layernorm_diff"] < 1e-12 and norms["batchnorm_diff"] > 0.1)


def vertex(lrs, losses):
    """The best lr as claim 7 states it, computed here on its own: the lowest loss, or at an interior point
    the minimum of y = a x^2 + b x + c through it and its neighbours, x = log lr (Cramer's rule)."""
    i = losses.index(min(losses))
    if i in (0, len(lrs) - 1):
        return lrs[i]
    pts = [(math.log(lrs[k]), losses[k]) for k in (i - 1, i, i + 1)]
    det = lambda m: (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                     + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
    rows = [[x * x, x, 1.0] for x, _ in pts]
    d = det(rows)
    a = det([[y, r[1], r[2]] for r, (_, y) in zip(rows, pts)]) / d
    b = det([[r[0], y, r[2]] for r, (_, y) in zip(rows, pts)]) / d
    return math.exp(-b / (2 * a))


def check_claim7(check, grid, printed):
    """Claim 7 prints the committed docs/lr_scaling.json, whose best lrs and exponents follow from its losses."""
    with open(os.path.join(ROOT, "docs", "lr_scaling.json")) as f:
        committed = json.load(f)
    check("claim 7: the lesson's claim 7 is the committed docs/lr_scaling.json", grid == committed)
    for opt in ("adamw", "muon"):
        runs, fits = committed["runs"][opt], committed["fits"][opt]
        lrs, sizes = runs["lrs"], runs["sizes"]
        ratios = [b / a for a, b in zip(lrs, lrs[1:])]
        check("claim 7, %s: >= 7 log-spaced lrs (%d) and 3 tokens-per-step sizes (%s), a finite loss per lr and size"
              % (opt, len(lrs), sorted(sizes, key=int)),
              len(lrs) >= 7 and all(abs(q / ratios[0] - 1) < 0.02 and q > 1 for q in ratios) and len(sizes) == 3
              and all(len(v) == len(lrs) and all(math.isfinite(x) for x in v) for v in sizes.values()))
        tokens = sorted(sizes, key=int)
        best = [vertex(lrs, sizes[t]) for t in tokens]
        check("claim 7, %s: the best lrs %s are the parabola's minima of the losses (json: %s)"
              % (opt, ["%.3g" % b for b in best], ["%.3g" % fits["best_lr"][t] for t in tokens]),
              all(abs(b / fits["best_lr"][t] - 1) < 1e-9 for b, t in zip(best, tokens)))
        x, y = [math.log(int(t)) for t in tokens], [math.log(b) for b in best]
        mx, my = sum(x) / 3, sum(y) / 3
        slope = sum((p - mx) * (q - my) for p, q in zip(x, y)) / sum((p - mx) ** 2 for p in x)
        check("claim 7, %s: the exponent of best lr against tokens per step is %.3f (json: %.3f)"
              % (opt, slope, fits["exponent"]), abs(slope - fits["exponent"]) < 1e-9)
        lines = printed.splitlines()
        missing = [t for t in tokens
                   if not any(l.startswith("| %s " % t) and all("| %.4f " % v in l for v in sizes[t])
                              and "| %.3g" % fits["best_lr"][t] in l for l in lines)]
        check("claim 7, %s: the lesson prints each size's losses and best lr (missing: %s)" % (opt, missing),
              not missing)


if __name__ == "__main__":
    sys.exit(main())
