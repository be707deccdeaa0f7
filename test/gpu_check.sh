#!/usr/bin/env bash
# The one prepared GPU check, for a machine with an NVIDIA GPU (e.g. a lent
# H200): builds every CUDA program for sm_$GPU_ARCH with nvcc, runs the GPU
# tests and the benchmark, and prints a summary. Budget: a few minutes.
#   bash test/gpu_check.sh            (GPU_ARCH=90 by default)
set -u
cd "$(dirname "$0")/.."
export GPU_ARCH=${GPU_ARCH:-90}
OUT_DIR=${OUT:-build/gpu-check}
mkdir -p "$OUT_DIR"
summary=()
nvidia-smi -L || { echo "gpu_check: no GPU visible (nvidia-smi -L failed)"; exit 1; }
nvcc --version | tail -n 2

# Build each program on its own so one failure does not hide the others.
for src in test/cpu_cuda/test_*.cu dev/*.cu; do
    name=$(basename "$src" .cu)
    if make -s "build/gpu/sm_$GPU_ARCH/$name" >"$OUT_DIR/build_$name.log" 2>&1; then
        summary+=("built    $name")
    else
        summary+=("NO BUILD $name: $(grep -m1 -i error "$OUT_DIR/build_$name.log")")
    fi
done

# The GPU tests, through the same runner and tally as `make test`.
TEST_SECTIONS=gpu bash test/run_tests.sh 2>&1 | tee "$OUT_DIR/tests.log"
summary+=("tests    $(tail -n 1 "$OUT_DIR/tests.log")")

bench=build/gpu/sm_$GPU_ARCH/bench_cpu_cuda
if [[ -x $bench ]]; then
    $bench 2>&1 | tee "$OUT_DIR/bench.log"
    summary+=("bench    $(grep 'kernel   ' "$OUT_DIR/bench.log")")
fi

echo
echo "== gpu_check summary (sm_$GPU_ARCH)"
printf '%s\n' "${summary[@]}"
