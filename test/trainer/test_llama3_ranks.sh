#!/bin/bash
# train_llama3 (default: build/cpu/train_llama3) on the built-in corpus: the
# same 4 steps of 512 tokens as one process accumulating A=4 micro-batches of
# B=2 and as mpirun -np 2 with ZeRO-1 accumulating A=2 each. The global batch
# and its 1/G normalisation are the same, so the printed step losses and
# gradient norms (6 digits) must be equal. The two-rank run's checkpoint:
# DONE lists the model folder's two files and both ranks' state files, and
# mpirun -np 2 -y 1 resumes from it. ZeRO-2 (every micro-batch reduced and
# added into the shard) gives the same step lines with A = 1, 2, 4 on 2 and 4
# ranks, with --doc-mask too (-z 1's exactly with A = 1); ZeRO-3 (the layers' weights gathered
# before each layer's forward and backward) the step lines of -z 2 exactly, on 6 layers too (each
# staging slot reused), and a -z 2 checkpoint resumes with -z 3 and back to the same model files.
# Ranks started with different flags are refused, naming the flag.
#   bash test/trainer/test_llama3_ranks.sh [TRAINER]
cd "$(dirname "$0")/../.." || exit 1
source test/check.sh
BIN=${1:-build/cpu/train_llama3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=(-x 4 -d 512 -v 0 -s 0)
args=(${base[*]} -b 2)
longer=(-x 6 -b 2 -d 512 -v 0 -s 0)
steps() { grep -E '^step +[0-9]+/' "$1" | sed -E 's/^(step +[0-9]+\/[0-9]+ \| loss [0-9.]+ \| norm [0-9.]+).*/\1/'; }
check "one process, A=4: 4 steps" bash -c "'$BIN' ${args[*]} > '$work/one.txt' 2>&1"
check "mpirun -np 2 -z 1, A=2: 4 steps" bash -c "mpirun --oversubscribe --bind-to none -np 2 '$BIN' ${args[*]} -z 1 -o '$work/ck' > '$work/two.txt' 2>&1"
steps "$work/one.txt" > "$work/one.steps"
steps "$work/two.txt" > "$work/two.steps"
check "4 step lines each, losses and norms equal" bash -c "[ \$(wc -l < '$work/one.steps') = 4 ] && cmp -s '$work/one.steps' '$work/two.steps'"
paste -d'\n' "$work/one.steps" "$work/two.steps" | sed 's/^/  /'
# ZeRO-2 (NP ranks, B, A = 8 / (NP x B), FLAGS): the losses and norms of one process with the same
# flags within 2e-4 (B changes the bf16 matmuls' rounding), and with A = 1 the step lines of -z 1
# exactly (the same sums)
close() {  # close A B: 4 step lines each, losses and norms within 2e-4
    python3 - "$1" "$2" <<'PY'
import re, sys
def rows(p): return [tuple(map(float, m)) for m in re.findall(r"loss ([0-9.]+) \| norm ([0-9.]+)", open(p).read())]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
sys.exit(0 if len(a) == len(b) == 4 and all(abs(x - y) <= 2e-4 for r, s in zip(a, b) for x, y in zip(r, s)) else 1)
PY
}
for setup in "2 2" "2 1" "2 4" "4 1" "4 2" "2 1 --doc-mask 1"; do
    read -r np b flags <<<"$setup"
    ref=$work/one.steps
    if [[ -n $flags ]]; then
        "$BIN" ${args[*]} $flags > "$work/one_flags.txt" 2>&1
        steps "$work/one_flags.txt" > "$work/one_flags.steps"
        ref=$work/one_flags.steps
    fi
    for z in 1 2 3; do
        [[ $z == 1 && $((np * b)) != 8 ]] && continue
        mpirun --oversubscribe --bind-to none -x CPUCUDA_WORKERS=1 -np $np "$BIN" ${base[*]} -b $b -z $z $flags \
            > "$work/z$z.txt" 2>&1
        steps "$work/z$z.txt" > "$work/z$z.steps"
    done
    check "mpirun -np $np -z 2, B=$b (A=$((8 / np / b))) $flags: the losses and norms of one process within 2e-4" \
        close "$ref" "$work/z2.steps"
    [[ $((np * b)) == 8 ]] && check "mpirun -np $np -z 2, B=$b (A=1): the step lines of -z 1 exactly" \
        bash -c "[ \$(wc -l < '$work/z2.steps') = 4 ] && cmp -s '$work/z1.steps' '$work/z2.steps'"
    check "mpirun -np $np -z 3, B=$b (A=$((8 / np / b))) $flags: the step lines of -z 2 exactly" \
        bash -c "[ \$(wc -l < '$work/z3.steps') = 4 ] && cmp -s '$work/z2.steps' '$work/z3.steps'"
done
# 6 layers (each weight slot serves three): -z 3 writes the model folder of -z 2 byte for byte, on
# 2 ranks with A = 2; a -z 2 checkpoint at step 2 resumed with -z 3, and a -z 3 one with -z 2, end
# at the same step-4 model
deep=(-e "llama3:L=6,C=64,H=4,KV=2,F=192,V=256" -x 4 -d 512 -v 0 -s 0 -b 2 -n 2)
mpi2() { mpirun --oversubscribe --bind-to none -x CPUCUDA_WORKERS=1 -np 2 "$BIN" "$@"; }
same_model() { cmp -s "$1/model_00000004/model.safetensors" "$2/model_00000004/model.safetensors"; }
mpi2 ${deep[*]} -z 2 -o "$work/deep2" > /dev/null 2>&1
mpi2 ${deep[*]} -z 3 -o "$work/deep3" > /dev/null 2>&1
check "6 layers, mpirun -np 2 -z 3, A=2: the checkpoint's model.safetensors is -z 2's byte for byte" \
    same_model "$work/deep2" "$work/deep3"
for pair in "2 3" "3 2"; do
    read -r from to <<<"$pair"
    cp -r "$work/deep$from" "$work/across$from$to" && rm -r "$work/across$from$to/"*00000004*
    mpi2 ${deep[*]} -z $to -o "$work/across$from$to" -y 1 > "$work/across.txt" 2>&1
    check "a -z $from checkpoint at step 2 resumed with -z $to: the step-4 model of -z 2 byte for byte" \
        bash -c "grep -q 'resuming from step 2 ' '$work/across.txt' && cmp -s '$work/deep2/model_00000004/model.safetensors' '$work/across$from$to/model_00000004/model.safetensors'"
done
check "the two-rank checkpoint's DONE lists model_00000004/config.json, model_00000004/model.safetensors and 2 states" \
    bash -c "[[ \$(grep '^file ' '$work/ck/DONE_00000004' | awk '{print \$2}' | tr '\n' ' ') == 'model_00000004/config.json model_00000004/model.safetensors state_00000004_00000.bin state_00000004_00001.bin ' ]]"
check "mpirun -np 2 -z 1 -y 1 resumes from it to step 6" bash -c "mpirun --oversubscribe --bind-to none -np 2 '$BIN' \
    ${longer[*]} -z 1 -o '$work/ck' -y 1 > '$work/resume.txt' 2>&1 && grep -q 'resuming from step 4 ' '$work/resume.txt' &&
    grep -qE '^step +6/6' '$work/resume.txt'"
# ranks started with different flags (MPMD): refused by rank 0 in one line naming the flag, not a
# run to the end with different weights per rank (the hang guard bounds an unfixed trainer's hang)
guard=$((300 * ${TEST_TIMEOUT_SCALE:-1}))
timeout -k 10 $guard mpirun --oversubscribe --bind-to none -np 1 "$BIN" ${args[*]} -l 1e-3 : -np 1 "$BIN" ${args[*]} \
    -l 2e-3 > "$work/disagree.txt" 2> "$work/disagree.err"
rc=$?
check "ranks with -l 1e-3 and -l 2e-3: refused with one line naming -l (exit $rc, not the hang guard's 124)" \
    bash -c "[[ $rc -ne 0 && $rc -ne 124 && \$(grep -c '^error:' '$work/disagree.err') -eq 1 ]] &&
    grep -q '^error: ranks disagree on -l: rank 0 has 0.001, rank 1 has 0.002 ' '$work/disagree.err'"
grep -m1 '^error:' "$work/disagree.err" | sed 's/^/  /'
# Llama 3.1 8B on 8 ranks of 80 GiB at T=8192 (docs/memory.md): the plan reads the tables only, under a
# 4 GB address-space limit that its 15 GiB of weights would break; ZeRO-1 fits with -r 3, not with -r 2
plan8b() {
    (ulimit -v 4000000 && CPUCUDA_DEVICE_MEMORY_MB=81920 timeout -k 10 $guard mpirun --oversubscribe --bind-to none \
        -np 8 "$BIN" -e llama3.1-8b --memory-plan 1 -b 1 -t 8192 -z 1 -r "$1" 2>&1)
}
plan8b 3 > "$work/plan3.txt"
plan8b 2 > "$work/plan2.txt"
check "8B, 8 ranks, ZeRO-1, -r 3: the plan fits 80 GiB: $(grep '^  total' "$work/plan3.txt" | tr -s ' ')" \
    grep -qx '  total  *67387.5 MiB of 81920.0 MiB on the device' "$work/plan3.txt"
check "... -r 2 does not: $(grep '^  total' "$work/plan2.txt" | tr -s ' ')" \
    grep -q '^  total  *88252.4 MiB of 81920.0 MiB on the device (does not fit)$' "$work/plan2.txt"
# -b auto with --memory-plan: the B a run would choose, from the same plan, nothing allocated: ZeRO-2 with
# -r 3 takes B=7 on 80 GiB (B=8 would not fit), ZeRO-0 without recompute not even B=1 (one error line per rank)
plan8b_auto() {
    (ulimit -v 4000000 && CPUCUDA_DEVICE_MEMORY_MB=81920 timeout -k 10 $guard mpirun --oversubscribe --bind-to none \
        -np 8 "$BIN" -e llama3.1-8b --memory-plan 1 -t 8192 "$@" 2>&1)
}
plan8b_auto -b auto -z 2 -r 3 > "$work/auto.txt"
plan8b_auto -b 8 -z 2 -r 3 > "$work/b8.txt"
plan8b_auto -b auto -z 0 -r 0 > "$work/auto0.txt"
check "8B, 8 ranks, ZeRO-2, -r 3, -b auto: B=7 and its plan fits 80 GiB ($(grep '^-b auto' "$work/auto.txt"))" \
    bash -c "grep -q '^-b auto: B=7, ' '$work/auto.txt' && grep -q '^memory plan per rank (B=7, T=8192' '$work/auto.txt' &&
    grep -q '^  total .* on the device$' '$work/auto.txt'"
check "... and B=8 does not fit: $(grep '^  total' "$work/b8.txt" | tr -s ' ')" \
    grep -q '^  total .*(does not fit)$' "$work/b8.txt"
check "8B, 8 ranks, ZeRO-0, -r 0, -b auto: refused, not even B=1 fits (one error line per rank, 8 ranks)" \
    bash -c "[[ \$(grep -c '^error: -b auto: not even B=1 fits at T=8192' '$work/auto0.txt') -eq 8 &&
    \$(grep -c '^error:' '$work/auto0.txt') -eq 8 ]]"
tally test_llama3_ranks
