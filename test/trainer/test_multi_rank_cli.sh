#!/usr/bin/env bash
# The trainer under mpirun (CPU runtime, one process per rank): the same
# tokens per step split over 1, 2 and 4 ranks, with ZeRO-0, 1, 2 and 3, give
# the same losses; only rank 0 prints; a rank that fails stops every rank
# with its error line, never a hang. The hang guards scale with
# TEST_TIMEOUT_SCALE (test/run_tests.sh); no check depends on how long a run took.
# Usage: test/trainer/test_multi_rank_cli.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-build/cpu/train_gpt}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
GUARD=$((300 * ${TEST_TIMEOUT_SCALE:-1}))
MPIRUN="mpirun --oversubscribe --bind-to none -x CPUCUDA_WORKERS=1"
passed=0 failed=0
check() {  # check NAME CONDITION-EXIT-STATUS
    if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "PASS $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi
}

# The built-in corpus and model, 4 steps of 512 tokens (B x T = 8 x 64).
RUN=(-x 4 -v 0)
"$BIN" "${RUN[@]}" -b 8 >"$WORK/n1" 2>&1
check "one process, B=8: runs" $?
# same_losses FILE [REFERENCE]: the four losses within 2e-4 of one process with B=8
same_losses() {
    python3 - "${2:-$WORK/n1}" "$1" <<'PY'
import re, sys
def losses(p): return [float(m) for m in re.findall(r"^step +\d+/\d+ \| loss ([0-9.]+)", open(p).read(), re.M)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) == 4 else float("inf")
print("%.1e" % worst)
sys.exit(0 if worst <= 2e-4 else 1)
PY
}
for setup in "2 4 0 512" "2 2 0 512" "2 2 1 512" "4 2 0 512" "4 1 1 512" "2 2 2 512" "2 1 2 512" "4 1 2 512" \
    "2 2 3 512" "4 1 3 512"; do
    read -r np b z d <<<"$setup"
    timeout $GUARD $MPIRUN -np "$np" "$BIN" "${RUN[@]}" -b "$b" -d "$d" -z "$z" >"$WORK/run" 2>&1
    rc=$?
    worst=$(same_losses "$WORK/run")
    same=$?
    [[ $rc -eq 0 && $same -eq 0 ]] && grep -q "batch: B=$b x T=64 x N=$np x A=$((d / (b * 64 * np))) = 512 tokens per step" "$WORK/run"
    check "mpirun -np $np, B=$b, ZeRO-$z: 4 losses equal one process with B=8 (max diff $worst <= 2e-4; bf16)" $?
done
# documents: masked attention and per-document positions split the same way (with ZeRO-1 and recompute)
DOCS=(--doc-mask 1 --doc-positions 1)
"$BIN" "${RUN[@]}" -b 8 "${DOCS[@]}" >"$WORK/n1d" 2>&1
timeout 300 $MPIRUN -np 2 "$BIN" "${RUN[@]}" -b 2 -d 512 -z 1 -r 2 "${DOCS[@]}" >"$WORK/run" 2>&1
rc=$?
worst=$(same_losses "$WORK/run" "$WORK/n1d")
[[ $rc -eq 0 && $? -eq 0 ]] && ! cmp -s <(grep '^step' "$WORK/n1") <(grep '^step' "$WORK/n1d")
check "--doc-mask 1 --doc-positions 1: mpirun -np 2, B=2, A=2, ZeRO-1, -r 2 gives the 4 losses of one process with B=8 (max diff $worst), which differ from unmasked ones" $?

timeout $GUARD $MPIRUN -np 2 "$BIN" "${RUN[@]}" -b 4 -z 1 >"$WORK/z1" 2>&1
[[ $(grep -c '^model:' "$WORK/z1") -eq 1 && $(grep -cE '^step +4/4' "$WORK/z1") -eq 1 ]]
check "only rank 0 prints (one model line, one line per step)" $?
grep -qE "optimizer state per rank: .* with ZeRO-1 .* saves .* MiB per rank" "$WORK/z1"
ok=$?  # (before the message's $(...) resets $?)
check "ZeRO-1 reports the memory it saves per rank: $(grep -o 'saves [0-9.]* MiB per rank' "$WORK/z1")" $ok

# -o under ZeRO-1: every rank holds the gathered weights; rank 0's model file
# must match the ZeRO-0 run's within bf16 noise.
timeout $GUARD $MPIRUN -np 2 "$BIN" "${RUN[@]}" -b 4 -z 1 -o "$WORK/out1" >/dev/null 2>&1 &&
    timeout $GUARD $MPIRUN -np 2 "$BIN" "${RUN[@]}" -b 4 -z 0 -o "$WORK/out0" >/dev/null 2>&1 &&
    python3 - "$WORK/out0/model_00000004.bin" "$WORK/out1/model_00000004.bin" <<'PY'
import struct, sys
def weights(path):
    data = open(path, "rb").read()
    version = struct.unpack_from("<i", data, 4)[0]
    if version == 3:
        return struct.unpack("<%df" % ((len(data) - 1024) // 4), data[1024:])
    raw = struct.unpack("<%dH" % ((len(data) - 1024) // 2), data[1024:])  # bf16: the top half of an fp32
    return struct.unpack("<%df" % len(raw), struct.pack("<%dI" % len(raw), *[r << 16 for r in raw]))
x, y = weights(sys.argv[1]), weights(sys.argv[2])
scale = max(abs(v) for v in x)
diff = max(abs(p - q) for p, q in zip(x, y))
sys.exit(0 if len(x) == len(y) and diff / scale <= 1e-2 else 1)
PY
check "ZeRO-1 with -o writes the model, equal to ZeRO-0's within bf16 noise" $?

# ZeRO-2 with A = 1 sums exactly as ZeRO-1 (the first micro-batch reduce-scatters straight into the
# shard): the model and both ranks' state bodies bitwise ZeRO-1's (the headers say the stage),
# on 2 and on 4 ranks; its memory plan has the gradient staging, smaller than ZeRO-1's gradients
# for a model of 8 layers.
same_run() {  # same_run DIR1 DIR2 NP: step 4's model and every rank's state body equal
    cmp -s "$1/model_00000004.bin" "$2/model_00000004.bin" || return 1
    for ((r = 0; r < $3; r++)); do
        cmp -s -i 1024 "$1/state_00000004_0000$r.bin" "$2/state_00000004_0000$r.bin" || return 1
    done
}
timeout $GUARD $MPIRUN -np 2 "$BIN" "${RUN[@]}" -b 4 -z 2 -o "$WORK/out2" >/dev/null 2>&1 &&
    same_run "$WORK/out1" "$WORK/out2" 2
check "ZeRO-2 on 2 ranks, A=1: model and state files bitwise ZeRO-1's" $?
timeout $GUARD $MPIRUN -np 4 "$BIN" "${RUN[@]}" -b 2 -z 1 -o "$WORK/out41" >/dev/null 2>&1 &&
    timeout $GUARD $MPIRUN -np 4 "$BIN" "${RUN[@]}" -b 2 -z 2 -o "$WORK/out42" >/dev/null 2>&1 &&
    same_run "$WORK/out41" "$WORK/out42" 4
check "ZeRO-2 on 4 ranks, A=1: model and state files bitwise ZeRO-1's" $?
# 6 layers: each of the two staging slots serves three layers per backward, so a slot reused before
# its reduce-scatter has read it (or not zeroed) shows; A = 1 bitwise ZeRO-1's, A = 2 within 2e-4
DEEP=(-e "L=6,C=64,H=4,V=256,maxT=64" -x 4 -v 0 -d 512)
for b in 4 2; do
    timeout $GUARD $MPIRUN -np 2 "$BIN" "${DEEP[@]}" -b $b -z 1 -o "$WORK/deep1_$b" >"$WORK/deep1_$b.out" 2>&1 &&
        timeout $GUARD $MPIRUN -np 2 "$BIN" "${DEEP[@]}" -b $b -z 2 -o "$WORK/deep2_$b" >"$WORK/deep2_$b.out" 2>&1 &&
        if [[ $b == 4 ]]; then same_run "$WORK/deep1_$b" "$WORK/deep2_$b" 2; else
            same_losses "$WORK/deep2_$b.out" "$WORK/deep1_$b.out" >/dev/null; fi
    ok=$?  # (before the message's $(...) resets $?)
    what=$([[ $b == 4 ]] && echo "bitwise ZeRO-1's model and states" || echo "ZeRO-1's losses within 2e-4")
    check "6 layers, 2 ranks, B=$b (A=$((4 / b))): ZeRO-2 $what" $ok
done
# ZeRO-3 sums as ZeRO-2 and its forward and backward read the same weights, gathered into two
# slots that 6 layers reuse three times each: a gather skipped, or a slot overwritten before its
# layer has read it, shows. The model file (gathered for the checkpoint) and the states bitwise
# ZeRO-2's, with A = 1, 2, 4 on 2 ranks and A = 2 on 4.
for setup in "2 4" "2 2" "2 1" "4 1"; do
    read -r np b <<<"$setup"
    ref=$WORK/deep2_$b  # (the ZeRO-2 runs above, where there is one)
    if [[ $np != 2 || ! -d $ref ]]; then
        ref=$WORK/deep2_${np}_$b
        timeout $GUARD $MPIRUN -np $np "$BIN" "${DEEP[@]}" -b $b -z 2 -o "$ref" >/dev/null 2>&1
    fi
    timeout $GUARD $MPIRUN -np $np "$BIN" "${DEEP[@]}" -b $b -z 3 -o "$WORK/deep3_${np}_$b" >/dev/null 2>&1 &&
        same_run "$ref" "$WORK/deep3_${np}_$b" $np
    check "6 layers, $np ranks, B=$b (A=$((8 / np / b))): ZeRO-3's model file and states bitwise ZeRO-2's" $?
done
# deferred streams (cpu_cuda/README.md: a stream's work runs only when something needs it, a
# collective at once): a gather that did not wait for its slot's last readers would overwrite
# weights that layer's kernels have yet to read
timeout $GUARD $MPIRUN -x CPUCUDA_STREAMS=deferred -np 2 "$BIN" "${DEEP[@]}" -b 2 -z 3 -o "$WORK/deep3_deferred" \
    >/dev/null 2>&1 && same_run "$WORK/deep2_2" "$WORK/deep3_deferred" 2
check "6 layers, 2 ranks, A=2, deferred streams: ZeRO-3 bitwise ZeRO-2's (each gather waits for its slot's readers)" $?
# evaluation, HellaSwag and samples run forwards, whose ZeRO-3 gathers every rank must join: on 3
# ranks (10 examples: 4, 3, 3 per rank, one per batch) the same lines as ZeRO-2, no hang (the
# stall timeout ends one: a failing check, not a slow one)
python3 - "$WORK/hs.bin" <<'PY'
import struct, sys, random
rng = random.Random(3)
examples = []
for i in range(10):
    ctx = [rng.randrange(255) for _ in range(rng.randrange(3, 9))]
    ends = [[rng.randrange(255) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
    body = [i, rng.randrange(4), 4, len(ctx), *ctx]
    for e in ends:
        body += [len(e), *e]
    examples.append([65535, 2 * (len(body) + 2)] + body)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240522, 1, len(examples), max(2 * len(r) for r in examples), *[0] * 252))
    for r in examples:
        f.write(struct.pack("<%dH" % len(r), *r))
PY
EVAL=(-e "L=6,C=64,H=4,V=256,maxT=64" -x 2 -b 4 -d 768 -v 2 -s 2 -g 8 -h 1 --hellaswag-file "$WORK/hs.bin"
    --stall-timeout $((60 * ${TEST_TIMEOUT_SCALE:-1})))
for z in 2 3; do timeout $GUARD $MPIRUN -np 3 "$BIN" "${EVAL[@]}" -z $z >"$WORK/eval$z" 2>&1; done
evals() { grep -E "^step [0-9]+: (val loss|HellaSwag|sample)" "$1"; }
[[ $(evals "$WORK/eval3" | wc -l) -eq 5 ]] && cmp -s <(evals "$WORK/eval2") <(evals "$WORK/eval3")
check "3 ranks, ZeRO-3: val loss, HellaSwag and the sample equal ZeRO-2's: $(evals "$WORK/eval3" | tail -1)" $?
plan_row() {  # plan_row ZERO ROW: the MiB of a memory plan row, 2 ranks, 8 layers
    timeout $GUARD $MPIRUN -np 2 "$BIN" -e "L=8,C=64,H=4,V=256,maxT=64" -b 4 -t 64 -z "$1" --memory-plan 1 2>&1 |
        grep -E "^  $2 +[0-9.]+ MiB" | awk '{print $(NF-1)}'
}
z1_grad=$(plan_row 1 "fp32 gradients") z2_grad=$(plan_row 2 "fp32 gradient staging")
python3 -c "import sys; sys.exit(0 if 0 < float('${z2_grad:-0}') < float('${z1_grad:-0}') else 1)"
check "memory plan, 8 layers: ZeRO-2's fp32 gradient staging ($z2_grad MiB) below ZeRO-1's fp32 gradients ($z1_grad MiB)" $?
z2_weights=$(plan_row 2 parameters) z3_staging=$(plan_row 3 "weights \\(staging and non-layer\\)")
z3_shard=$(plan_row 3 "ZeRO-3 weight shard")
python3 -c "import sys; a, b, c = (float(x or 0) for x in ('$z2_weights', '$z3_staging', '$z3_shard')); sys.exit(0 if 0 < b < a and 0 < c < a else 1)"
check "memory plan, 8 layers: ZeRO-3's weight staging ($z3_staging MiB) and shard ($z3_shard MiB) each below ZeRO-2's weights ($z2_weights MiB)" $?

# resume on 2 ranks with ZeRO-1: the step-6 checkpoint made again from the
# step-3 one is bitwise the first (model and both ranks' state files)
timeout $GUARD $MPIRUN -np 2 "$BIN" -x 6 -v 0 -b 4 -z 1 -n 3 -o "$WORK/ck" >/dev/null 2>&1
cp -r "$WORK/ck" "$WORK/ck2" && rm "$WORK/ck2/"*00000006*
timeout $GUARD $MPIRUN -np 2 "$BIN" -x 6 -v 0 -b 4 -z 1 -n 3 -o "$WORK/ck2" -y 1 >"$WORK/out" 2>&1
grep -q "resuming from step 3" "$WORK/out" && cmp -s "$WORK/ck/model_00000006.bin" "$WORK/ck2/model_00000006.bin" &&
    cmp -s "$WORK/ck/state_00000006_00000.bin" "$WORK/ck2/state_00000006_00000.bin" &&
    cmp -s "$WORK/ck/state_00000006_00001.bin" "$WORK/ck2/state_00000006_00001.bin" && [[ -e "$WORK/ck2/DONE_00000006" ]]
check "2 ranks, ZeRO-1: resuming from step 3 gives bitwise the step-6 model and both state files" $?
# across ZeRO-1 and ZeRO-2 (the same shard; A = 1: the same sums): ZeRO-1's step-3 checkpoint
# resumed with -z 2, and ZeRO-2's with -z 1, end bitwise at the uninterrupted step-6 model
resumed_across() {  # resumed_across FROM_Z TO_Z: FROM_Z's run to 6, its step 3 resumed with TO_Z
    local from=$WORK/across$1for$2 to=$WORK/across$1to$2
    timeout $GUARD $MPIRUN -np 2 "$BIN" -x 6 -v 0 -b 4 -z "$1" -n 3 -o "$from" >/dev/null 2>&1 &&
        cp -r "$from" "$to" && rm "$to/"*00000006* &&
        timeout $GUARD $MPIRUN -np 2 "$BIN" -x 6 -v 0 -b 4 -z "$2" -n 3 -o "$to" -y 1 >"$WORK/out" 2>&1 &&
        grep -q "resuming from step 3" "$WORK/out" && cmp -s "$from/model_00000006.bin" "$to/model_00000006.bin" &&
        cmp -s "$WORK/ck/model_00000006.bin" "$to/model_00000006.bin"
}
resumed_across 1 2
check "2 ranks: a ZeRO-1 checkpoint resumed with -z 2 ends bitwise at ZeRO-1's step-6 model" $?
resumed_across 2 1
check "2 ranks: a ZeRO-2 checkpoint resumed with -z 1 ends bitwise at the step-6 model" $?
resumed_across 2 3
check "2 ranks: a ZeRO-2 checkpoint resumed with -z 3 ends bitwise at the step-6 model" $?
resumed_across 3 2
check "2 ranks: a ZeRO-3 checkpoint resumed with -z 2 ends bitwise at the step-6 model" $?
"$BIN" -x 6 -v 0 -b 8 -o "$WORK/ck" -y 1 >"$WORK/out" 2>"$WORK/err"
[[ $? -ne 0 ]] && grep -q "^error: .*saved with 2 processes, this run has 1" "$WORK/err"
ok=$?
check "resuming 2 ranks' checkpoint on 1 is refused: $(head -1 "$WORK/err")" $ok

"$BIN" -z 4 >"$WORK/out" 2>"$WORK/err"
[[ $? -ne 0 ]] && grep -q "^error: -z 4" "$WORK/err"
ok=$?
check "-z 4 is refused: $(head -1 "$WORK/err")" $ok
"$BIN" --optimizer muon -z 3 >"$WORK/out" 2>"$WORK/err"
[[ $? -ne 0 && $(wc -l <"$WORK/err") -eq 1 ]] && grep -q "^error: --optimizer muon with -z 3: .*whole weights" "$WORK/err"
ok=$?
check "--optimizer muon -z 3 is refused: $(head -1 "$WORK/err")" $ok
$MPIRUN -np 2 "$BIN" --help >"$WORK/help" 2>&1
[[ $? -eq 0 && $(grep -c "^Usage" "$WORK/help") -eq 1 ]] && grep -q "MPI + NCCL build" "$WORK/help"
check "--help under mpirun -np 2: exit 0, printed once, says how the build runs ranks" $?

# Rank 1 cannot open its data (MPMD launch: rank 0 has good data and reaches
# its first collective). Every rank must stop with rank 1's line, not hang.
timeout -k 10 $GUARD mpirun --oversubscribe --bind-to none -np 1 "$BIN" -x 4 : -np 1 "$BIN" -x 4 -i "$WORK/missing_*.bin" \
    >"$WORK/out" 2>"$WORK/err"
rc=$?
[[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "^error: .*missing_" "$WORK/err"
ok=$?
check "one rank failing stops all ranks (exit $rc, not the hang guard's 124) with: $(grep -m1 '^error:' "$WORK/err")" $ok

# Ranks started with different flags (MPMD), or reading different files under one path (each rank in
# its own folder), are refused before their first collective: one line from rank 0 naming the first
# difference, a non-zero exit, not the hang guard's 124 (a flag that hung in a collective, -x; one that
# trained on to different weights, --seed; the data; the model). The same --stall-timeout on every rank
# bounds a hang of an unfixed trainer: a failing check, not a slow one.
AGREE=(-v 0 -b 4 -t 64 --stall-timeout $((60 * ${TEST_TIMEOUT_SCALE:-1})))
# refused NAME PATTERN COMMAND...: the job is refused with one error line "ranks disagree on PATTERN"
refused() {
    local name=$1 pattern=$2
    shift 2
    timeout -k 10 $GUARD "$@" >"$WORK/out" 2>"$WORK/err"
    local rc=$?
    [[ $rc -ne 0 && $rc -ne 124 && $(grep -c '^error:' "$WORK/err") -eq 1 ]] &&
        grep -q "^error: ranks disagree on $pattern (every rank of a job must be started with the same flags, model and data)$" "$WORK/err"
    local ok=$?
    check "$name: refused (exit $rc, not the hang guard's 124): $(grep -m1 '^error:' "$WORK/err")" $ok
}
MPMD="mpirun --oversubscribe --bind-to none -np 1 $BIN"
refused "ranks with -x 4 and -x 5" "-x: rank 0 has 4, rank 1 has 5" $MPMD -x 4 "${AGREE[@]}" : -np 1 "$BIN" -x 5 "${AGREE[@]}"
refused "ranks with --seed 1 and --seed 2" "--seed: rank 0 has 1, rank 1 has 2" \
    $MPMD -x 2 --seed 1 "${AGREE[@]}" : -np 1 "$BIN" -x 2 --seed 2 "${AGREE[@]}"
timeout -k 10 $GUARD $MPMD -x 2 "${AGREE[@]}" : -np 1 "$BIN" -x 02 "${AGREE[@]}" >"$WORK/out" 2>&1
rc=$?
[[ $rc -eq 0 ]] && grep -qE "^step +2/2 " "$WORK/out"
check "ranks with -x 2 and -x 02 agree (values as parsed): 2 steps, exit $rc" $?
# each rank in its own folder $WORK/rankR: one -i and one -e text, different files (rank 1's shard:
# the first half of the tokens, its header says so; rank 1's model: one weight x4 or /4)
"$BIN" -x 1 -v 0 -b 4 -o "$WORK/agree_model" >/dev/null 2>&1
for r in 0 1; do
    mkdir -p "$WORK/rank$r" && cp build/markov/markov_train_000001.bin "$WORK/rank$r/train.bin" &&
        cp "$WORK/agree_model/model_00000001.bin" "$WORK/rank$r/model.bin"
done
python3 - "$WORK/rank1" <<'PY'
import struct, sys
p = sys.argv[1] + "/train.bin"; d = bytearray(open(p, "rb").read())
n = struct.unpack_from("<i", d, 8)[0] // 2
struct.pack_into("<i", d, 8, n)
open(p, "wb").write(d[:1024 + 2 * n])
p = sys.argv[1] + "/model.bin"; d = bytearray(open(p, "rb").read()); d[-1] ^= 1; open(p, "wb").write(d)
PY
IN_RANK_DIR='cd "$0$OMPI_COMM_WORLD_RANK" && exec "$@"'
ABS_BIN=$(realpath "$BIN")
refused "ranks whose -i train.bin are different shards" "the -i data: rank 0 has 1 shard of [0-9]* bytes .*, rank 1 has 1 shard of [0-9]* bytes .*" \
    $MPIRUN -np 2 bash -c "$IN_RANK_DIR" "$WORK/rank" "$ABS_BIN" -i train.bin -e "$WORK/rank0/model.bin" -x 2 "${AGREE[@]}"
refused "ranks whose -e model.bin are different files" "the model's weights: rank 0 has xxh64 [0-9a-f]*, rank 1 has xxh64 [0-9a-f]*" \
    $MPIRUN -np 2 bash -c "$IN_RANK_DIR" "$WORK/rank" "$ABS_BIN" -e model.bin -i "$WORK/rank0/train.bin" -x 2 "${AGREE[@]}"
# (the same job with rank 1's files made rank 0's runs: the refusals above are for the difference)
cp "$WORK/rank0/"* "$WORK/rank1/"
timeout -k 10 $GUARD $MPIRUN -np 2 bash -c "$IN_RANK_DIR" "$WORK/rank" "$ABS_BIN" -e model.bin -i train.bin -x 2 \
    "${AGREE[@]}" >"$WORK/out" 2>&1
rc=$?
[[ $rc -eq 0 ]] && grep -qE "^step +2/2 " "$WORK/out"
check "ranks whose -i train.bin and -e model.bin are equal files: 2 steps, exit $rc" $?

# ZeRO-0 replicas must be equal: a rank whose state differs (here behind a DONE rewritten to
# vouch for it) is refused on resume, naming the rank
timeout $GUARD $MPIRUN -np 2 "$BIN" -x 2 -v 0 -b 4 -z 0 -o "$WORK/rep" >/dev/null 2>&1
python3 -c "
p = '$WORK/rep/state_00000002_00001.bin'; d = bytearray(open(p, 'rb').read()); d[2000] ^= 1; open(p, 'wb').write(d)"
python3 test/xxh64.py "$WORK/rep" 2  # a DONE vouching for the changed file: the replica check speaks
timeout $GUARD $MPIRUN -np 2 "$BIN" -x 3 -v 0 -b 4 -z 0 -o "$WORK/rep" -y 1 >/dev/null 2>"$WORK/err"
[[ $? -ne 0 ]] && grep -q "^error: .*ZeRO-0 replicas differ: the optimizer state of rank 1 is not rank 0's" "$WORK/err"
ok=$?
check "ZeRO-0 replicas that differ are refused on resume: $(grep -m1 '^error:' "$WORK/err")" $ok

# ranks_of PID: the train_gpt ranks that the mpirun started by `timeout ... mpirun` (PID) runs
ranks_of() { pgrep -P "$(pgrep -P "$1" | head -n 1)"; }
# alive PID: the process exists and has not exited (a zombie has: where PID 1 does not reap, as in a
# container, it stays listed)
alive() { [[ -n $(ps -o stat= -p "$1" | grep -v '^Z') ]]; }
# ranks_left BOUND PID...: how many of the processes are still alive once each has ended, or once
# BOUND seconds (a hang guard, not a speed) have passed
ranks_left() {
    local bound=$1 left=0 p
    shift
    local end=$((SECONDS + bound))
    for p in "$@"; do
        while alive "$p" && ((SECONDS < end)); do sleep 0.05; done
        alive "$p" && left=$((left + 1))
    done
    echo $left
}
# wait_for FILE PATTERN PID: until FILE has a line matching PATTERN, or PID is gone (progress, not time)
wait_for() { until grep -qE "$2" "$1" 2>/dev/null || ! kill -0 "$3" 2>/dev/null; do sleep 0.05; done; }

# SIGTERM to one rank (as a preemption would send it): every rank stops after the same
# step, the checkpoint there is complete, exit 0; resuming it ends bitwise where an
# uninterrupted run ends. The signalled jobs are long (-x 99999), so that the signal, sent
# after step 2, finds them running however slowly it comes; with a constant lr after the
# warmup (-k constant) a step's numbers do not depend on -x, so the uninterrupted run to
# compare with is as long as the resumed one.
SIG=(-v 0 -b 4 -z 1 -k constant)
# signal_job WHOM SIGNAL NAME: a long job into $WORK/NAME, its output in $WORK/NAME.out; after
# step 2, SIGNAL to WHOM (rank1: the last rank; mpirun); returns mpirun's exit status
signal_job() {
    : >"$WORK/$3.out"  # emptied first: the poll below must not see an earlier run's lines
    timeout $GUARD $MPIRUN -np 2 "$BIN" "${SIG[@]}" -x 99999 -o "$WORK/$3" >"$WORK/$3.out" 2>&1 &
    local job=$!
    wait_for "$WORK/$3.out" "^step +2/" $job
    if [[ $1 == rank1 ]]; then kill -"$2" $(ranks_of $job | tail -n 1); else kill -"$2" $(pgrep -P $job); fi
    wait $job
}
# stopped_after FILE: the step after which the run of FILE stopped for a signal (empty if it did not)
stopped_after() { grep -o "stopped by a signal after step [0-9]*" "$1" | grep -o "[0-9]*$"; }
signal_job rank1 TERM sig
rc=$?
stopped=$(stopped_after "$WORK/sig.out")
[[ $rc -eq 0 && -n $stopped && -e "$WORK/sig/DONE_$(printf %08d "$stopped")" ]]
check "SIGTERM to rank 1 of 2: both stop after step ${stopped:-?} with a complete checkpoint, exit $rc" $?
end=$((${stopped:-0} + 3))
e=$(printf %08d $end)
timeout $GUARD $MPIRUN -np 2 "$BIN" "${SIG[@]}" -x $end -o "$WORK/sigref" >/dev/null 2>&1 &&
    timeout $GUARD $MPIRUN -np 2 "$BIN" "${SIG[@]}" -x $end -o "$WORK/sig" -y 1 >/dev/null 2>&1 &&
    cmp -s "$WORK/sigref/model_$e.bin" "$WORK/sig/model_$e.bin" &&
    cmp -s "$WORK/sigref/state_${e}_00000.bin" "$WORK/sig/state_${e}_00000.bin" &&
    cmp -s "$WORK/sigref/state_${e}_00001.bin" "$WORK/sig/state_${e}_00001.bin"
check "resumed after the signal, the step-$end model and both state files equal an uninterrupted run's" $?

# the watchdog: a rank stopped with SIGSTOP makes the other wait in a collective; after
# --stall-timeout it says what it waited for and the job ends, no process left (the hang
# guard counts from the stop: the timeout plus 120 s, a hang's bound, not a speed; start-up and the first steps take what
# they take on a busy machine)
STALL=20
: >"$WORK/stallout" >"$WORK/stallerr"  # emptied first: the poll below must not see an earlier run's lines
timeout -k 10 $GUARD $MPIRUN -np 2 "$BIN" -x 99999 -v 0 -b 4 --stall-timeout $STALL >"$WORK/stallout" 2>"$WORK/stallerr" &
job=$!
wait_for "$WORK/stallout" "^step +2/" $job
ranks=$(ranks_of $job)
kill -STOP $(echo "$ranks" | tail -n 1)
# The hang guard only kills (SIGKILL); the verdict is the job's own exit status, 137 when the
# guard's SIGKILL ended mpirun (timeout exits 128 + the signal), never a marker file. Cancelling
# it: SIGKILL to the guard's shell (it cannot run its kill afterwards), then to its sleep.
bash -c 'sleep "$1"; kill -KILL $2' guard $(((STALL + 120) * ${TEST_TIMEOUT_SCALE:-1})) "$(pgrep -P $job) $ranks" \
    </dev/null >/dev/null 2>&1 &
guard=$!
wait $job
rc=$?
sleeper=$(pgrep -P $guard)
kill -KILL $guard $sleeper 2>/dev/null
wait $guard 2>/dev/null
[[ $rc -eq 137 ]] && rc=124  # (the guard's kill)
# mpirun may return while the kernel still tears down a rank it killed (its SIGKILL is sent, the
# process not yet gone): each rank is waited for until it is gone, bounded by a hang guard
left=$(ranks_left $((60 * ${TEST_TIMEOUT_SCALE:-1})) $ranks)
for p in $ranks; do kill -9 "$p" 2>/dev/null; done  # (only if the check fails)
[[ $rc -ne 0 && $rc -ne 124 && $left -eq 0 ]] && grep -q "^error: rank [0-9]: no progress for [0-9]* s (--stall-timeout $STALL) during " "$WORK/stallerr"
ok=$?
check "a rank stopped by SIGSTOP: the job ends (exit $rc, $left processes left): $(grep -m1 '^error: rank' "$WORK/stallerr")" $ok

# ... and before the first step: rank 1 is stopped as it opens the -e model file (strace stops it
# there, a point of progress, not of time); rank 0 waits for it in the ranks' agreement on the model
"$BIN" -x 1 -v 0 -b 4 -o "$WORK/m0" >/dev/null 2>&1
MODEL=$WORK/m0/model_00000001.bin
STOP_RANK1='if [[ $OMPI_COMM_WORLD_RANK == 1 ]]; then exec strace -qq -o /dev/null -P "$0" -e trace=openat \
    -e inject=openat:signal=SIGSTOP "$@"; fi; exec "$@"'
timeout -k 10 $GUARD $MPIRUN -np 2 bash -c "$STOP_RANK1" "$MODEL" "$BIN" -e "$MODEL" \
    -x 4 -v 0 -b auto --stall-timeout $STALL >"$WORK/stallout" 2>"$WORK/stallerr"
rc=$?
pkill -9 -f -- "-e $MODEL" 2>/dev/null  # (the stopped rank, left behind by strace)
[[ $rc -ne 0 && $rc -ne 124 ]] &&
    grep -q "^error: rank 0: no progress for [0-9]* s (--stall-timeout $STALL) during comparing the ranks' models" "$WORK/stallerr"
ok=$?  # (before the message's $(...) resets $?)
check "a rank stopped while it builds the model: the job ends (exit $rc): $(grep -m1 '^error: rank' "$WORK/stallerr")" $ok

# issue 23 item 6: a rank stopped during MPI's start-up (strace stops rank 1 at its first connect,
# MPI_Init's to the launcher; the wrapper notes rank 1's pid in its $0) holds up rank 0 in MPI_Init;
# rank 0's watchdog, started before it, ends the job after --stall-timeout with one line, never a
# hang (the hang guard fails the check)
STOP_RANK1_IN_INIT='if [[ $OMPI_COMM_WORLD_RANK == 1 ]]; then exec strace -qq -o /dev/null -e trace=connect \
    -e inject=connect:signal=SIGSTOP:when=1 bash -c "echo \$\$ >$0; exec \"\$@\"" rank1 "$@"; fi; exec "$@"'
timeout -k 10 $GUARD $MPIRUN -np 2 bash -c "$STOP_RANK1_IN_INIT" "$WORK/rank1.pid" "$BIN" -x 4 -v 0 -b 4 \
    --stall-timeout 5 >"$WORK/initout" 2>"$WORK/initerr"
rc=$?
[[ -s "$WORK/rank1.pid" ]] && kill -9 "$(cat "$WORK/rank1.pid")" 2>/dev/null  # (if strace left it stopped)
[[ $rc -ne 0 && $rc -ne 124 ]] &&
    grep -q "^error: rank 0: no progress for [0-9]* s (--stall-timeout 5) during MPI/NCCL start-up" "$WORK/initerr"
ok=$?
check "a rank stopped in MPI_Init: the job ends (exit $rc, not the hang guard's 124): $(grep -m1 '^error: rank' "$WORK/initerr")" $ok

# issue 23 item 4, on 2 ranks: a scheduler suspends every rank of a job (SIGSTOP to each, here for
# twice --stall-timeout, counted from when /proc shows both stopped) and continues them: no rank
# takes that for a stall; the job trains on, and SIGUSR1 to mpirun then stops it with exit 0
: >"$WORK/suspout" >"$WORK/susperr"  # emptied first: the poll below must not see an earlier run's lines
timeout $GUARD $MPIRUN -np 2 "$BIN" -x 99999 -v 0 -b 4 --stall-timeout 5 >"$WORK/suspout" 2>"$WORK/susperr" &
job=$!
wait_for "$WORK/suspout" "^step +2/" $job
ranks=$(ranks_of $job)
kill -STOP $ranks
for p in $ranks; do
    until [[ $(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1) == T ]] || ! kill -0 $p 2>/dev/null; do sleep 0.05; done
done
at=$(grep -cE "^step +[0-9]+/" "$WORK/suspout")
sleep 10  # the suspension itself (a longer one would test the same)
kill -CONT $ranks
wait_for "$WORK/suspout" "^step +$((at + 2))/" $job
kill -USR1 $(pgrep -P $job) 2>/dev/null
wait $job
rc=$?
n=$(stopped_after "$WORK/suspout")
[[ $rc -eq 0 && -n $n && $n -ge $((at + 2)) ]] && ! grep -q "^error" "$WORK/susperr"
ok=$?
check "both ranks stopped after step $at for 10 s, twice --stall-timeout 5, then continued: train on to step ${n:-?}, exit $rc$(grep -m1 '^error' "$WORK/susperr" | sed 's/^/; /')" $ok

# issue 23 item 10: a file-size limit too small for MPI's start-up (its shared-memory files) is
# refused before it with one error line under mpirun; a process no launcher started never
# starts MPI, so the limit does not concern it
# (env -u: no launcher's rank variable from the environment the tests run in; llmc/run/distributed.h)
(ulimit -f 4000 && timeout $GUARD env -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u PMIX_RANK -u SLURM_PROCID \
    "$BIN" -x 1 -v 0 >/dev/null 2>"$WORK/err")
rc=$?
[[ $rc -eq 0 && ! -s "$WORK/err" ]]
ok=$?
check "ulimit -f 4000 alone: the run needs no MPI, exit $rc$(head -c 300 "$WORK/err" | sed 's/^/: /')" $ok
(ulimit -f 4000 && timeout $GUARD $MPIRUN -np 2 "$BIN" -x 1 -v 0 -b 4 >/dev/null 2>"$WORK/err")
rc=$?
# (each rank checks the limit first thing; mpirun ends the job when the first rank exits, which
# may be before a rank slower to start has printed its line: at least one line, and no other error)
said=$(grep -c "^error: the file-size limit" "$WORK/err")
[[ $rc -ne 0 && $rc -ne 124 && $said -ge 1 && $(grep -c "^error:" "$WORK/err") -eq $said ]]
check "ulimit -f 4000 under mpirun -np 2: the ranks say why ($said of 2 lines before mpirun ended the job; exit $rc)" $?

# issue 23 item 10: Open MPI's mpirun turns SIGTERM into an abort (it forwards SIGTERM, SIGKILLs
# the ranks a second later and exits 1: see docs/reliability.md); SIGUSR1 to mpirun is forwarded to
# every rank, a stop request like SIGTERM: a complete checkpoint, exit 0, and it resumes
signal_job mpirun USR1 usr1
rc=$?
stopped=$(stopped_after "$WORK/usr1.out")
[[ $rc -eq 0 && -n $stopped && -e "$WORK/usr1/DONE_$(printf %08d "$stopped")" ]]
check "SIGUSR1 to mpirun: every rank stops after step ${stopped:-?} with a complete checkpoint, mpirun exits $rc" $?
end=$((${stopped:-0} + 2))
timeout $GUARD $MPIRUN -np 2 "$BIN" "${SIG[@]}" -x $end -o "$WORK/usr1" -y 1 >"$WORK/out" 2>&1 &&
    grep -q "resuming from step ${stopped:-?}" "$WORK/out" && grep -qE "^step +$end/$end " "$WORK/out"
check "... and resumes from there to step $end" $?
signal_job mpirun TERM term
rc=$?
[[ $rc -ne 0 && $rc -ne 124 ]]
check "SIGTERM to mpirun: mpirun exits $rc, as docs/reliability.md says (not the hang guard's 124)" $?

echo "test_multi_rank_cli: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
