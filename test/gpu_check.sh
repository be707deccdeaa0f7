#!/usr/bin/env bash
# The one prepared GPU check, for one call on a fresh GPU machine (a lent H200:
# nvcc, PyTorch, no Open MPI, at most 8 files back from $OUT, 10 minutes a call).
#   make gpu-deps   here first: gathers xxhash.h and nlohmann/ (Debian packages a
#       bare GPU image lacks) into build/gpu-deps/include, which nvcc then uses; then
#   run(command="bash test/gpu_check.sh", carry=["build/gpu-deps"], timeout_s=480)
#                                                on the GPU machine (one device call)
#   GPU_CHECK_DRY_RUN=1 bash test/gpu_check.sh   on a CPU machine: nvidia-smi, the
#       nvcc build and the GPU programs are stubs, so CI checks the script's logic
# One `make -j` of exactly what it runs (NO_MULTI_GPU=1 without Open MPI), then,
# each step capped so the whole call ends within GPU_CHECK_BUDGET seconds (420)
# and each summary line printed as soon as it is known: the benchmarks first
# (d12 training step, ours and PyTorch's at the same B and T, and the attention
# kernels next to SDPA), then the GPU tests, then the trainer (20 steps, a
# bitwise resume, -b auto), and last a Llama 3.2 1B step, ours and PyTorch's. Everything it writes ends up in ONE tarball under
# $OUT (default build/gpu-check), beside summary.txt.
set -u
cd "$(dirname "$0")/.."
export GPU_ARCH=${GPU_ARCH:-90}
OUT_DIR=${OUT:-build/gpu-check}
BUDGET=${GPU_CHECK_BUDGET:-420}
DRY=${GPU_CHECK_DRY_RUN:-0}
WORK=build/gpu-check-work
BIN=build/gpu/sm_$GPU_ARCH
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT_DIR"
SUMMARY=$OUT_DIR/summary.txt
: >"$SUMMARY"

say() { echo "gpu_check: $*" | tee -a "$SUMMARY"; }
# capped SECONDS CMD...: runs CMD with at most SECONDS, and never past the budget
capped() {
    local want=$1 left=$((BUDGET - SECONDS - 15))
    shift
    ((left < 5)) && { echo "error: gpu_check budget spent before: $*"; return 124; }
    timeout $((want < left ? want : left)) "$@"
}
finish() {
    tar -czf "$OUT_DIR/gpu_check_logs.tar.gz" -C "$WORK" . 2>/dev/null
    say "done in ${SECONDS}s (budget ${BUDGET}s); logs: $OUT_DIR/gpu_check_logs.tar.gz"
    exit "${1:-0}"
}

if [[ $DRY == 1 ]]; then  # stand-ins for the GPU machine's tools and for our GPU programs
    STUBS=$WORK/stubs
    mkdir -p "$STUBS"
    printf '#!/bin/sh\necho "GPU 0: NVIDIA H200 (dry run)"\n' >"$STUBS/nvidia-smi"
    chmod +x "$STUBS/nvidia-smi"
    export PATH="$STUBS:$PATH"
fi

nvidia-smi -L >"$WORK/nvidia-smi.log" 2>&1 || { say "no GPU visible (nvidia-smi -L failed)"; finish 1; }
say "$(head -n 1 "$WORK/nvidia-smi.log")"

# --- the build: one make of what runs below ------------------------------------
# every kernel test of test/kernels/, the runtime's portable tests, the model's
TESTS=($(for f in test/kernels/test_*.cu; do basename "$f" .cu; done) test_kernel_language test_cublaslt test_streams
    test_gpt2 test_training)
PROGRAMS=("${TESTS[@]}" bench_train bench_attention)
MPI_TESTS=()
MAKE_VARS=(NO_MULTI_GPU=1)
if [[ ${GPU_CHECK_NO_MPI:-0} != 1 ]] && command -v mpirun >/dev/null &&
    [[ -f /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ]]; then
    MAKE_VARS=()  # Open MPI present: multi-GPU builds, and the NCCL tests (one rank)
    MPI_TESTS=(test_nccl test_distributed)
    # NCCL: the system's, else the nvidia-nccl-cu13 wheel's
    if [[ ! -f /usr/include/nccl.h && ! -f ${CUDA_HOME:-/usr/local/cuda}/include/nccl.h ]]; then
        wheel=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
        [[ -n $wheel ]] && MAKE_VARS=(NCCL_HOME="$wheel")
    fi
fi
PROGRAMS+=("${MPI_TESTS[@]}")
if [[ -f build/gpu-deps/include/xxhash.h && -d build/gpu-deps/include/nlohmann ]]; then
    say "headers: build/gpu-deps/include (carried)"
elif [[ ! -f /usr/include/xxhash.h ]]; then
    say "headers: build/gpu-deps/include missing and no /usr/include/xxhash.h: make gpu-deps, carry build/gpu-deps"
fi
say "build: ${MAKE_VARS[*]:-MULTI_GPU} ${PROGRAMS[*]} train_gpt"
if [[ $DRY == 1 ]]; then
    bash test/gpu_check_stubs.sh "$BIN" "${PROGRAMS[@]}" train_gpt >"$WORK/build.log" 2>&1
else
    capped 240 make -j"$(nproc)" "${MAKE_VARS[@]}" "${PROGRAMS[@]/#/$BIN/}" "$BIN/train_gpt" >"$WORK/build.log" 2>&1
fi || say "build failed (rc $?): $(grep -m1 -iE 'error' "$WORK/build.log")"
say "build done at ${SECONDS}s"

# --- benchmarks first: the d12 step (largest B that fits), ours then PyTorch's ------
bench_B=""
for B in 64 32 16; do
    [[ -x $BIN/bench_train ]] || break
    if BENCH_FAMILIES=1 capped 120 "$BIN/bench_train" d12 "$B" 1024 10 989 >"$WORK/bench_B$B.log" 2>&1; then
        bench_B=$B
        say "ours     $(grep '^model' "$WORK/bench_B$B.log")"
        say "ours     $(grep -m1 '^-ge' "$WORK/bench_B$B.log")"
        sed -n '/^roofline/,$p' "$WORK/bench_B$B.log" | while IFS= read -r line; do say "roofline $line"; done
        break
    fi
    say "ours     B=$B: $(tail -n 1 "$WORK/bench_B$B.log")"
done
if [[ -n $bench_B ]]; then
    capped 150 python3 dev/bench_train_torch.py d12 "$bench_B" 1024 10 989 >"$WORK/bench_torch.log" 2>&1
    rc=$?
    line=$(grep -hE '^(model|SKIP|error)' "$WORK/bench_torch.log" | head -n 1)
    say "pytorch  ${line:-no result (exit $rc; 124: out of time)}"
    ours=$(grep -o '[0-9]* tok/s' "$WORK/bench_B$bench_B.log" | head -n 1 | cut -d' ' -f1)
    theirs=$(grep '^model' "$WORK/bench_torch.log" | grep -o '[0-9]* tok/s' | head -n 1 | cut -d' ' -f1)
    [[ -n $ours && -n $theirs ]] && say "ratio    ours / pytorch tok/s = $(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')"
fi
if [[ -x $BIN/bench_attention ]]; then
    capped 60 "$BIN/bench_attention" 16,32,64 1024 12 64 20 >"$WORK/attention.log" 2>&1
    capped 90 python3 dev/bench_attention_sdpa.py 16,32,64 1024 12 64 20 >"$WORK/attention_sdpa.log" 2>&1
    grep -hE '^(attention .*forward\+backward|backend|SKIP|error)' "$WORK/attention.log" "$WORK/attention_sdpa.log" |
        while IFS= read -r line; do say "attn     $line"; done
fi

# --- the GPU tests, each with its tally line -------------------------------------
for t in "${TESTS[@]}"; do
    [[ -x $BIN/$t ]] || { say "test     $t: not built"; continue; }
    capped 60 "$BIN/$t" >"$WORK/$t.log" 2>&1
    rc=$?
    tally=$(grep -E '^[A-Za-z0-9_]+: [0-9]+ passed, [0-9]+ failed$' "$WORK/$t.log" | tail -n 1)
    say "test     ${tally:-$t: no tally (exit $rc)}$(grep -m1 '^FAIL' "$WORK/$t.log" | sed 's/^/; first /' | cut -c1-160)"
    grep '^INFO' "$WORK/$t.log" | while IFS= read -r line; do say "info     $line"; done
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for t in "${MPI_TESTS[@]}"; do
    [[ -x $BIN/$t ]] || { say "test     $t: not built"; continue; }
    args=()
    [[ $t == test_distributed ]] && mkdir -p "$WORK/$t.dir" && args=("$WORK/$t.dir")
    capped 60 mpirun --oversubscribe -np 1 "$BIN/$t" "${args[@]}" >"$WORK/$t.log" 2>&1
    say "test     $(grep -E '^[A-Za-z0-9_]+: [0-9]+ passed, [0-9]+ failed$' "$WORK/$t.log" | tail -n 1) [mpirun -np 1]"
done

# --- the trainer: 20 steps on the built-in corpus, a bitwise resume, -b auto -----
TRAIN=$BIN/train_gpt
if [[ -x $TRAIN ]]; then
    capped 60 "$TRAIN" -x 20 -v 10 -o "$WORK/run" >"$WORK/train.log" 2>&1
    say "train    $(grep '^step' "$WORK/train.log" | tail -n 1)$(grep -m1 '^error' "$WORK/train.log")"
    # checkpoints at 10 and 20, then resume from 10: the step-20 files must be bitwise the same
    capped 60 "$TRAIN" -x 20 -v 0 -n 10 -o "$WORK/ck" >"$WORK/ck.log" 2>&1
    rm -rf "$WORK/ck2" && cp -r "$WORK/ck" "$WORK/ck2" && rm -f "$WORK/ck2/"*00000020*
    capped 60 "$TRAIN" -x 20 -v 0 -n 10 -o "$WORK/ck2" -y 1 >"$WORK/ck2.log" 2>&1
    if cmp -s "$WORK/ck/model_00000020.bin" "$WORK/ck2/model_00000020.bin" &&
        cmp -s "$WORK/ck/state_00000020_00000.bin" "$WORK/ck2/state_00000020_00000.bin"; then
        say "resume   bitwise: step-20 model and state equal after resuming from step 10"
    else
        say "resume   NOT bitwise (see ck.log, ck2.log)"
    fi
    capped 90 "$TRAIN" -e d12 -b auto -t 1024 -x 3 -v 0 -o "$WORK/auto" >"$WORK/auto.log" 2>&1
    say "b auto   $(grep '^batch:' "$WORK/auto.log"); $(grep '^step' "$WORK/auto.log" | tail -n 1)$(grep -m1 '^error' "$WORK/auto.log")"
    rm -f "$WORK"/{ck,ck2,auto,run}/*.bin  # checkpoints stay out of the tarball
else
    say "train    train_gpt not built"
fi

# --- Llama 3.2 1B: a training step, ours then PyTorch's at the same B x T ----------
# Last, so that it takes what the budget has left and starves nothing above
# (ours builds the 1.2B weights on the host first). B=8: PyTorch's autograd keeps
# fp32 residual-stream intermediates per layer, which B=16 may not fit in 141 GB.
LLAMA_B=8
if [[ -x $BIN/bench_train ]]; then
    capped 120 "$BIN/bench_train" llama3.2-1b $LLAMA_B 2048 5 989 >"$WORK/llama.log" 2>&1
    rc=$?
    line=$(grep -hE '^(step|error)' "$WORK/llama.log" | head -n 1)
    say "llama    ours     ${line:-no result (exit $rc; 124: out of time)}"
    capped 150 python3 dev/bench_train_torch.py llama3.2-1b $LLAMA_B 2048 5 989 >"$WORK/llama_torch.log" 2>&1
    rc=$?
    line=$(grep -hE '^(model|SKIP|error)' "$WORK/llama_torch.log" | head -n 1)
    say "llama    pytorch  ${line:-no result (exit $rc; 124: out of time)}"
    ours=$(grep '^step' "$WORK/llama.log" | grep -o '[0-9]* tok/s' | head -n 1 | cut -d' ' -f1)
    theirs=$(grep '^model' "$WORK/llama_torch.log" | grep -o '[0-9]* tok/s' | head -n 1 | cut -d' ' -f1)
    [[ -n $ours && -n $theirs ]] && say "llama    ours / pytorch tok/s = $(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')"
else
    say "llama    bench_train not built"
fi
finish 0
