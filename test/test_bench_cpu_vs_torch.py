#!/usr/bin/env python3
"""dev/bench_cpu_vs_torch.py's behaviour, not its speed: bad arguments are one
"error:" line and exit status 1 (no traceback); without torch it prints a SKIP
line and exits 0; and `bench_train --serve` (the steps it times) refuses a
bad command line, a short token file and a token id out of range with one
"error:" line. Where torch is installed: importing dev/train_gpt2.py leaves
torch at its defaults (no reference-mode variable set, threads and
determinism untouched) while running it as a program pins them; and the
bench's PyTorch step runs on a torch without SDPA, fused AdamW or
get_cpu_capability (an older torch, simulated), its written-out attention
giving SDPA's loss.

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


# Run with a clean environment: what train_gpt2 sets, imported and as a program.
REFERENCE_MODE_CODE = """
import os, runpy, sys
for k in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS"):
    os.environ.pop(k, None)
sys.path.insert(0, %r)
import torch
threads = torch.get_num_threads()
import train_gpt2
print("imported", [k for k in ("MKL_CBWR", "ATEN_CPU_CAPABILITY") if k in os.environ],
      torch.get_num_threads() == threads, torch.are_deterministic_algorithms_enabled())
sys.argv = ["train_gpt2.py", "--init-preview"]
sys.stdout = open(os.devnull, "w")
runpy.run_path(train_gpt2.__file__, run_name="__main__")
sys.stdout = sys.__stdout__
print("main", os.environ.get("ATEN_CPU_CAPABILITY"), os.environ.get("MKL_CBWR"), torch.get_num_threads(),
      torch.are_deterministic_algorithms_enabled())
"""


def check_reference_mode():
    r = subprocess.run([sys.executable, "-c", REFERENCE_MODE_CODE % os.path.join(ROOT, "dev")], capture_output=True,
                       text=True, timeout=600)
    if "No module named 'torch'" in r.stderr:
        print("SKIP reference mode checks: no torch")
        return
    lines = r.stdout.strip().split("\n")
    check("importing train_gpt2 sets no reference-mode variable and leaves torch's threads and determinism",
          r.returncode == 0 and len(lines) == 2 and lines[0] == "imported [] True False")
    check("running train_gpt2.py pins ATEN_CPU_CAPABILITY, MKL_CBWR, one thread, determinism",
          r.returncode == 0 and len(lines) == 2 and lines[1] == "main default COMPATIBLE 1 True")


# The bench's PyTorch step on a tiny model, once with this torch and once with what an older torch lacks
# taken away; prints each loss and how the step ran.
OLD_TORCH_CODE = """
import importlib.util, os, sys, tempfile
sys.path.insert(0, %r)
spec = importlib.util.spec_from_file_location("bench", %r)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
import torch, train_gpt2 as ref
torch.set_num_threads(1)
cfg = ref.GPTConfig(max_seq_len=16, vocab_size=40, padded_vocab_size=128, num_layers=1, num_heads=2, channels=32)
def loss_and_description():
    with tempfile.TemporaryDirectory() as folder:
        _, _, tensors, tokens = bench.write_inputs(ref, torch, cfg, 2, 8, folder)
    runners = bench.torch_runners(torch, cfg, tensors, tokens, 2, 8)
    return "%%.6f" %% runners[0].loss().item(), runners[0].describe(), len(runners)
print(*loss_and_description(), sep=" | ")
del torch.nn.functional.scaled_dot_product_attention
del torch.backends.cpu.get_cpu_capability
class AdamW(torch.optim.AdamW):
    def __init__(self, params, fused=None, **kwargs):
        if fused:
            raise RuntimeError("planted: no fused AdamW for the CPU")
        super().__init__(params, **kwargs)
torch.optim.AdamW = AdamW
print(*loss_and_description(), sep=" | ")
print(bench.torch_settings(torch))
"""


def check_old_torch():
    code = OLD_TORCH_CODE % (os.path.join(ROOT, "dev"), SCRIPT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if "No module named 'torch'" in r.stderr:
        print("SKIP the bench on an older torch: no torch")
        return
    lines = r.stdout.strip().split("\n")
    check("the bench's PyTorch step runs with and without SDPA and fused AdamW (exit 0, 3 lines)",
          r.returncode == 0 and len(lines) == 3)
    if r.returncode != 0 or len(lines) != 3:
        print(r.stderr[-2000:])
        return
    new, old = (l.split(" | ") for l in lines[:2])
    check(f"without SDPA: the attention written out, plain AdamW ({old[1]})",
          "no SDPA" in old[1] and old[1].endswith(", AdamW"))
    check(f"the written-out attention gives SDPA's loss ({old[0]} and {new[0]})",
          abs(float(old[0]) - float(new[0])) <= 1e-5)
    check(f"without get_cpu_capability the settings line says so ({lines[2]})", "unknown (torch before 2.0)" in lines[2])


def main():
    bench_train = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "cpu", "bench_train")
    check_arguments()
    with tempfile.TemporaryDirectory() as tmp:
        check_skip_without_torch(tmp)
        check_serve_refusals(tmp, bench_train)
    check_reference_mode()
    check_old_torch()
    check.tally("test_bench_cpu_vs_torch")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
