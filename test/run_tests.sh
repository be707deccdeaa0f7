#!/usr/bin/env bash
# Runs every test of the project (after `make cpu asan`) and ends with one line
# "N passed, M failed". Each test program prints "<name>: N passed, M failed";
# a program that crashes or hangs without its tally line counts as one failure.
# The programs, by what they test: cpu_cuda/test/ (the CUDA-on-CPU runtime),
# test/kernels/ (one per kernel header of llmc/), test/model/ (train_gpt.cu's
# model), test/trainer/ (the train_gpt binary), test/host/ (host C++).
#
# One program alone: `make test-one T=test_layernorm` (BUILD=cpu-fp32 etc. for
# another build; a host test or a script of test/trainer/ by its name too).
# TEST_FILTER=substring runs only the cases whose name contains it, in the
# programs that name their cases with TEST_CASE (test/test_util.h: those of
# test/kernels/, test_kernel_language, test_checks, test_cublaslt,
# test_hellaswag_loader); the others run all and say so.
#
# Sections (TEST_SECTIONS, default all but check): cpu host schedules mpi
#   ranks asan racecheck initcheck nvcc gpu; and check
#   check     the quick tier (`make check`, while editing): each kernel test once
#             (bf16), test_gpt2 and test_llama3 in fp32, test_nccl under mpirun -np 2, one kill
#             and bitwise resume of each trainer (TEST_RESUME_QUICK), the command line's error
#             paths (TRAIN_CLI_QUICK), README's and docs/'s links to definitions (an edit
#             that moves a linked line fails here); each runs in the others too
#   cpu       every CPU test program once (bf16), the model's tests also in fp32, whose runs
#             order each block's threads at random (CPUCUDA_SCHEDULE=random:7: a result that
#             depends on the order of threads between barriers differs from the reference);
#             the transformers import/export and -e FOLDER against its fixture (test_hf.py);
#             the fine-tuning flow end to end (test_finetune.sh; its logits comparison with
#             transformers skipped, saying so, without torch);
#             the PyTorch Llama 3 reference's self-checks and its comparison with
#             transformers (dev/train_llama3.py, dev/check_llama3_vs_hf.py; each
#             skipped, saying so, where torch or transformers is not installed);
#             the trainer built from the CUDA headers of PyPI with the toolkit
#             hidden (test_pypi_headers.sh)
#   host      the plain C++ tests of the data tools (build/host/test_*); they
#             find ../shared/data through SHARED_DATA and skip where it is absent;
#             Llama 3 folders written by llmc, a train_llama3 checkpoint's among
#             them, loaded by transformers (dev/check_llama3_written.py; skipped,
#             saying so, without them); every C++/CUDA source as clang-format 19.1.7
#             lays it out (make format-check; skipped, saying so, without 19.1.7)
#             and that checker on a copy whose layout is broken (test_format_check.py)
#   schedules the tests of the runtime and test_ptx (which have no fp32 build) in seeded random
#             order; a warp reduction that assumes lockstep lanes must come out wrong in
#             every order; test_checks on a smaller virtual device. (The other programs run
#             in other orders in the fp32 and racecheck runs.)
#   mpi       test_nccl under mpirun -np 1, 2, 4; data parallelism: test_distributed
#             (fp32 and bf16) under mpirun -np 1..4, then compared across N; train_llama3
#             with ZeRO-1 on 2 ranks against one process (test_llama3_ranks.sh)
#   ranks     the trainer under mpirun (test_multi_rank_cli.sh): data parallel runs, a
#             rank stopped or killed (the --stall-timeout watchdogs), signals to mpirun
#   asan      the AddressSanitizer/UBSan build of the tests, with CPUCUDA_STREAMS=deferred
#             (stream work runs only when needed, so a missing stream dependency gives a
#             wrong result or a use of unfinished memory), and kernels that access memory
#             past a global buffer and past their shared memory, which the sanitizer must
#             catch; the trainers'
#             loaders on a few mutated inputs each (dev/fuzz_loaders.py: one error
#             line or success, never a crash), and its planted loader reported
#   racecheck the kernel tests, test_gpt2 and test_training in build/cpu-racecheck
#             (one worker), which reports shared/global memory races, with each block's
#             threads in reverse order (CPUCUDA_SCHEDULE=reverse), with
#             CPUCUDA_INITCHECK=1 (fresh device and shared memory poisoned, and
#             reads of it reported); the broken kernels of cpu_cuda/test/sanitizer
#             must be reported by name and line
#   initcheck a kernel that reads an unwritten buffer must produce NaN in the
#             plain build with CPUCUDA_INITCHECK=1
#   nvcc      the trainers compiled for sm_90 (attention at every head size in train_gpt,
#             at Llama's 64 and 128 in train_llama3; their device code for sm_80 at the
#             published models' head sizes), the kernel tests (every
#             kernel of llmc/) for sm_90, every other CUDA program through nvcc's front end
#             (host and device code checked, device code to PTX; not compiled by g++ nor
#             linked); the SASS facts of the trainers' kernels (dev/sass_report.py --check)
#   gpu       the GPU builds run, where a GPU is present
#
# The sections run in two lanes side by side (TEST_LANES, below the sections).
#
# Every program runs under a hang guard of TEST_TIMEOUT seconds (default 600)
# times TEST_TIMEOUT_SCALE (default 1; raise it on a slow or busy machine). The
# scale is exported: the test scripts scale their own guards by it. No test
# passes or fails by how long something took, only by what it did.
set -u
cd "$(dirname "$0")/.."
SECTIONS=${TEST_SECTIONS:-"cpu host schedules mpi ranks asan racecheck initcheck nvcc gpu"}
[[ " $SECTIONS " == *" check "* ]] && SECTIONS+=" check2"  # check's second half (section_check2)
export TEST_TIMEOUT_SCALE=${TEST_TIMEOUT_SCALE:-1}
TIMEOUT=$((${TEST_TIMEOUT:-600} * TEST_TIMEOUT_SCALE))
LOG_DIR=build/test-logs
mkdir -p "$LOG_DIR"
passed=0
failed=0
failures=()
# every FAIL line of the run, both lanes, repeated at the end where a log's tail shows it
FAIL_LINES=$LOG_DIR/fail_lines
: >"$FAIL_LINES"

section=none
times=()
TIME_TMP=$LOG_DIR/time.tmp

# timed LABEL CMD...: runs CMD, records "WALL CPU SECTION LABEL" (seconds; CPU is
# user+sys of CMD and everything it waited for) for the summary. CPU time is the
# number to compare on a shared machine: other load stretches wall time, not CPU time.
timed() {
    local label=$1 rc wall user sys TIMEFORMAT='%R %U %S'
    shift
    { time "$@" 2>&9 9>&-; } 9>&2 2>"$TIME_TMP"
    rc=$?
    read -r wall user sys <"$TIME_TMP"
    times+=("$wall $(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.3f", u + s}') $section $label")
    return $rc
}

# The times are printed for finding slow programs, never asserted; times.txt
# also lists every program.
print_times() {
    local f="$LOG_DIR/times.txt"
    {
        echo "most CPU time (seconds: CPU = user+sys, wall):"
        printf '%s\n' "${times[@]}" | sort -k2,2 -rn | head -n 25 |
            awk '{printf "  %8.1f %8.1f  [%s] ", $2, $1, $3; $1 = $2 = $3 = ""; print substr($0, 4)}'
        echo "per section (seconds: CPU, wall):"
        printf '%s\n' "${times[@]}" | awk '{c[$3] += $2; w[$3] += $1} END {for (k in c) printf "  %8.1f %8.1f  %s\n", c[k], w[k], k}' |
            sort -rn
        printf '%s\n' "${times[@]}" | awk '{c += $2; w += $1} END {printf "  %8.1f %8.1f  all (%.1f CPU seconds / 2 cores = %.1f)\n", c, w, c, c / 2}'
    } >"$f"
    cat "$f"
    {
        echo "every program (seconds: CPU, wall):"
        printf '%s\n' "${times[@]}" | sort -k2,2 -rn |
            awk '{printf "  %8.1f %8.1f  [%s] ", $2, $1, $3; $1 = $2 = $3 = ""; print substr($0, 4)}'
    } >>"$f"
}
pass() { passed=$((passed + 1)); echo "PASS $1"; }
fail() { failed=$((failed + 1)); failures+=("$1"); echo "FAIL $1" | tee -a "$FAIL_LINES"; }

# run LABEL CMD...: runs a test program, adds its tally.
run() {
    local label=$1 log="$LOG_DIR/$(echo "$1" | tr -c 'A-Za-z0-9_.-' '_').log"
    shift
    timed "$label" timeout "$TIMEOUT" "$@" >"$log" 2>&1
    local rc=$? tally
    tally=$(grep -E '^[A-Za-z0-9_]+: [0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    if [[ -z "$tally" ]]; then
        fail "$label (exit $rc, no tally line; see $log)"
        tail -n 15 "$log" | sed 's/^/    /' | tee -a "$FAIL_LINES"
        return
    fi
    local p f
    p=$(echo "$tally" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(echo "$tally" | sed -E 's/.*, ([0-9]+) failed/\1/')
    passed=$((passed + p))
    failed=$((failed + f))
    grep -E '^(FAIL|SKIP)' "$log" | sed "s|^|    [$label] |"
    grep -E '^FAIL' "$log" | sed "s|^|[$label] |" >>"$FAIL_LINES"
    if [[ $f -gt 0 || $rc -ne 0 ]]; then
        failures+=("$label")
        [[ $f -eq 0 ]] && { failed=$((failed + 1)); echo "    [$label] exit code $rc" | tee -a "$FAIL_LINES"; }
    fi
    echo "$label: $p passed, $f failed"
}

# expect LABEL PATTERN... -- CMD...: a deliberately broken program must exit
# non-zero and print every PATTERN (fixed strings).
expect() {
    local label=$1 log="$LOG_DIR/$(echo "$1" | tr -c 'A-Za-z0-9_.-' '_').log" patterns=() missing=""
    shift
    while [[ $1 != -- ]]; do patterns+=("$1"); shift; done
    shift
    timed "$label" timeout "$TIMEOUT" "$@" >"$log" 2>&1
    local rc=$?
    for p in "${patterns[@]}"; do grep -qF -- "$p" "$log" || missing+=" '$p'"; done
    if [[ $rc -ne 0 && -z $missing ]]; then
        pass "$label"
    else
        fail "$label (exit $rc; missing:${missing:- none}; see $log)"
    fi
}

# marked FILE MARKER: the number of the one line of FILE that holds MARKER (a comment
# there), for a report that must name that line; an edit or a reformat above it moves both
marked() {
    local lines
    lines=$(grep -nF -- "$2" "$1" | cut -d: -f1)
    [[ $(echo "$lines" | wc -w) == 1 ]] && echo "$lines"
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# a rank that waits in MPI (for a stopped rank, a slower one) yields its core to the other lane
export OMPI_MCA_mpi_yield_when_idle=1
MPIRUN="mpirun --oversubscribe --bind-to none"
names() { for f in "$@"; do basename "$f" .cu; done; }
KERNELS=($(names test/kernels/test_*.cu))  # one program per kernel header of llmc/
# every single-process CUDA test program (test_nccl and test_distributed run under mpirun)
SINGLE_TESTS=(test_kernel_language test_checks test_cublaslt test_streams test_thread_loops "${KERNELS[@]}" test_gpt2 test_llama3 test_training test_run_seam)
# the model's kernels and what they are built on, rerun in every checking mode
KERNEL_TESTS=(test_kernel_language test_cublaslt "${KERNELS[@]}")
# the programs also built in fp32 (the Makefile's FP32_TESTS, less test_distributed: mpi section)
FP32_TESTS=($(names test/kernels/test_*.cu | grep -vx test_ptx) test_gpt2 test_llama3 test_training)

section_check() {
    echo "== the quick tier (make check)"
    for t in "${KERNELS[@]}"; do run "$t" "build/cpu/$t"; done
    run "test_gpt2 [fp32]" build/cpu-fp32/test_gpt2
    run "test_llama3 [fp32]" build/cpu-fp32/test_llama3
    run "readme_anchors (README's and docs/'s links to definitions)" python3 dev/readme_anchors.py
}
# the quick tier's other half, which the other lane takes
section_check2() {
    run "test_nccl [mpirun -np 2]" $MPIRUN -np 2 build/cpu/test_nccl
    run "test_resume [TEST_RESUME_QUICK=1]" env TEST_RESUME_QUICK=1 python3 test/trainer/test_resume.py build/cpu/train_gpt
    run "test_resume train_llama3 [TEST_RESUME_QUICK=1]" env TEST_RESUME_QUICK=1 python3 test/trainer/test_resume.py build/cpu/train_llama3
    run "test_train_cli [TRAIN_CLI_QUICK=1]" env TRAIN_CLI_QUICK=1 bash test/trainer/test_train_cli.sh build/cpu/train_gpt
}

section_cpu() {
    echo "== CPU runtime tests"
    for t in "${SINGLE_TESTS[@]}"; do run "$t" "build/cpu/$t"; done
    for t in "${FP32_TESTS[@]}"; do run "$t [fp32, random:7]" env CPUCUDA_SCHEDULE=random:7 "build/cpu-fp32/$t"; done
    # (every other case of it runs in the sanitizer build: asan section)
    run "test_train_cli [the built-in corpus, 100 steps]" env TRAIN_CLI_BUILTIN=1 bash test/trainer/test_train_cli.sh build/cpu/train_gpt
    run "test_resume" python3 test/trainer/test_resume.py build/cpu/train_gpt
    run "test_resume train_llama3" python3 test/trainer/test_resume.py build/cpu/train_llama3
    run "test_llama3_cli" bash test/trainer/test_llama3_cli.sh build/cpu/train_llama3
    run "test_muon_cli (--optimizer muon: trains, split and rank invariance, resume bitwise, refusals)" \
        bash test/trainer/test_muon_cli.sh build/cpu-fp32/train_gpt
    run "test_muon_cli train_llama3" bash test/trainer/test_muon_cli.sh build/cpu-fp32/train_llama3
    run "test_finetune (HF folder -> prepro --tiktoken -> train_llama3 --doc-mask -> checkpoint = transformers)" \
        bash test/trainer/test_finetune.sh build/cpu-fp32
    run "test_hf" python3 test/trainer/test_hf.py build/cpu-fp32/test_gpt2 build/cpu/test_gpt2 build/cpu/train_gpt
    run "test_lesson" python3 test/trainer/test_lesson.py build/cpu-fp32/train_gpt build/cpu/train_gpt build/cpu-fp32/lesson
    run "test_gpu_check (gpu_check.sh, dry run)" bash test/test_gpu_check.sh
    run "test_headers_alone (every llmc/ header compiles in a unit of its own; a planted one fails)" \
        bash test/test_headers_alone.sh
    run "test_pypi_headers (the CPU build without the CUDA toolkit)" bash test/test_pypi_headers.sh
    run "readme_anchors (README's and docs/'s links to definitions)" python3 dev/readme_anchors.py
    # the PyTorch Llama 3 reference: needs torch (and transformers for the comparison), which CI lacks
    if python3 -c "import torch" 2>/dev/null; then
        run "train_llama3 --check (PyTorch Llama 3 reference)" python3 dev/train_llama3.py --check
    else
        echo "SKIP train_llama3 --check: torch is not installed (python3 -m pip install torch)"
    fi
    if python3 -c "import torch, transformers" 2>/dev/null; then
        run "check_llama3_vs_hf (train_llama3.py = LlamaForCausalLM)" python3 dev/check_llama3_vs_hf.py
    else
        echo "SKIP check_llama3_vs_hf: torch or transformers is not installed"
    fi
    run "test_readme_anchors (planted wrong anchors fail)" python3 test/test_readme_anchors.py
    run "test_sass_loops (sass_report's HMMA loops on hand-written SASS)" python3 test/test_sass_loops.py
    run "test_bench_cpu_vs_torch (arguments, SKIP without torch, --serve refusals)" python3 test/test_bench_cpu_vs_torch.py build/cpu/bench_train
    run "test_bench_llama3 (bench_train: Llama 3.2 1B roofline from its shape, a small Llama's and GPT-2's step)" python3 test/test_bench_llama3.py build/cpu/bench_train
}

export SHARED_DATA=${SHARED_DATA:-../shared/data}
section_host() {
    echo "== host (data tools) tests"
    for t in build/host/test_*; do [[ -x $t ]] && run "$(basename "$t")" "$t"; done
    # Llama 3 folders written by llmc, a checkpoint's of train_llama3 among them, loaded by
    # transformers: needs torch and transformers, which CI lacks
    if [[ -x build/host/write_llama3_random && -x build/cpu/train_llama3 ]] &&
        python3 -c "import torch, transformers" 2>/dev/null; then
        run "check_llama3_written (llmc's Llama 3 folders and a checkpoint's = from_pretrained)" \
            python3 dev/check_llama3_written.py build/host/write_llama3_random build/cpu/train_llama3
    else
        echo "SKIP check_llama3_written: torch or transformers is not installed"
    fi
    run "format_check (every C++/CUDA source as clang-format lays it out: make format)" make -s format-check
    run "test_format_check (a source with its layout broken is reported)" python3 test/test_format_check.py
}

# the kernel tests without an fp32 build, in another order (the others: fp32's runs, random:7,
# and racecheck's, reverse)
SCHEDULE_ONLY_TESTS=($(printf '%s\n' "${KERNEL_TESTS[@]}" | grep -vxF -f <(printf '%s\n' "${FP32_TESTS[@]}")))
section_schedules() {
    echo "== thread orders"
    for t in "${SCHEDULE_ONLY_TESTS[@]}"; do
        run "$t [CPUCUDA_SCHEDULE=random:7]" env CPUCUDA_SCHEDULE=random:7 "build/cpu/$t"
    done
    run "test_checks [a smaller virtual device]" env CPUCUDA_SM_COUNT=8 CPUCUDA_DEVICE_MEMORY_MB=200 \
        CPUCUDA_SMEM_OPTIN_KB=100 build/cpu/test_checks
    # lanes run one after another between synchronisation points, never in lockstep
    for sched in forward reverse random:7; do
        expect "lockstep: a warp reduction without __syncwarp is wrong [CPUCUDA_SCHEDULE=$sched]" \
            "expected 528" -- env CPUCUDA_SCHEDULE=$sched build/cpu/warp_sync_kernel
    done
}

section_mpi() {
    echo "== NCCL over MPI"
    for np in 1 2 4; do run "test_nccl [mpirun -np $np]" $MPIRUN -np $np build/cpu/test_nccl; done
    for build in cpu-fp32 cpu; do
        dir=build/test-distributed/$build
        rm -rf "$dir" && mkdir -p "$dir"
        for np in 1 2 3 4; do
            run "test_distributed $build [mpirun -np $np]" $MPIRUN -np $np -x CPUCUDA_WORKERS=1 "build/$build/test_distributed" "$dir"
        done
        run "test_distributed $build [compare the splits]" "build/$build/test_distributed" --compare "$dir"
    done
    run "test_llama3_ranks (mpirun -np 2 ZeRO-1 A=2 = one process A=4)" bash test/trainer/test_llama3_ranks.sh build/cpu/train_llama3
}

section_ranks() {
    echo "== the trainer under mpirun"
    run "test_multi_rank_cli" bash test/trainer/test_multi_rank_cli.sh build/cpu/train_gpt
}

section_asan() {
    echo "== AddressSanitizer + UBSan build, deferred streams"
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    for t in "${SINGLE_TESTS[@]}"; do run "$t [asan, deferred streams]" env CPUCUDA_STREAMS=deferred "build/cpu-asan/$t"; done
    # no leak check for the trainer: its error exits leave the run's allocations to the process's end
    # (and under mpirun, Open MPI keeps its own until exit)
    # every case of it (the cpu section runs its 100-step run in the plain build), the built-in corpus
    # run with fewer steps (TRAIN_CLI_SMALL), under a hang guard with room for a busy machine
    TIMEOUT=$((TIMEOUT * 3)) run "test_train_cli [asan]" env ASAN_OPTIONS=detect_leaks=0 TRAIN_CLI_SMALL=1 \
        bash test/trainer/test_train_cli.sh build/cpu-asan/train_gpt
    # test_tokenizer: the first of its sweeps over every code point per vocabulary (each code
    # point once through the class tables, the pre-tokeniser and BPE); the host section runs them all
    for t in build/host-asan/test_*; do [[ -x $t ]] && run "$(basename "$t") [asan]" env TOKENIZER_SWEEPS=1 "$t"; done
    # the trainers' loaders on mutated input: a few cases of each, bounded by count (dev/fuzz_loaders.py)
    run "test_fuzz_loaders [asan]" python3 test/trainer/test_fuzz_loaders.py build/cpu-asan/train_gpt
    run "test_nccl [asan, deferred streams, mpirun -np 2]" env ASAN_OPTIONS=detect_leaks=0 CPUCUDA_STREAMS=deferred \
        $MPIRUN -np 2 build/cpu-asan/test_nccl
    mkdir -p build/test-distributed/asan
    run "test_distributed [asan, deferred streams, mpirun -np 3]" $MPIRUN -np 3 -x ASAN_OPTIONS=detect_leaks=0 \
        -x CPUCUDA_WORKERS=1 -x CPUCUDA_STREAMS=deferred build/cpu-asan/test_distributed build/test-distributed/asan
    # the planted out-of-bounds kernels: a global buffer's end, the block's shared memory's end
    local mode report past
    for mode in global smem; do
        report=heap-buffer-overflow past="a global buffer"
        [[ $mode == smem ]] && report=use-after-poison past="its dynamic shared memory"
        log="$LOG_DIR/oob_kernel_$mode.log"
        timed "oob_kernel $mode [asan]" timeout "$TIMEOUT" build/cpu-asan/oob_kernel "$mode" >"$log" 2>&1
        rc=$?
        line=$(marked cpu_cuda/test/sanitizer/oob_kernel.cu "asan-expect: $mode")
        if [[ $rc -ne 0 ]] && grep -q "$report" "$log" && grep -q "oob_kernel.cu:${line:?}" "$log"; then
            pass "sanitizer catches a kernel's access past $past ($report at oob_kernel.cu:$line)"
        else
            fail "sanitizer did not report a kernel's access past $past (exit $rc; see $log)"
        fi
    done
    unset ASAN_OPTIONS UBSAN_OPTIONS
}

section_racecheck() {
    echo "== racecheck: shared and global memory races, and reads of poison (build/cpu-racecheck)"
    # test_ptx's cp_async_no_barrier_kernel reads another thread's cp.async destination
    # without a barrier on purpose (to see the poison): checked on its own below
    for t in "${KERNEL_TESTS[@]}" test_gpt2 test_training; do
        run "$t [racecheck, reverse order]" env CPUCUDA_INITCHECK=1 CPUCUDA_SCHEDULE=reverse \
            CPUCUDA_RACECHECK_SKIP=cp_async_no_barrier_kernel "build/cpu-racecheck/$t"
    done
    # the lines each report must name are marked in the source (marked), so edits above them do not break this
    local w r
    w=$(marked test/kernels/test_ptx.cu 'racecheck-expect: write') r=$(marked test/kernels/test_ptx.cu 'racecheck-expect: read')
    expect "racecheck reports a read of a cp.async destination without a barrier (test_ptx.cu:$w/$r)" \
        "racecheck: kernel 'cp_async_no_barrier_kernel': shared memory race" "test_ptx.cu:${w:?}" \
        "test_ptx.cu:${r:?}" -- build/cpu-racecheck/test_ptx
    local dir=cpu_cuda/test/sanitizer
    w=$(marked $dir/missing_sync_kernel.cu 'racecheck-expect: write') r=$(marked $dir/missing_sync_kernel.cu 'racecheck-expect: read')
    expect "racecheck reports a missing __syncthreads (missing_sync_kernel.cu:$w/$r)" \
        "racecheck: kernel 'reverse_tile_kernel': shared memory race" "missing_sync_kernel.cu:${w:?}" \
        "missing_sync_kernel.cu:${r:?}" -- build/cpu-racecheck/missing_sync_kernel
    w=$(marked $dir/warp_sync_kernel.cu 'racecheck-expect: race')
    expect "racecheck reports a warp reduction without __syncwarp (warp_sync_kernel.cu:$w)" \
        "racecheck: kernel 'warp_sum_kernel': shared memory race" "warp_sync_kernel.cu:${w:?}" \
        -- build/cpu-racecheck/warp_sync_kernel
    r=$(marked $dir/unwritten_read_kernel.cu 'initcheck-expect: read')
    expect "initcheck reports a read of an unwritten buffer (unwritten_read_kernel.cu:$r)" \
        "initcheck: kernel 'scale_kernel'" "unwritten_read_kernel.cu:${r:?} that nothing wrote" \
        -- env CPUCUDA_INITCHECK=1 build/cpu-racecheck/unwritten_read_kernel
}

section_initcheck() {
    echo "== initcheck: fresh device memory and shared memory poisoned (CPUCUDA_INITCHECK=1)"
    # (the kernel tests, test_gpt2 and test_training run with CPUCUDA_INITCHECK=1 in the racecheck section,
    # whose build also reports each read of the poison by line)
    expect "initcheck: a kernel that reads an unwritten buffer computes NaN" "128 of 256 outputs are NaN" \
        -- env CPUCUDA_INITCHECK=1 build/cpu/unwritten_read_kernel
}

section_nvcc() {
    echo "== nvcc compile check (the trainers for sm_90 and sm_80, the kernel tests for sm_90, the rest to PTX)"
    # the Makefile's nvcc ($NVCC, else $CUDA_HOME/bin/nvcc), else the one on PATH
    nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
    [[ -x $nvcc ]] || nvcc=$(command -v nvcc)
    if [[ -n $nvcc ]]; then
        export NVCC=$nvcc
        # one make -j2 of every target (nvcc is the slow part of the suite), then
        # each is up to date (built from its current source) or it failed
        # the trainers for sm_90, which compiles and assembles every kernel they run (attention
        # at every head size in train_gpt's: the same template as train_llama3's, built at 64 and
        # 128), and their device code for sm_80 at the published models' head sizes (no
        # source has arch-specific branches), the kernel tests (every kernel of llmc/ at the
        # shapes of its test) for sm_90; the other programs, whose kernels are those, through
        # the front end only (NVCC_FRONT_END)
        targets=()
        for t in train_gpt train_llama3; do targets+=("build/gpu/check/$t" "build/gpu/check80/$t"); done
        for src in test/kernels/test_*.cu; do targets+=("build/gpu/check90/$(basename "$src" .cu)"); done
        for src in cpu_cuda/test/test_*.cu test/model/test_*.cu dev/*.cu cpu_cuda/*.cu; do targets+=("build/gpu/front/$(basename "$src" .cu)"); done
        targets+=(build/gpu/single/train_gpt build/gpu/single/train_llama3)
        timed "nvcc: make -j2 of the ${#targets[@]} targets" make -s -k -j2 "${targets[@]}" >"$LOG_DIR/nvcc.log" 2>&1
        for t in "${targets[@]}"; do
            what="nvcc sm_90: $(basename "$t").cu"
            [[ $t == build/gpu/check80/* ]] && what="nvcc sm_80 (the published models' head sizes): $(basename "$t").cu"
            [[ $t == build/gpu/front/* ]] && what="nvcc front end (compute_90 PTX): $(basename "$t").cu"
            [[ $t == build/gpu/single/* ]] && what="nvcc front end: $(basename "$t").cu as a single-GPU build (no MPI, no NCCL)"
            if make -q "$t" 2>/dev/null; then pass "$what"; else fail "$what (see $LOG_DIR/nvcc.log)"; fi
        done
        grep -m 15 -E 'error' "$LOG_DIR/nvcc.log" | sed 's/^/    /'
        # each target depends on the headers it includes (nvcc -MMD writes them to X.d): with
        # a kernel header taken as changed (make -W; nothing is touched), its test is out of date
        dep_target=build/gpu/check90/test_attention dep_header=llmc/kernels/attention.cuh
        if make -q "$dep_target" 2>/dev/null && ! make -q -W "$dep_header" "$dep_target" 2>/dev/null; then
            pass "nvcc header dependencies: $dep_target is out of date once $dep_header changes"
        else
            fail "nvcc header dependencies: $dep_target up to date after a change of $dep_header, or not built"
        fi
        # without a usable GPU (no device or no driver, as here), the nvcc-built trainers say so in one
        # line, why, and name their CPU build (their first CUDA call, llmc/run/distributed.h)
        if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
            for t in train_gpt train_llama3; do
                out=$(timeout "$TIMEOUT" "build/gpu/check/$t" -x 1 2>&1)
                rc=$?
                if [[ $rc -eq 1 && $(wc -l <<<"$out") -eq 1 &&
                    $out == "error: no usable GPU found ("*"); ${t}_cpu runs without one (make ${t}_cpu)" ]]; then
                    pass "nvcc-built $t without a usable GPU: $out"
                else
                    fail "nvcc-built $t without a usable GPU: one error line naming ${t}_cpu (exit $rc: $(head -c 300 <<<"$out"))"
                fi
            done
        fi
        # the SASS of the trainers just built (their ptxas -v reports beside them): no second compile
        run "sass_report (sm_90 SASS facts)" python3 dev/sass_report.py --check \
            --built build/gpu/check/train_gpt --built build/gpu/check/train_llama3
    else
        echo "SKIP nvcc compile check: nvcc not found (set NVCC or install the CUDA toolkit)"
    fi
}

section_gpu() {
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        echo "== GPU tests"
        make -s gpu >"$LOG_DIR/gpu_build.log" 2>&1 || fail "GPU build (see $LOG_DIR/gpu_build.log)"
        arch=sm_${GPU_ARCH:-90}
        for t in "${SINGLE_TESTS[@]}"; do run "$t [gpu]" "build/gpu/$arch/$t"; done
        run "test_nccl [gpu, mpirun -np 1]" $MPIRUN -np 1 "build/gpu/$arch/test_nccl"
        mkdir -p build/test-distributed/gpu
        run "test_distributed [gpu, mpirun -np 1]" $MPIRUN -np 1 "build/gpu/$arch/test_distributed" build/test-distributed/gpu
    else
        echo "SKIP GPU tests: no GPU on this machine"
    fi
}

# run_sections SECTION...: the wanted ones among them, in that order
run_sections() {
    for section in "$@"; do
        [[ " $SECTIONS " == *" $section "* ]] && "section_$section"
    done
    section=none
}

# lane N: a subshell that takes the sections of QUEUE one at a time, each the
# next that no lane has taken (a claim is a mkdir, which only one process wins),
# and writes its tally, failures and times to $LOG_DIR/lane<N>.* for merge_lane
# the longest first; ranks early, since it waits (for its --stall-timeout watchdogs, a
# suspended job) more than it computes, which leaves the other lane both cores
QUEUE=(check check2 asan cpu nvcc ranks racecheck host mpi schedules initcheck)
lane() {
    local n=$1
    (
        TIME_TMP=$LOG_DIR/time.lane$n.tmp passed=0 failed=0 failures=() times=()
        for s in "${QUEUE[@]}"; do
            [[ " $SECTIONS " == *" $s "* ]] && mkdir "$LOG_DIR/claims/$s" 2>/dev/null && run_sections "$s"
        done
        echo "$passed $failed" >"$LOG_DIR/lane$n.tally"
        printf '%s\n' "${failures[@]}" >"$LOG_DIR/lane$n.failures"
        printf '%s\n' "${times[@]}" >"$LOG_DIR/lane$n.times"
    )
}
merge_lane() {
    local n=$1 p f line
    if ! read -r p f <"$LOG_DIR/lane$n.tally"; then
        fail "lane $n ended without its tally"
        return
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    while IFS= read -r line; do [[ -n $line ]] && failures+=("$line"); done <"$LOG_DIR/lane$n.failures"
    while IFS= read -r line; do [[ -n $line ]] && times+=("$line"); done <"$LOG_DIR/lane$n.times"
}

# Two lanes (TEST_LANES=2, the default) side by side, one program of each at a
# time, so that both cores stay busy while one lane runs a single-threaded
# program; whichever lane is free takes the next section. No two programs of
# the lanes share a file (test/test_util.h's scratch_path, temporary folders in
# the scripts). The second lane's output follows the first's.
# TEST_LANES=1: every section in one process, in the order of SECTIONS' default.
if [[ ${TEST_LANES:-2} == 2 ]]; then
    rm -rf "$LOG_DIR"/lane[12].* "$LOG_DIR/claims" && mkdir -p "$LOG_DIR/claims"
    lane 2 >"$LOG_DIR/lane2.out" 2>&1 &
    lane2=$!
    lane 1
    wait $lane2
    echo "== (the second lane's sections)"
    cat "$LOG_DIR/lane2.out"
    merge_lane 1
    merge_lane 2
else
    run_sections check check2 cpu host schedules mpi ranks asan racecheck initcheck nvcc
fi
# gpu after both lanes: its programs use the device alone
run_sections gpu

echo
[[ ${#times[@]} -gt 0 ]] && print_times
if [[ ${#failures[@]} -gt 0 ]]; then
    echo "failing: ${failures[*]}"
    cut -c1-600 "$FAIL_LINES"
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
