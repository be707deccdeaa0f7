#!/usr/bin/env bash
# The one prepared GPU check, for a machine with an NVIDIA GPU (e.g. a lent
# H200): builds every CUDA program for sm_$GPU_ARCH with nvcc, runs the GPU
# tests, the trainer for a few steps and a d12 benchmark (T=1024, the largest
# B that fits), and prints a summary. Budget: under 8 minutes.
#   bash test/gpu_check.sh            (GPU_ARCH=90 by default)
set -u
cd "$(dirname "$0")/.."
export GPU_ARCH=${GPU_ARCH:-90}
OUT_DIR=${OUT:-build/gpu-check}
mkdir -p "$OUT_DIR"
summary=()
nvidia-smi -L || { echo "gpu_check: no GPU visible (nvidia-smi -L failed)"; exit 1; }
nvcc --version | tail -n 2

# First the tensor-core attention (no MPI or NCCL needed): its primitive and
# kernel tests, then the kernels alone at d12 shapes next to PyTorch's SDPA.
for name in test_ptx test_attention bench_attention; do
    if make -s NO_MULTI_GPU=1 "build/gpu/sm_$GPU_ARCH/$name" >"$OUT_DIR/build_$name.log" 2>&1; then
        [[ $name == test_* ]] && { timeout 120 "build/gpu/sm_$GPU_ARCH/$name" >"$OUT_DIR/$name.log" 2>&1; summary+=("$name $(tail -n 1 "$OUT_DIR/$name.log")"); }
    else
        summary+=("NO BUILD $name: $(grep -m1 -i error "$OUT_DIR/build_$name.log")")
    fi
done
timeout 120 build/gpu/sm_$GPU_ARCH/bench_attention 16,32,64 1024 12 64 20 >"$OUT_DIR/attention.log" 2>&1 || echo "error: bench_attention exit $?" >>"$OUT_DIR/attention.log"
timeout 180 python3 dev/bench_attention_sdpa.py 16,32,64 1024 12 64 20 >"$OUT_DIR/attention_sdpa.log" 2>&1 || echo "error: bench_attention_sdpa exit $?" >>"$OUT_DIR/attention_sdpa.log"
while IFS= read -r line; do summary+=("attn     $line"); done < <(grep -hE '^(device|backend|attention|SKIP|error)' "$OUT_DIR/attention.log" "$OUT_DIR/attention_sdpa.log")
printf '%s\n' "${summary[@]}"

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

# The trainer itself: 20 steps on the built-in corpus (bf16).
if make -s train_gpt GPU_ARCH=$GPU_ARCH >"$OUT_DIR/build_train_gpt.log" 2>&1; then
    timeout 120 ./train_gpt -x 20 -v 10 2>&1 | tee "$OUT_DIR/train.log"
    summary+=("train    $(grep -c '^step .*tok/s' "$OUT_DIR/train.log") steps; last: $(grep '^step .*tok/s' "$OUT_DIR/train.log" | tail -n 1)")
    summary+=("val      $(grep 'val loss' "$OUT_DIR/train.log" | tail -n 1)")
    # checkpoint at 10 and 20, then resume from 10: the step-20 files must be bitwise the same
    rm -rf "$OUT_DIR/ck" "$OUT_DIR/ck2"
    timeout 120 ./train_gpt -x 20 -v 0 -n 10 -o "$OUT_DIR/ck" >"$OUT_DIR/ck.log" 2>&1
    cp -r "$OUT_DIR/ck" "$OUT_DIR/ck2" && rm -f "$OUT_DIR/ck2/"*00000020*
    timeout 120 ./train_gpt -x 20 -v 0 -n 10 -o "$OUT_DIR/ck2" -y 1 >"$OUT_DIR/ck2.log" 2>&1
    if cmp -s "$OUT_DIR/ck/model_00000020.bin" "$OUT_DIR/ck2/model_00000020.bin" &&
        cmp -s "$OUT_DIR/ck/state_00000020_00000.bin" "$OUT_DIR/ck2/state_00000020_00000.bin"; then
        summary+=("resume   bitwise: step-20 model and state equal after resuming from step 10")
    else
        summary+=("resume   NOT bitwise (see $OUT_DIR/ck*.log)")
    fi
    # d12 with -b auto at T=1024: the chosen B, the memory plan and 3 steps with MFU
    timeout 180 ./train_gpt -e d12 -b auto -t 1024 -x 3 -v 0 >"$OUT_DIR/auto.log" 2>&1
    summary+=("b auto   $(grep '^batch:' "$OUT_DIR/auto.log"); $(grep '^  total' "$OUT_DIR/auto.log" | tr -s ' ')")
    summary+=("b auto   $(grep '^step' "$OUT_DIR/auto.log" | tail -n 1)$(grep -m1 '^error' "$OUT_DIR/auto.log")")
else
    summary+=("NO BUILD train_gpt: $(grep -m1 -i error "$OUT_DIR/build_train_gpt.log")")
fi

# d12 at T=1024: the largest micro-batch that fits (out of memory exits with an error line).
bench=build/gpu/sm_$GPU_ARCH/bench_train
if [[ -x $bench ]]; then
    for B in 64 48 32 16 8; do
        if timeout 120 $bench d12 $B 1024 10 989 >"$OUT_DIR/bench_B$B.log" 2>&1; then
            cat "$OUT_DIR/bench_B$B.log"
            summary+=("bench    $(head -n 1 "$OUT_DIR/bench_B$B.log")")
            summary+=("memory   $(grep 'memory' "$OUT_DIR/bench_B$B.log")")
            break
        fi
        summary+=("bench    B=$B: $(tail -n 1 "$OUT_DIR/bench_B$B.log")")
    done
fi

echo
echo "== gpu_check summary (sm_$GPU_ARCH)"
printf '%s\n' "${summary[@]}"
