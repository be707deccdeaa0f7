#!/usr/bin/env python3
"""Plots a training run's log: loss (train and val) and throughput against step.

usage: python3 dev/plot_log.py RUN_DIR [--out FILE.png]

Reads RUN_DIR/main.jsonl, one JSON object per line:
    train:     {"step": 12, "loss": 3.2, "lr": 3e-4, "norm": 1.1, "tokens_per_step": 65536,
                "ms": 120.5, "tok_per_s": 543000}
    val:       {"step": 20, "val_loss": 3.1}
    hellaswag: {"step": 20, "hellaswag_acc": 0.27}
When main.jsonl is absent, llm.c's main.log instead ("s:%d trl:%f" train,
"s:%d tel:%f" val, "s:%d eval:%f" HellaSwag); it has no timings, so there is
no throughput panel then.

Writes a PNG (default RUN_DIR/main.png). Any problem: one "error: ..." line on
stderr and exit status 1.
"""
import argparse
import json
import math
import os
import re
import sys


class LogError(Exception):
    pass


def number(v):
    """A finite float, or None (a NaN loss is a run's problem, not the plot's)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def read_jsonl(path):
    """-> dict of series name -> {step: value}. A later line for the same step
    replaces an earlier one: a run resumed from a checkpoint logs those steps
    again, and the resumed values are the ones that led to the final model."""
    series = {"train": {}, "val": {}, "hellaswag": {}, "tok_per_s": {}, "skipped": 0}
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                bad += 1  # e.g. the last line of a run killed mid-write
                continue
            if not isinstance(obj, dict) or number(obj.get("step")) is None:
                bad += 1
                continue
            step = int(obj["step"])
            for key, name in (("loss", "train"), ("val_loss", "val"), ("hellaswag_acc", "hellaswag")):
                v = number(obj.get(key))
                if v is not None:
                    series[name][step] = v
            if "loss" in obj:
                tps = number(obj.get("tok_per_s"))
                if tps is None:  # older lines: derive it from the step's size and time
                    tokens, ms = number(obj.get("tokens_per_step")), number(obj.get("ms"))
                    if tokens is not None and ms is not None and ms > 0:
                        tps = tokens / (ms / 1000.0)
                if tps is not None and tps > 0:
                    series["tok_per_s"][step] = tps
    # reported with the result, not on stderr, so that a failure stays one "error:" line
    series["skipped"] = bad
    return series


LOG_LINE = re.compile(r"^s:(\d+)\s+(trl|tel|eval):(\S+)\s*$")


def read_main_log(path):
    series = {"train": {}, "val": {}, "hellaswag": {}, "tok_per_s": {}, "skipped": 0}
    names = {"trl": "train", "tel": "val", "eval": "hellaswag"}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LOG_LINE.match(line.strip())
            if not m:
                continue
            try:
                v = float(m.group(3))
            except ValueError:
                continue
            if math.isfinite(v):
                series[names[m.group(2)]][int(m.group(1))] = v
    return series


def load(run_dir):
    if not os.path.isdir(run_dir):
        raise LogError("%s: not a directory" % run_dir)
    jsonl = os.path.join(run_dir, "main.jsonl")
    log = os.path.join(run_dir, "main.log")
    if os.path.exists(jsonl):
        path, series = jsonl, read_jsonl(jsonl)
    elif os.path.exists(log):
        path, series = log, read_main_log(log)
    else:
        raise LogError("%s: neither main.jsonl nor main.log found" % run_dir)
    if not series["train"]:
        raise LogError("%s: no train lines (a step with a loss)" % path)
    return path, series


def xy(d):
    steps = sorted(d)
    return steps, [d[s] for s in steps]


def plot(path, series, out):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed; must be chosen before pyplot is imported
        import matplotlib.pyplot as plt
    except ImportError:
        raise LogError("matplotlib is not installed (pip install matplotlib, or apt-get install python3-matplotlib)")

    has_tps = bool(series["tok_per_s"])
    fig, axes = plt.subplots(1, 2 if has_tps else 1, figsize=(13 if has_tps else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    s, v = xy(series["train"])
    ax.plot(s, v, lw=1, label="train")
    if series["val"]:
        s, v = xy(series["val"])
        ax.plot(s, v, "o-", ms=3, lw=1.5, label="val (min %.4f)" % min(v))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    title = "loss"
    if series["hellaswag"]:
        s, v = xy(series["hellaswag"])
        title += "  (HellaSwag acc %.4f at step %d)" % (v[-1], s[-1])
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    if has_tps:
        ax = axes[0][1]
        s, v = xy(series["tok_per_s"])
        ax.plot(s, v, lw=1, color="tab:green")
        # the median, not the mean: the first steps (warm-up, allocation) are slow outliers
        med = sorted(v)[len(v) // 2]
        ax.axhline(med, ls="--", lw=1, color="gray", label="median %.0f tok/s" % med)
        ax.set_xlabel("step")
        ax.set_ylabel("tokens / s")
        ax.set_title("throughput")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(path, fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        raise LogError("%s: cannot write: %s" % (out, e.strerror or e))
    finally:
        plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description="Plot a run's loss and throughput from RUN_DIR/main.jsonl "
                                             "(or llm.c's main.log).")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("--out", metavar="FILE.png", help="the PNG to write (default RUN_DIR/main.png)")
    args = ap.parse_args()
    out = args.out or os.path.join(args.run_dir, "main.png")
    try:
        path, series = load(args.run_dir)
        plot(path, series, out)
    except (LogError, OSError) as e:
        msg = str(e) if isinstance(e, LogError) else "%s: %s" % (getattr(e, "filename", "") or args.run_dir,
                                                                 e.strerror or e)
        print("error: %s" % msg, file=sys.stderr)
        return 1
    skipped = ", %d unreadable line(s) skipped" % series["skipped"] if series["skipped"] else ""
    print("wrote %s (%d train, %d val, %d hellaswag points%s)" %
          (out, len(series["train"]), len(series["val"]), len(series["hellaswag"]), skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
