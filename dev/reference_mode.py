"""Reference mode: how the programs that write or check reference files (dev/train_gpt2.py's main,
dev/make_hf_fixture.py) run PyTorch, so that their bytes are the same on every run and every x86-64
machine.

Single-threaded CPU torch is run-to-run deterministic on one machine. The variables pin the code
paths that would otherwise be picked by the CPU at run time (MKL's SIMD kernels, ATen's AVX2/AVX-512
kernels), so another machine regenerates the same bytes; they must be set before torch is imported,
and an explicit setting in the environment wins. A program that only borrows the reference model (the
benchmarks) must not take them: they slow torch down several times and turn off its bf16 kernels.
"""
import os

ENV = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}


def pin_env():
    """Before torch is imported."""
    for name, value in ENV.items():
        os.environ.setdefault(name, value)


def pin_torch(torch):
    """After torch is imported: one thread, deterministic algorithms."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
