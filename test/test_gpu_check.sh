#!/usr/bin/env bash
# test/gpu_check.sh in its dry run (GPU_CHECK_DRY_RUN=1: nvidia-smi, the build
# and the GPU programs stubbed by test/gpu_check_stubs.sh), so that the script
# that meets the first GPU cannot rot: with and without Open MPI, and with a
# budget too small for any step (it must still finish and leave its tarball).
set -u
cd "$(dirname "$0")/.."
source test/check.sh
has() { grep -qF -- "$2" "$1/summary.txt"; }

dry() {  # dry OUT_DIR [VAR=value...]: one dry run into OUT_DIR
    local out=$1
    shift
    rm -rf "$out" build/gpu/sm_dry  # no stub of an earlier run stands in for a program the script no longer builds
    env GPU_CHECK_DRY_RUN=1 GPU_ARCH=dry OUT="$out" "$@" bash test/gpu_check.sh >"$out.log" 2>&1
}

make -s gpu-deps >/dev/null 2>&1  # what the device call carries
out=build/gpu-check-dry/mpi
mkdir -p build/gpu-check-dry
dry "$out"
check "dry run exits 0" test $? -eq 0
check "with Open MPI: multi-GPU build" has "$out" "build: MULTI_GPU"
check "benchmark falls back from B=64 (out of memory) to B=32" has "$out" "ours     model d12 (124475904 parameters), B=32"
check "benchmark says how -ge 2 compares with -ge 0" has "$out" "ours     -ge 0: 110.0 ms/step; -ge 2 is 1.10x"
check "the INFO lines of a test reach the summary" has "$out" "info     INFO cuBLASLt epilogues taken"
check "the per-family roofline of the benchmark is reported" has "$out" "roofline   gelu forward + backward"
check "PyTorch's step is reported (or skipped, saying why)" grep -qE "^gpu_check: pytorch  (model|SKIP)" "$out/summary.txt"
check "attention benchmark lines" has "$out" "attn     attention llmc B=64"
check "the Llama 3.2 1B step: ours at B=8 T=2048" has "$out" "llama    ours     step B=8 T=2048, bf16"
check "the Llama 3.2 1B step: PyTorch's (or skipped, saying why)" grep -qE "^gpu_check: llama    pytorch  (model|SKIP)" "$out/summary.txt"
check "the Llama step comes after the trainer's lines (it takes what the budget has left)" \
    awk '/b auto/ { a = NR } /llama    ours/ { l = NR } END { exit !(a && l > a) }' "$out/summary.txt"
# gpu_check.sh's TESTS (test/kernels/ and 5 more) and its 2 NCCL tests
n_tests=$(($(ls test/kernels/test_*.cu | wc -l) + 5 + 2))
check "every GPU test gives its tally line ($n_tests)" \
    test "$(grep -c '^gpu_check: test     test_.*: 3 passed, 0 failed' "$out/summary.txt")" -eq $n_tests
check "the NCCL tests run on one rank" has "$out" "test_distributed: 3 passed, 0 failed [mpirun -np 1]"
check "trainer, resume and -b auto lines" bash -c "grep -q '^gpu_check: train    step 20/20' $out/summary.txt &&
    grep -q 'resume   bitwise' $out/summary.txt && grep -q 'b auto   batch: B=32' $out/summary.txt"
check "two files under \$OUT (at most 8 come back): summary.txt and one tarball" \
    test "$(ls "$out" | tr '\n' ' ')" = "gpu_check_logs.tar.gz summary.txt "
check "the tarball holds the logs and no checkpoint" bash -c "tar -tzf $out/gpu_check_logs.tar.gz | grep -q bench_B32.log &&
    tar -tzf $out/gpu_check_logs.tar.gz | grep -q train.log && ! tar -tzf $out/gpu_check_logs.tar.gz | grep -q '\.bin$'"
check "the last line says it is done, within its budget" grep -qE "^gpu_check: done in [0-9]+s \(budget 420s\)" "$out/summary.txt"

out=build/gpu-check-dry/no-mpi
dry "$out" GPU_CHECK_NO_MPI=1
check "without Open MPI: NO_MULTI_GPU=1 and no NCCL tests" bash -c "grep -q 'build: NO_MULTI_GPU=1' $out/summary.txt &&
    ! grep -q test_nccl $out/summary.txt && grep -q 'test     test_gpt2: 3 passed' $out/summary.txt"

out=build/gpu-check-dry/budget
dry "$out" GPU_CHECK_BUDGET=10
check "a spent budget skips the steps but still finishes with its tarball" bash -c "grep -q '^gpu_check: done in' $out/summary.txt &&
    test -f $out/gpu_check_logs.tar.gz && grep -q 'budget spent' $out/../budget.log"
# the bare image: the GPU sources find every header outside libc/libstdc++ and the
# toolkit in the gathered folder (make gpu-deps), which the device call carries
deps=build/gpu-check-dry/deps
make -s gpu-deps GPU_DEPS_DIR=$deps >/dev/null 2>&1
check "bare image: the GPU sources need only the gathered headers" bash test/gpu_bare_image_check.sh $deps
rm -f $deps/xxhash.h
check "bare image: without xxhash.h gathered, the check refuses" bash -c "! bash test/gpu_bare_image_check.sh $deps"
check "the dry run says where the headers come from" grep -q "^gpu_check: headers: build/gpu-deps/include (carried)" build/gpu-check-dry/mpi/summary.txt
check "the roofline estimate prints its step time and MFU" bash -c \
    "python3 dev/roofline_estimate.py | grep -qE '^estimated step [0-9.]+ ms, MFU [0-9.]+% of 989'"
check "the roofline estimate refuses T over 1024 with one error line" bash -c \
    "out=\$(python3 dev/roofline_estimate.py -T 2048 2>&1); test \$? -ne 0 && test \"\$(wc -l <<<\"\$out\")\" -eq 1 && grep -q '^error: ' <<<\"\$out\""
tally test_gpu_check
