#!/bin/bash
# --optimizer muon through a trainer (default build/cpu-fp32/train_gpt; the fp32
# build, so that splits agree to float rounding) on the built-in corpus: it
# trains (the val loss falls) and is not AdamW (its losses differ); one process
# with B=8, A=1, with B=4, A=2, and mpirun -np 2 (B=4) and -np 4 (B=2), with
# and without ZeRO-1 (each matrix on its owner rank), and -np 2 with ZeRO-2
# (A = 2), take the same 4 steps of
# 512 tokens (losses within 2e-5: the gradient is summed in another order, Muon
# then orthogonalises the same matrix), and every rank owns matrices; 3 steps,
# then -y 1 to 6, write the model and state of 6 straight steps byte for byte
# (the momentum resumes), on one process and on 2 ranks (ZeRO-0: the owners'
# state synced into every replica; ZeRO-1); Muon's flags without it, and a
# resume across optimizers are refused, each in one error line.
#   bash test/trainer/test_muon_cli.sh [TRAINER]
cd "$(dirname "$0")/../.." || exit 1
source test/check.sh
BIN=${1:-build/cpu-fp32/train_gpt}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none -x CPUCUDA_WORKERS=1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
losses() { grep -E '^step +[0-9]+/' "$1" | sed -E 's/^step +[0-9]+\/[0-9]+ \| loss ([0-9.]+) .*/\1/'; }
val() { grep -E "^step $2: val loss" "$1" | sed -E 's/.*val loss ([0-9.]+).*/\1/'; }
# close A B TOL: both files hold the same number of losses, each pair within TOL
close() { python3 -c "import sys; a, b = (open(f).read().split() for f in sys.argv[1:3]);
sys.exit(not (len(a) == len(b) > 0 and all(abs(float(x) - float(y)) <= float(sys.argv[3]) for x, y in zip(a, b))))" "$@"; }
one_error() {  # one_error PATTERN ARGS...: non-zero exit, exactly one error line, matching PATTERN
    local pattern=$1
    shift
    "$BIN" "$@" > "$work/err.out" 2> "$work/err.txt"
    [[ $? -ne 0 && $(grep -c '^error:' "$work/err.txt") -eq 1 ]] && grep -q "^error: .*$pattern" "$work/err.txt"
}

"$BIN" --optimizer muon -x 20 -v 20 > "$work/train.txt" 2>&1
check "--optimizer muon trains: val loss $(val "$work/train.txt" 0) at step 0, $(val "$work/train.txt" 20) at step 20" \
    python3 -c "import sys; sys.exit(not float('$(val "$work/train.txt" 20)') < float('$(val "$work/train.txt" 0)') - 0.5)"
"$BIN" --optimizer muon -x 4 -v 0 > "$work/b8.txt" 2>&1
"$BIN" -x 4 -v 0 > "$work/adamw.txt" 2>&1
"$BIN" --optimizer muon -x 4 -v 0 -b 4 -d 512 > "$work/a2.txt" 2>&1
$MPIRUN -np 2 "$BIN" --optimizer muon -x 4 -v 0 -b 4 -d 512 > "$work/np2.txt" 2>&1
$MPIRUN -np 2 "$BIN" --optimizer muon -x 4 -v 0 -b 4 -d 512 -z 1 > "$work/np2z1.txt" 2>&1
$MPIRUN -np 4 "$BIN" --optimizer muon -x 4 -v 0 -b 2 -d 512 > "$work/np4.txt" 2>&1
$MPIRUN -np 4 "$BIN" --optimizer muon -x 4 -v 0 -b 2 -d 512 -z 1 > "$work/np4z1.txt" 2>&1
$MPIRUN -np 2 "$BIN" --optimizer muon -x 4 -v 0 -b 2 -d 512 -z 2 > "$work/np2z2.txt" 2>&1
for f in b8 adamw a2 np2 np2z1 np4 np4z1 np2z2; do losses "$work/$f.txt" > "$work/$f.losses"; done
like_adamw=0  # (close is this shell's function: decided here, not in a check's bash -c)
close "$work/b8.losses" "$work/adamw.losses" 1e-4 && like_adamw=1
check "Muon's 4 losses are not AdamW's ($(tr '\n' ' ' < "$work/b8.losses")vs $(tr '\n' ' ' < "$work/adamw.losses"))" \
    bash -c "[[ \$(wc -l < '$work/b8.losses') == 4 && $like_adamw == 0 ]]"
check "B=4, A=2: the 4 losses of B=8, A=1 (within 2e-5)" close "$work/b8.losses" "$work/a2.losses" 2e-5
check "mpirun -np 2, B=4 (ZeRO-0): the 4 losses of one process (within 2e-5)" close "$work/b8.losses" "$work/np2.losses" 2e-5
check "mpirun -np 2, B=4, ZeRO-1: the 4 losses of one process (within 2e-5)" close "$work/b8.losses" "$work/np2z1.losses" 2e-5
check "mpirun -np 4, B=2 (ZeRO-0): the 4 losses of one process (within 2e-5)" close "$work/b8.losses" "$work/np4.losses" 2e-5
check "mpirun -np 4, B=2, ZeRO-1: the 4 losses of one process (within 2e-5)" close "$work/b8.losses" "$work/np4z1.losses" 2e-5
check "mpirun -np 2, B=2, A=2, ZeRO-2 (each micro-batch reduced to the owner): the 4 losses of one process (within 2e-5)" \
    close "$work/b8.losses" "$work/np2z2.losses" 2e-5
owners() { grep -E '^Muon: each matrix orthogonalised by one owner rank' "$1" | sed -E 's/.*; ([0-9]+) to ([0-9]+) matrix.*/\1 \2/'; }
check "mpirun -np 2 and 4: every rank owns some of Muon's matrices ($(owners "$work/np2z1.txt"); $(owners "$work/np4z1.txt"))" \
    bash -c "read a b <<< '$(owners "$work/np2z1.txt")'; read c d <<< '$(owners "$work/np4z1.txt")'; (( a > 0 && c > 0 ))"
"$BIN" --optimizer muon -x 6 -n 3 -v 0 -o "$work/straight" > /dev/null 2>&1
"$BIN" --optimizer muon -x 3 -v 0 -o "$work/split" > /dev/null 2>&1
"$BIN" --optimizer muon -x 6 -n 3 -v 0 -o "$work/split" -y 1 > "$work/resumed.txt" 2>&1
same=1
files=$(cd "$work/straight" && find . -path './model_00000006*' -type f; echo ./state_00000006_00000.bin)
for f in $files; do  # (llm.c's model file, or a Llama checkpoint's folder of files)
    cmp -s "$work/straight/$f" "$work/split/$f" || same=0
done
check "3 steps, then -y 1 to 6: model and state of 6 straight steps byte for byte" \
    bash -c "[[ $same == 1 ]] && grep -q 'resuming from step 3' '$work/resumed.txt'"
for z in 0 1; do  # ZeRO-0: the owners' state synced into every replica; ZeRO-1: each rank's shard
    run2() { $MPIRUN -np 2 "$BIN" --optimizer muon -b 4 -d 512 -v 0 -z $z "$@"; }
    run2 -x 6 -n 3 -o "$work/straight$z" > /dev/null 2>&1
    run2 -x 3 -o "$work/split$z" > /dev/null 2>&1
    run2 -x 6 -n 3 -o "$work/split$z" -y 1 > "$work/resumed$z.txt" 2>&1
    same=1 count=0
    for f in $(cd "$work/straight$z" && find . -path './model_00000006*' -type f; ls ./state_00000006_*.bin); do
        cmp -s "$work/straight$z/$f" "$work/split$z/$f" || same=0
        count=$((count + 1))
    done
    check "mpirun -np 2 -z $z: 3 steps, then -y 1 to 6: model and both ranks' states of 6 straight steps byte for byte" \
        bash -c "[[ $same == 1 && $count -ge 3 ]] && grep -q 'resuming from step 3' '$work/resumed$z.txt'"
done
check "--muon-lr without --optimizer muon: refused" one_error "--muon-lr: Muon's setting needs --optimizer muon" \
    --muon-lr 0.01
"$BIN" -x 2 -v 0 -o "$work/adamw_ck" > /dev/null 2>&1
check "an AdamW checkpoint resumed with --optimizer muon: refused, naming the optimizer" \
    one_error "written with --optimizer adamw; resume with it" --optimizer muon -x 4 -v 0 -o "$work/adamw_ck" -y 1
tally test_muon_cli
