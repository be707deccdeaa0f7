#!/usr/bin/env python3
"""dev/bench_cpu_vs_torch.py's behaviour, not its speed: bad arguments are one
"error:" line and exit status 1 (no traceback); without torch it prints a SKIP
line and exits 0; and `bench_train --serve` (the steps it times) refuses a
bad command line, a short token file and a token id out of range with one
"error:" line.

Usage: test/test_bench_cpu_vs_torch.py [BENCH_TRAIN]   (default build/cpu/bench_train)
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # test/checks.py
from checks import Checks  # noqa: E402

SCRIPT = os.path.join(ROOT, "dev", "bench_cpu_vs_torch.py")
check = Checks()


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    return r.returncode, r.stdout, r.stderr


def one_error_line(rc, out, err, words):
    lines = err.strip().split("\n")
    return (rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err
            and all(w in lines[0] for w in words))


def check_arguments():
    cases = [(["d13"], ["d13"]), (["d12", "four"], ["B='four'"]), (["d12", "4", "0"], ["T=0"]),
             (["d12", "4", "2048"], ["T=2048", "maxT"]), (["d12", "4", "64", "-1"], ["rounds=-1"]),
             (["d12", "4", "64", "3", "2", "extra"], ["at most 5"])]
    for args, words in cases:
        rc, out, err = run([sys.executable, SCRIPT, *args])
        check(f"arguments {args}: one error line naming {words}, exit 1", one_error_line(rc, out, err, words))


def check_skip_without_torch(tmp):
    fake = os.path.join(tmp, "no_torch")
    os.makedirs(fake)
    with open(os.path.join(fake, "torch.py"), "w") as f:
        f.write('raise ImportError("planted: no torch here")\n')
    env = dict(os.environ, PYTHONPATH=fake)
    rc, out, err = run([sys.executable, SCRIPT, "d12", "4", "64", "1", "1"], env=env)
    check("without torch: exit 0", rc == 0)
    check("without torch: one SKIP line naming the reason",
          out.strip().startswith("SKIP bench_cpu_vs_torch: torch not importable") and "planted" in out
          and len(out.strip().split("\n")) == 1)


def check_serve_refusals(tmp, bench_train):
    if not os.access(bench_train, os.X_OK):
        check(f"{bench_train} is built", False)
        return
    tokens = os.path.join(tmp, "tokens.bin")
    with open(tokens, "wb") as f:
        f.write((5).to_bytes(4, "little") * 8)  # 8 ids; B=1, T=8 needs 9
    cases = [(["--serve", "model.bin", "1"], ["usage: bench_train --serve"]),
             (["--serve", "model.bin", "0", "8", tokens], ["B=0"])]
    for args, words in cases:
        rc, out, err = run([bench_train, *args])
        check(f"--serve {args[1:]}: one error line naming {words}", one_error_line(rc, out, err, words))
    # a tiny model file for the token checks, written by the reference's writer
    code = ("import sys; sys.path.insert(0, %r); import train_gpt2 as r, torch\n"
            "cfg = r.GPTConfig(max_seq_len=16, vocab_size=40, padded_vocab_size=128, num_layers=1, num_heads=2,"
            " channels=32)\n"
            "r.write_model(%r, cfg, {n: torch.zeros(s) for n, s in r.param_shapes(cfg).items()})\n")
    model = os.path.join(tmp, "model.bin")
    if subprocess.run([sys.executable, "-c", code % (os.path.join(ROOT, "dev"), model)]).returncode != 0:
        print("SKIP --serve token checks: no torch to write the model file")
        return
    rc, out, err = run([bench_train, "--serve", model, "1", "8", tokens])
    check("--serve with 8 token ids for B*T+1 = 9: one error line", one_error_line(rc, out, err, ["8 token ids"]))
    with open(tokens, "wb") as f:
        f.write((5).to_bytes(4, "little") * 8 + (40).to_bytes(4, "little"))
    rc, out, err = run([bench_train, "--serve", model, "1", "8", tokens])
    check("--serve with token id 40 for V=40: one error line", one_error_line(rc, out, err, ["token id 40"]))
    with open(tokens, "wb") as f:
        f.write((5).to_bytes(4, "little") * 9)
    r = subprocess.run([bench_train, "--serve", model, "1", "8", tokens], input="step\nstep\n", capture_output=True,
                       text=True, timeout=600)
    lines = r.stdout.strip().split("\n")
    check("--serve: ready, then one 'ms' line per 'step' line, exit 0 at end of input",
          r.returncode == 0 and len(lines) == 3 and lines[0].startswith("ready")
          and all(l.startswith("ms ") for l in lines[1:]))


def main():
    bench_train = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "cpu", "bench_train")
    check_arguments()
    with tempfile.TemporaryDirectory() as tmp:
        check_skip_without_torch(tmp)
        check_serve_refusals(tmp, bench_train)
    check.tally("test_bench_cpu_vs_torch")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
