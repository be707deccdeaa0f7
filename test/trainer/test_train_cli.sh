#!/usr/bin/env bash
# The trainer's command line: bad input gets one clear "error:" line and a
# non-zero exit (never a crash); a short run works end to end.
# Usage: test/trainer/test_train_cli.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
# TRAIN_CLI_SMALL=1 (the sanitizer build, test/run_tests.sh): the long run
# (the built-in corpus) with fewer steps and val batches.
# TRAIN_CLI_QUICK=1 (make check): the error paths of the flags, checkpoints, model
# headers, shapes and data only, up to the first longer run.
# TRAIN_CLI_BUILTIN=1 (the plain build in make test, whose other cases run in the
# sanitizer build): the built-in corpus run alone, its 100 steps.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-build/cpu/train_gpt}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0
check() {  # check NAME CONDITION-EXIT-STATUS
    if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "PASS $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi
}
# expect_error NAME PATTERN ARGS...: exit != 0, exactly one stderr line, starting "error:" and matching PATTERN
expect_error() {
    local name=$1 pattern=$2
    shift 2
    # a hang guard; SIGKILL 10 s after its SIGTERM, which a trainer blocked in a system call may never act on
    timeout -k 10 $((300 * ${TEST_TIMEOUT_SCALE:-1})) "$BIN" "$@" >"$WORK/out" 2>"$WORK/err"
    local rc=$? lines
    lines=$(wc -l <"$WORK/err")
    if [[ $rc -ne 0 && $rc -lt 128 && $lines -eq 1 ]] && grep -q "^error: .*$pattern" "$WORK/err"; then
        check "$name: $(cat "$WORK/err")" 0
    else
        check "$name (exit $rc, stderr: $(head -c 300 "$WORK/err"))" 1
    fi
}
# small shards: shard NAME NTOKENS MAXID [MAGIC VERSION]
shard() {
    python3 - "$WORK/$1" "$2" "$3" "${4:-20240520}" "${5:-1}" <<'PY'
import sys, struct
path, n, maxid, magic, version = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
header = [magic, version, n] + [0] * 253
toks = [(i * 7) % maxid for i in range(n)]
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack("<%dH" % n, *toks))
PY
}
TINY="L=1,C=32,H=2,V=256,maxT=32"

# the built-in corpus (no -i): 100 steps close most of the gap to the known floor (small: 10 steps
# and 4 val batches, some of it)
builtin_run() {
    local bsteps bgap bval gap
    read -r bsteps bgap bval <<<"$([[ ${TRAIN_CLI_SMALL:-0} == 1 ]] && echo "10 95 4" || echo "100 30 20")"
    (cd "$WORK" && "$OLDPWD/$BIN" -x $bsteps -v $bsteps -m $bval >"$WORK/builtin" 2>&1)
    check "built-in corpus run" $?
    gap=$(grep "^step $bsteps: val loss" "$WORK/builtin" | sed -E 's/.*\(([0-9.]+)% of the initial gap\).*/\1/')
    grep -q "loss floor of the val data: 1.154616" "$WORK/builtin" && [[ -n $gap ]] && awk "BEGIN{exit !($gap < $bgap)}"
    check "built-in corpus: floor 1.154616 printed; after $bsteps steps the val gap is ${gap:-?}% of the initial gap (< $bgap%)" $?
}
if [[ ${TRAIN_CLI_BUILTIN:-0} == 1 ]]; then
    builtin_run
    echo "test_train_cli: $passed passed, $failed failed"
    [[ $failed -eq 0 ]]
    exit
fi
shard good.bin 5000 256
shard small.bin 100 256
shard badtok.bin 5000 300
shard small_v.bin 5000 100

"$BIN" --help >"$WORK/help" 2>&1
check "--help exits 0" $?
grep -q -- "-d <int>" "$WORK/help" && grep -q "B x T x N x A" "$WORK/help"
check "--help names the flags and the batch equation" $?

# docs/usage.md's flag table lists exactly the flags of --help, each with the same value form
python3 - docs/usage.md "$WORK/help" <<'PY'
import re, sys
readme, help_text = open(sys.argv[1]).read(), open(sys.argv[2]).read()
table = readme.split("\n| flag | meaning | default |")[1].split("\n\n")[0]
rows = [line.split(" | ")[0] for line in table.splitlines()[2:]]
documented = {m.replace("\\|", "|") for row in rows for m in re.findall(r"`(-[^`]+)`", row)}
offered = {m.group(1).strip() for m in re.finditer(r"^  (-\S+(?: <\S+>)?)", help_text, re.M)}
if documented != offered:
    print("docs/usage.md only:", sorted(documented - offered), "--help only:", sorted(offered - documented))
    sys.exit(1)
PY
ok=$?  # (before the message's $(...) resets $?)
check "docs/usage.md's flag table has exactly the flags and value forms of --help ($(grep -c '^  -' "$WORK/help") flags)" $ok

expect_error "unknown flag" "unknown flag -Z" -Z 1
# every number whole, in range, in its type: no wrap-around, no empty value, no trailing text, no underflow
expect_error "an int flag past 32 bits" "-b 4294967297: expected an integer from 1 to 2147483647" -b 4294967297
expect_error "-x past the 8 digits of a checkpoint name" "-x 2147483648: expected an integer from -1 to 99999999" -x 2147483648
expect_error "an empty number" '-l "": expected a float from 0 to' -l ""
expect_error "an empty --grad-clip" '--grad-clip "": expected a float' --grad-clip ""
for flag in -l -c -q --grad-clip --temperature; do
    expect_error "a negative $flag" "$flag -0.5: expected a float from 0 to" $flag -0.5
done
expect_error "a float that underflows to 0" "-l 1e-50: expected a float" -l 1e-50
expect_error "a denormal float" "-c 1e-40: expected a float" -c 1e-40
expect_error "NaN" "--temperature nan: expected a float" --temperature nan
expect_error "trailing text" "-t 64k: expected an integer" -t 64k
expect_error "a leading blank" "-t  64: expected an integer" -t " 64"
expect_error "a fraction above 1" "-q 1.5: expected a float from 0 to 1" -q 1.5
expect_error "-o \"\" (would write into /)" '-o "": expected a non-empty value' -o ""
expect_error "an empty -i" '-i "": expected a non-empty value' -i ""
# -o that reads as a flag (a forgotten value) or is blank: refused, no such folder created (run in a folder of its own)
OARGS=(-e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 1 -v 0)
bin=$BIN && BIN=$(realpath "$BIN") && mkdir "$WORK/odash" && cd "$WORK/odash"
expect_error "-o -" "-o -: expected a folder's name, not one starting with '-'" "${OARGS[@]}" -o -
expect_error "-o --help" "-o --help: expected a folder's name, not one starting with '-'" "${OARGS[@]}" -o --help
expect_error '-o " "' '-o " ": expected a folder'"'"'s name, not blank' "${OARGS[@]}" -o " "
BIN=$bin && cd "$OLDPWD"
[[ -z $(ls -A "$WORK/odash") ]]
ok=$?  # (before the message's $(...) resets $?)
check "... no folder created: $(ls -A "$WORK/odash" | tr '\n' ' ')" $ok
# flags that nothing would use or that contradict -d, refused
expect_error "--doc-token without a flag that uses it" "--doc-token 5: no flag uses it" \
    -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 1 -v 0 --doc-token 5
expect_error "--ramp-tokens above -d" "--ramp-tokens 512: more than the 256 tokens per step the ramp grows to" \
    -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -d 256 --ramp-tokens 512 --ramp-steps 2 -x 1 -v 0
# --memory-plan 1 makes the checks of the flags that a run makes before its activations
plan_error() {  # plan_error NAME PATTERN ARGS...: refused by a run (-x 1) and by the plan alike
    local name=$1 pattern=$2
    shift 2
    expect_error "$name" "$pattern" -e "$TINY" -i "$WORK/good.bin" -v 0 -x 1 "$@"
    expect_error "$name, --memory-plan 1" "$pattern" -e "$TINY" --memory-plan 1 "$@"
}
plan_error "-t above maxT" "-t 64 exceeds the model's maximum sequence length 32" -b 2 -t 64
plan_error "-d not a multiple of B x T" "-d 1000 is not a multiple of B x T x N" -b 4 -t 16 -d 1000
plan_error "--doc-token beyond V" "--doc-token 999: not a token of the model's vocabulary" -b 2 -t 16 --doc-mask 1 \
    --doc-token 999
plan_error "-h 1 with -b 2" "-h 1: HellaSwag needs -b >= 4" -b 2 -t 16 -h 1
plan_error "--ramp-tokens above -d" "--ramp-tokens 512: more than the 256" -b 2 -t 16 -d 256 --ramp-tokens 512 --ramp-steps 2
expect_error "flag without a value" "needs a value" -i "$WORK/good.bin" -b
expect_error "non-numeric value" "expected an integer" -b four
expect_error "bad descriptor" "not a checkpoint file or a model descriptor" -e "L=two"
# the descriptor's KEY=VALUE list is read as train_llama3's (llmc::parse_key_values)
expect_error "a descriptor with a trailing comma" 'not a checkpoint file or a model descriptor (\"\" is not KEY=VALUE' \
    -e "$TINY,"
expect_error "a descriptor with a repeated key" "(L is given twice" -e "L=1,L=2,C=32,H=2,V=256,maxT=32"
expect_error "unknown schedule" "unknown schedule" -k stairs -i "$WORK/good.bin" -e "$TINY"

# checkpoints: wrong magic, wrong version, truncated
"$BIN" -i "$WORK/good.bin" -e "$TINY" -b 2 -t 16 -x 1 -v 0 -o "$WORK/run" >/dev/null 2>&1
check "a 1-step run writes a checkpoint" $?
CKPT="$WORK/run/model_00000001.bin"
python3 -c "
import sys; d = bytearray(open('$CKPT','rb').read())
open('$WORK/magic.bin','wb').write(b'\x00\x00\x00\x00' + d[4:])
v = bytearray(d); v[4:8] = (4).to_bytes(4, 'little'); open('$WORK/version.bin','wb').write(v)
open('$WORK/trunc.bin','wb').write(d[:len(d) - 100])
open('$WORK/short.bin','wb').write(d[:500])"
expect_error "checkpoint with a wrong magic" "not a model file (magic" -e "$WORK/magic.bin" -i "$WORK/good.bin"
expect_error "checkpoint with a wrong version" "unsupported model file version 4" -e "$WORK/version.bin" -i "$WORK/good.bin"
expect_error "truncated checkpoint" "truncated" -e "$WORK/trunc.bin" -i "$WORK/good.bin"
expect_error "checkpoint shorter than its header" "truncated model file header" -e "$WORK/short.bin" -i "$WORK/good.bin"
"$BIN" -e "$CKPT" -i "$WORK/good.bin" -b 2 -t 16 -x 1 -v 0 >/dev/null 2>&1
check "the written checkpoint loads and trains" $?

# a FIFO (or any non-regular file) as an input is refused, never waited on
mkfifo "$WORK/fifo"
expect_error "a FIFO as -i" "fifo: not a regular file" -e "$TINY" -i "$WORK/fifo" -b 2 -t 16
expect_error "a FIFO as -j" "fifo: not a regular file" -e "$TINY" -i "$WORK/good.bin" -j "$WORK/fifo" -b 2 -t 16
expect_error "a FIFO as -e" "fifo: cannot open the model file (not a regular file)" -e "$WORK/fifo" -i "$WORK/good.bin"
expect_error "a FIFO as -e with --memory-plan 1" "fifo: cannot open the model file (not a regular file)" -e "$WORK/fifo" --memory-plan 1
expect_error "a FIFO as --tokenizer" "fifo: cannot open: not a regular file" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 1 \
    -s 1 --tokenizer "$WORK/fifo"
expect_error "a FIFO as --hellaswag-file" "fifo: cannot open: not a regular file" -e "$TINY" -i "$WORK/good.bin" -t 16 -x 1 \
    -h 1 --hellaswag-file "$WORK/fifo"
"$BIN" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 1 -v 0 -o "$WORK/fifock" >/dev/null 2>&1
mv "$WORK/fifock/state_00000001_00000.bin" "$WORK/state.bin" && mkfifo "$WORK/fifock/state_00000001_00000.bin"
expect_error "a FIFO as the state file to resume from" "not a regular file" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 2 \
    -v 0 -o "$WORK/fifock" -y 1

# -o whose parent is missing or a file; the data is checked before the model is built; a path with [ ] in it
expect_error "-o in a missing folder" "-o $WORK/no/such/run: cannot create the folder: $WORK/no/such does not exist" \
    -e "$TINY" -i "$WORK/good.bin" -o "$WORK/no/such/run"
expect_error "-o inside a file" "-o $WORK/good.bin/run: cannot create the folder in $WORK/good.bin (Not a directory)" \
    -e "$TINY" -i "$WORK/good.bin" -o "$WORK/good.bin/run"
expect_error "a missing -i is found before the model is opened (here a FIFO as -e)" "missing_\*.bin: no file matches" \
    -e "$WORK/fifo" -i "$WORK/missing_*.bin"
cp "$WORK/good.bin" "$WORK/shard[1].bin"
"$BIN" -e "$TINY" -i "$WORK/shard[1].bin" -b 2 -t 16 -x 1 -v 0 >"$WORK/out" 2>&1
check "an existing shard whose name has [ ] in it is used as it is" $?

# model headers are checked field by field before anything is allocated, --memory-plan included
header() {  # header NAME maxT V L NH C Vp: an llm.c bf16 model header without a body
    python3 -c "import struct, sys; open(sys.argv[1], 'wb').write(struct.pack('<256i', 20240326, 5, *map(int, sys.argv[2:]), *[0] * 248))" \
        "$WORK/$1" "${@:2}"
}
header nh0.bin 64 256 2 0 64 256
header cneg.bin 64 256 2 4 -64 256
header deep.bin 64 256 16777216 1 1 256
header cnh.bin 64 256 2 3 64 256
header huge.bin 1024 50257 4096 128 16777216 50304
expect_error "NH=0 in a header (--memory-plan 1; was SIGFPE)" "nh0.bin: .*NH=0 is outside 1..16777216" -e "$WORK/nh0.bin" --memory-plan 1 -b 1 -t 64
expect_error "C<0 in a header (--memory-plan 1; printed absurd sizes)" "cneg.bin: .*C=-64 is outside" -e "$WORK/cneg.bin" --memory-plan 1 -b 1 -t 64
expect_error "L=16777216 in a header (--memory-plan 1; ran for hours)" "deep.bin: .*L=16777216 is outside 1..4096" \
    -e "$WORK/deep.bin" --memory-plan 1 -b 1 -t 64
expect_error "C not a multiple of NH in a header" "cnh.bin: .*C=64 is not a multiple of NH=3" -e "$WORK/cnh.bin" -i "$WORK/good.bin"
expect_error "a header of more than 2^40 parameters" "huge.bin: .*more than 2\^40 parameters" -e "$WORK/huge.bin" --memory-plan 1 -b 1 -t 64
expect_error "a descriptor with C not a multiple of H" "model: C=30 is not a multiple of NH=4" -e "L=1,C=30,H=4,V=256,maxT=32" \
    -i "$WORK/good.bin"

# shapes and batch arithmetic
expect_error "T > maxT" "-t 64 exceeds the model's maximum sequence length 32" -e "$TINY" -i "$WORK/good.bin" -t 64
expect_error "total batch not divisible" "-d 1000 is not a multiple of B x T x N = 4 x 16 x 1 = 64 tokens; try -d 960 or -d 1024" \
    -e "$TINY" -i "$WORK/good.bin" -b 4 -t 16 -d 1000
# data
expect_error "shard too small for B*T+1" "$WORK/small.bin" -e "$TINY" -i "$WORK/small.bin" -b 8 -t 32
expect_error "token id >= vocab size" "token id" -e "$TINY" -i "$WORK/badtok.bin" -b 2 -t 16
expect_error "no shard matches" "$WORK/none" -e "$TINY" -i "$WORK/none*.bin" -b 2 -t 16
shard wrongmagic.bin 5000 256 1234 1
expect_error "shard with a wrong magic" "wrongmagic.bin" -e "$TINY" -i "$WORK/wrongmagic.bin" -b 2 -t 16
# prepro runs' shards (header[248..252]: marker, run id, train shards, number; llmc/data/dataloader.h):
# run_shards PREFIX RUNID N NUMBER...
run_shards() {
    python3 - "$WORK/$1" "$2" "$3" "${@:4}" <<'PY'
import sys, struct
prefix, run, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for k in map(int, sys.argv[4:]):
    header = [20240520, 1, 500] + [0] * 245 + [0x314E5552, run & 0xFFFFFFFF, run >> 32, n, k] + [0] * 3
    with open(f"{prefix}_{'val' if k == 0 else 'train'}_{k:06d}.bin", "wb") as f:
        f.write(struct.pack("<256I", *[h & 0xFFFFFFFF for h in header]) + struct.pack("<500H", *[i % 256 for i in range(500)]))
PY
}
run_shards stale 17 3 1 2 3 && run_shards stale 18 1 1  # a later run wrote one shard over three
expect_error "-i mixing two prepro runs' shards" "stale_train_000002.bin: written by prepro run 0000000000000011, another run than .*stale_train_000001.bin" \
    -e "$TINY" -i "$WORK/stale_train_*.bin" -b 2 -t 16
expect_error "-j mixing two prepro runs' shards" "stale_train_000002.bin: written by prepro run" \
    -e "$TINY" -i "$WORK/good.bin" -j "$WORK/stale_train_*.bin" -b 2 -t 16
run_shards gap 17 3 0 1 3
expect_error "-i missing a prepro run's shard" "gap_train_\*.bin: misses train shard 2 of the 3" \
    -e "$TINY" -i "$WORK/gap_train_*.bin" -b 2 -t 16
"$BIN" -e "$TINY" -i "$WORK/gap_train_000003.bin" -j "$WORK/gap_val_*.bin" -b 2 -t 16 -x 1 -v 1 -m 1 >"$WORK/out" 2>&1
check "a prepro run's shard named alone (-i) and its val shard (-j) are used" $?

if [[ ${TRAIN_CLI_QUICK:-0} == 1 ]]; then
    echo "TRAIN_CLI_QUICK=1: the runs below skipped"
    echo "test_train_cli: $passed passed, $failed failed"
    [[ $failed -eq 0 ]]
    exit
fi

# a diverging run stops with a clear message and writes no checkpoint
expect_error "non-finite loss stops the run" "not finite" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 20 -l 1e30 \
    --grad-clip 0 -v 0 -o "$WORK/nan"
[[ ! -e "$WORK/nan/model_00000020.bin" ]]
check "no checkpoint written from a diverged run" $?

# a short run: prints the batch story, accumulates, logs
"$BIN" -e "$TINY" -i "$WORK/good.bin" -j "$WORK/good.bin" -b 2 -t 16 -d 128 -x 3 -v 3 -m 2 -o "$WORK/ok" >"$WORK/out" 2>&1
check "3 steps with A=4 run" $?
grep -q "batch: B=2 x T=16 x N=1 x A=4 = 128 tokens per step" "$WORK/out"
check "prints B, T, N, A and tokens per step" $?
[[ $(grep -c "trl:" "$WORK/ok/main.log") -eq 3 && $(grep -c "tel:" "$WORK/ok/main.log") -eq 2 ]]
check "main.log has 3 train and 2 val losses in llm.c's format" $?
[[ $(grep -c '"loss"' "$WORK/ok/main.jsonl") -eq 3 && $(grep -c '"val_loss"' "$WORK/ok/main.jsonl") -eq 2 ]] &&
    grep -qE '^step +3/3 \| loss [0-9.]+ \| norm [0-9.]+ \| lr [0-9.e+-]+ \| 128 tok/step \| util [0-9.]+% \| [0-9.]+ ms \| [0-9]+ tok/s \| MFU n/a \| ETA 0s$' "$WORK/out"
check "main.jsonl has the 3 steps and 2 evaluations; the step line has tokens per step, ms, tok/s, MFU (n/a: an unknown device), ETA" $?
if python3 -c "import matplotlib" 2>/dev/null; then
    python3 dev/plot_log.py "$WORK/ok" >/dev/null 2>&1 && [[ $(head -c 4 "$WORK/ok/main.png" | tail -c 3) == "PNG" ]]
    check "dev/plot_log.py writes a PNG of loss and throughput" $?
else
    echo "SKIP dev/plot_log.py: matplotlib is not installed for $(command -v python3)"
fi

# one document per slot on the built-in corpus (documents of mean length 64 at T = 64): some slots are padded
(cd "$WORK" && "$OLDPWD/$BIN" -x 2 -v 0 --packing slots --doc-mask 1 >"$WORK/slots" 2>&1) &&
    grep -qE '^step +2/2 \| .* \| util [0-9]{1,2}\.[0-9]% \|' "$WORK/slots"
rc=$?
check "--packing slots runs and its util is below 100%: $(grep -o 'util [0-9.]*%' "$WORK/slots" | tail -1)" $rc
expect_error "--packing with an unknown value" "--packing tight: packed or slots" --packing tight
# a shard with the built-in corpus's marker but a damaged EOT (-5) names no document token: the
# family's (GPT-2: V-1) is used, as for any other shard
python3 -c "import struct, sys; d = bytearray(open(sys.argv[1], 'rb').read())
struct.pack_into('<i', d, 16, 0x31564B4D); struct.pack_into('<i', d, 36, -5); open(sys.argv[2], 'wb').write(d)" \
    "$WORK/good.bin" "$WORK/marked.bin"
"$BIN" -e "$TINY" -i "$WORK/marked.bin" -x 1 -b 1 -t 16 -v 0 --doc-mask 1 >"$WORK/marked" 2>&1 &&
    grep -q "^documents: starting at token 255;" "$WORK/marked"
check "a shard marked as the built-in corpus with EOT -5: documents start at GPT-2's V-1 (255)" $?
# resume with slots and the document mask: the data position is a document index
SLOTS=(-v 0 --packing slots --doc-mask 1 --doc-positions 1)
(cd "$WORK" && "$OLDPWD/$BIN" -x 4 -n 2 "${SLOTS[@]}" -o "$WORK/slots_a" >/dev/null 2>&1 &&
    "$OLDPWD/$BIN" -x 2 "${SLOTS[@]}" -o "$WORK/slots_b" >/dev/null 2>&1 &&
    "$OLDPWD/$BIN" -x 4 -n 2 "${SLOTS[@]}" -o "$WORK/slots_b" -y 1 >/dev/null 2>&1) &&
    cmp -s "$WORK/slots_a/model_00000004.bin" "$WORK/slots_b/model_00000004.bin"
check "--packing slots --doc-mask 1 --doc-positions 1: 2 steps, then 2 more resumed, give bitwise the 4-step model" $?

builtin_run

# ---- a complete run: checkpoints, NaN, evaluation, sampling, ramp, memory ----
# NaN: checkpoints of earlier steps stay; with --skip-nonfinite the run goes on
expect_error "a NaN after a checkpoint stops the run" "not finite" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 6 \
    -l 1e30 --grad-clip 0 -v 0 -n 1 -o "$WORK/nan2"
[[ -e "$WORK/nan2/DONE_00000001" && ! -e "$WORK/nan2/DONE_00000002" && ! -e "$WORK/nan2/model_00000002.bin" ]] &&
    [[ $(stat -c %s "$WORK/nan2/model_00000001.bin") -gt 1024 ]] && ! ls "$WORK/nan2" | grep -q '\.tmp$'
check "the checkpoint before the NaN is complete and kept; none written after it" $?
"$BIN" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 6 -l 1e30 --grad-clip 0 -v 0 --skip-nonfinite 1 -o "$WORK/skip" \
    >"$WORK/out" 2>&1
rc=$?
[[ $rc -eq 0 ]] && grep -q "step    6/6 .* skipped: not finite" "$WORK/out"
ok=$?
check "--skip-nonfinite 1 skips the non-finite steps and finishes ($(grep -c 'skipped' "$WORK/out") skipped)" $ok
[[ -e "$WORK/skip/DONE_00000006" && -e "$WORK/skip/model_00000006.bin" ]]
check "a skipped last step still writes the final checkpoint" $?
# only a stated number in a row (10, said in --help): a run that only skips stops, without a checkpoint of it
grep -q "10 such steps in a row stop the run" "$WORK/help"
check "--help states --skip-nonfinite's limit of 10 in a row" $?
expect_error "--skip-nonfinite 1: 10 non-finite steps in a row stop the run" "not finite, 10 steps in a row; stopping" \
    -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 30 -l 1e30 --grad-clip 0 -v 0 --skip-nonfinite 1 -o "$WORK/skip10"
! ls "$WORK/skip10" | grep -qE '^(DONE_|model_|state_)'
ok=$?  # (before the message's $(...) resets $?)
check "... and writes no checkpoint of the skipped steps: $(ls "$WORK/skip10" | tr '\n' ' ')" $ok
expect_error "-y without -o" "needs the run's -o" -y 1
expect_error "-r out of range" "from 0 to 3" -r 4

# resuming with another process count or ZeRO stage is refused by name
"$BIN" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 2 -v 0 -o "$WORK/ck" >/dev/null 2>&1
python3 - "$WORK/ck" <<'PY'
import sys; sys.path.insert(0, "test"); from xxh64 import xxh64
d = sys.argv[1]; done = open(d + "/DONE_00000002").read()
written = [l.split() for l in done.splitlines() if l.startswith("file ")]
sys.exit(any(int(f[3], 16) != xxh64(open(d + "/" + f[1], "rb").read()) for f in written) or not written)
PY
check "test/xxh64.py gives the digests the trainer's DONE lists" $?
python3 -c "
import struct; p = '$WORK/ck/state_00000002_00000.bin'; d = bytearray(open(p,'rb').read())
struct.pack_into('<i', d, 4 * 11, 1); open(p, 'wb').write(d)"
python3 test/xxh64.py "$WORK/ck" 2  # a DONE that vouches for the changed state: its header check speaks
expect_error "resume from a state file of another ZeRO stage" "zero" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 4 \
    -v 0 -o "$WORK/ck" -y 1
# a model file of another step swapped in behind a DONE that vouches for it: its weights are
# not the state's master weights rounded
"$BIN" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 4 -n 2 -v 0 -o "$WORK/swap" >/dev/null 2>&1
cp "$WORK/swap/model_00000002.bin" "$WORK/swap/model_00000004.bin"
python3 test/xxh64.py "$WORK/swap" 4
expect_error "a model file of another step behind a DONE vouching for it" "weights are not the master weights of" \
    -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 6 -v 0 -o "$WORK/swap" -y 1

# ---- folder ownership: one writer per -o, a fresh run never takes over or prunes another's checkpoints
R=(-e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -v 0)
"$BIN" "${R[@]}" -x 10 -n 2 -o "$WORK/own" >/dev/null 2>&1
expect_error "a fresh run (-y 0, another seed) in a folder with another run's checkpoints" \
    "holds checkpoint files (steps 2..10) of an earlier run; resume it with -y 1" "${R[@]}" -x 6 -n 2 -nk 2 --seed 7 -o "$WORK/own"
[[ $(ls "$WORK/own" | grep -c '^DONE_') -eq 5 ]]
check "the refused run deleted none of them (5 DONE kept)" $?
expect_error "-x below the step it would resume from" "-x 6: the run resumed from step 10 is already past it" \
    "${R[@]}" -x 6 -o "$WORK/own" -y 1
expect_error "-y 1 with a -e of another shape than the checkpoint's: refused, naming both" \
    "-e L=2,C=32,H=2,V=256,maxT=32: not the model of the checkpoint of step 10 in $WORK/own (L=1 C=32 NH=2 " \
    -e "L=2,C=32,H=2,V=256,maxT=32" -i "$WORK/good.bin" -b 2 -t 16 -v 0 -x 12 -o "$WORK/own" -y 1
grep -q "^run [0-9a-f]\{16\}$" "$WORK/own/DONE_00000010" &&
    grep -qE "^file model_00000010.bin [0-9]+ [0-9a-f]{16}$" "$WORK/own/DONE_00000010" &&
    grep -qE "^file state_00000010_00000.bin [0-9]+ [0-9a-f]{16}$" "$WORK/own/DONE_00000010"
check "DONE names the run and each file's size and xxh64" $?
# a second trainer while the first runs (real processes; the first is stopped by progress, not by time)
: >"$WORK/first"  # emptied first: the poll below must not see an earlier run's lines
"$BIN" "${R[@]}" -x 99999 -n 1 -o "$WORK/busy" >"$WORK/first" 2>&1 &
first=$!
until grep -q "^checkpoint: step 1 " "$WORK/first" || ! kill -0 $first 2>/dev/null; do sleep 0.05; done
expect_error "a second trainer on a folder in use (-y 1)" "another trainer is writing into this folder (pid $first" \
    "${R[@]}" -x 99999 -o "$WORK/busy" -y 1
expect_error "a second trainer on a folder in use (-y 0)" "pid $first" "${R[@]}" -x 3 -o "$WORK/busy"
kill -9 $first
wait $first 2>/dev/null
last=$(ls "$WORK/busy" | grep -E '^DONE_[0-9]+$' | tail -n 1 | sed 's/^DONE_0*//')
"$BIN" "${R[@]}" -x $((last + 1)) -o "$WORK/busy" -y 1 >"$WORK/out" 2>&1 && grep -q "resuming from step $last " "$WORK/out"
check "once the first is gone (SIGKILL) its lock goes with it: -y 1 resumes" $?
# two fresh trainers started at once on one new folder: exactly one runs, the other names the holder
"$BIN" "${R[@]}" -x 3 -o "$WORK/race" >"$WORK/race1" 2>&1 & p1=$!
"$BIN" "${R[@]}" -x 3 -o "$WORK/race" >"$WORK/race2" 2>&1 & p2=$!
wait $p1; r1=$?
wait $p2; r2=$?
[[ $((r1 == 0)) -ne $((r2 == 0)) && -e "$WORK/race/DONE_00000003" ]] &&
    cat "$WORK/race1" "$WORK/race2" | grep -qE "^error: .*(another trainer is writing into this folder|holds checkpoint files)"
check "two trainers started together on one folder: one finishes (exits $r1, $r2), the other is refused" $?
# a run deletes only what a DONE or WRITING of its run vouches for: model and state files without
# them (a user's copies) are kept, with -nk or without
cp "$WORK/own/model_00000010.bin" "$WORK/own/model_00000003.bin"
cp "$WORK/own/state_00000010_00000.bin" "$WORK/own/state_00000003_00000.bin"
"$BIN" "${R[@]}" -x 12 -n 2 -o "$WORK/own" -y 1 >/dev/null 2>&1
[[ -e "$WORK/own/model_00000003.bin" && -e "$WORK/own/state_00000003_00000.bin" && -e "$WORK/own/DONE_00000012" ]]
check "a model/state pair without DONE older than the newest DONE is kept (no DONE of the run lists it)" $?
rm "$WORK/own/model_00000003.bin" "$WORK/own/state_00000003_00000.bin"
# the user's files at checkpoint names: kept, or, where the run must write, one error naming them
"$BIN" "${R[@]}" -x 2 -n 1 -nk 1 -o "$WORK/usr" >/dev/null 2>&1
mkdir "$WORK/usr/model_00000000" "$WORK/usr/model_00000002" && echo mine >"$WORK/usr/model_00000000/notes.txt" &&
    echo mine >"$WORK/usr/model_00000002/notes.txt" && echo mine >"$WORK/usr/model_00000003.tmp"
"$BIN" "${R[@]}" -x 3 -n 1 -nk 1 -o "$WORK/usr" -y 1 >/dev/null 2>&1 && [[ ! -e "$WORK/usr/DONE_00000002" &&
    $(cat "$WORK/usr/model_00000000/notes.txt" "$WORK/usr/model_00000002/notes.txt" "$WORK/usr/model_00000003.tmp") == \
    "mine"$'\n'"mine"$'\n'"mine" ]]
check "-nk 1 prunes step 2 and keeps the user's model_00000000/notes.txt, model_00000002/notes.txt, model_00000003.tmp" $?
echo mine >"$WORK/usr/model_00000004.bin"
expect_error "a user's model_00000004.bin newer than the newest DONE, where the run writes step 4" \
    "/model_00000004.bin is not a file this run wrote; remove or move it (nothing was deleted)" \
    "${R[@]}" -x 4 -n 1 -nk 1 -o "$WORK/usr" -y 1
[[ $(cat "$WORK/usr/model_00000004.bin") == mine && -e "$WORK/usr/DONE_00000003" ]] && ! grep -q "^step " "$WORK/out"
check "the user's model_00000004.bin is unchanged, checkpoint 3 kept; refused at start-up, before any step" $?
mv "$WORK/usr/model_00000004.bin" "$WORK/usr/state_00000004_00000.bin.tmp"
expect_error "a user's file named as the temporary of step 4's state" \
    "state_00000004_00000.bin.tmp is not a file this run wrote" "${R[@]}" -x 4 -n 1 -nk 1 -o "$WORK/usr" -y 1
[[ $(cat "$WORK/usr/state_00000004_00000.bin.tmp") == mine ]]
check "the user's state_00000004_00000.bin.tmp is unchanged" $?
# what is in the way of any checkpoint the run will write is found at start-up, not when the run
# reaches that step after training for nothing
rm "$WORK/usr/state_00000004_00000.bin.tmp"
echo mine >"$WORK/usr/state_00000006_00000.bin"
expect_error "a user's state_00000006_00000.bin, where the run (-n 2) writes three steps after resuming" \
    "/state_00000006_00000.bin is not a file this run wrote" "${R[@]}" -x 8 -n 2 -o "$WORK/usr" -y 1
! grep -q "^step " "$WORK/out" && [[ $(cat "$WORK/usr/state_00000006_00000.bin") == mine ]]
check "... refused before any step, the file unchanged" $?
rm "$WORK/usr/state_00000006_00000.bin"

# checksums: a damaged newest checkpoint is skipped with a warning, the run resumes from the one before
python3 -c "
p = '$WORK/own/model_00000012.bin'; d = bytearray(open(p, 'rb').read()); d[2000] ^= 1; open(p, 'wb').write(d)"
"$BIN" "${R[@]}" -x 14 -n 2 -o "$WORK/own" -y 1 >"$WORK/out" 2>"$WORK/err"
rc=$?
[[ $rc -eq 0 ]] && grep -q "resuming from step 10" "$WORK/out" &&
    grep -q "^warning: checkpoint 12 not used: .*model_00000012.bin: checksum differs" "$WORK/err"
ok=$?
check "a bit flipped in the newest model file: warning, fallback to step 10: $(head -1 "$WORK/err")" $ok
python3 -c "
p = '$WORK/own/state_00000014_00000.bin'; d = bytearray(open(p, 'rb').read()); open(p, 'wb').write(d[:-4])"
python3 -c "
p = '$WORK/own/state_00000012_00000.bin'; d = bytearray(open(p, 'rb').read()); d[-30] ^= 4; open(p, 'wb').write(d)"
"$BIN" "${R[@]}" -x 16 -n 2 -o "$WORK/own" -y 1 >"$WORK/out" 2>"$WORK/err"
[[ $? -eq 0 ]] && grep -q "resuming from step 10" "$WORK/out" && [[ $(grep -c "^warning: checkpoint" "$WORK/err") -eq 2 ]]
check "a truncated state at 14 and a flipped bit in the state at 12: two warnings, resumed from 10" $?
rm -f "$WORK"/own/DONE_*
printf 'gpt-trainer checkpoint 1\nrun 0123456789abcdef\nfile model_00000016.bin 12 0000000000000000\n' >"$WORK/own/DONE_00000016"
expect_error "every complete checkpoint damaged: stop, never start over" "no complete checkpoint in .* passes its checks" \
    "${R[@]}" -x 18 -o "$WORK/own" -y 1

# ---- nothing saved is lost: a DONE proves every file it needs, pruning counts only proven
# checkpoints, no symbolic link in -o is followed, the lock outlives its name, log records wait
flip() { python3 -c "
import sys; p = sys.argv[1]; d = bytearray(open(p, 'rb').read()); d[int(sys.argv[2])] ^= 1; open(p, 'wb').write(d)" "$@"; }
dones() { ls "$1" | grep '^DONE_' | tr '\n' ' '; }
"$BIN" "${R[@]}" -x 4 -n 2 -o "$WORK/fb" >/dev/null 2>&1
flip "$WORK/fb/model_00000004.bin" 2000
"$BIN" "${R[@]}" -x 3 -n 1 -nk 1 -o "$WORK/fb" -y 1 >"$WORK/out" 2>&1
rc=$?
kept=$(dones "$WORK/fb")
"$BIN" "${R[@]}" -x 5 -n 1 -nk 1 -o "$WORK/fb" -y 1 >"$WORK/out2" 2>&1 && grep -q "resuming from step 3 " "$WORK/out2" &&
    [[ $rc -eq 0 && $kept == "DONE_00000003 DONE_00000004 " && $(dones "$WORK/fb") == "DONE_00000005 " ]]
check "-nk 1 after falling back past a damaged checkpoint 4: the new 3 is kept (left: $kept) and resumes; 4 goes once rewritten" $?
"$BIN" "${R[@]}" -x 4 -n 2 -o "$WORK/dn" >/dev/null 2>&1
flip "$WORK/dn/state_00000004_00000.bin" 3000  # a damage that only a checked DONE would notice
for variant in "no file lines" "copied from step 2" "empty (llm.c's)"; do
    rm -rf "$WORK/dv" && cp -r "$WORK/dn" "$WORK/dv" && rm "$WORK/dv/train.lock"
    case $variant in
        "no file lines") head -n 2 "$WORK/dn/DONE_00000004" >"$WORK/dv/DONE_00000004"; why="lists no file" ;;
        "copied from step 2") cp "$WORK/dn/DONE_00000002" "$WORK/dv/DONE_00000004"; why="does not list model_00000004.bin" ;;
        *) : >"$WORK/dv/DONE_00000004"; why="is empty (llm.c's marker)" ;;
    esac
    "$BIN" "${R[@]}" -x 5 -o "$WORK/dv" -y 1 >"$WORK/out" 2>"$WORK/err"
    [[ $? -eq 0 ]] && grep -q "resuming from step 2 " "$WORK/out" &&
        grep -q "^warning: checkpoint 4 not used: DONE_00000004 $why" "$WORK/err"
    ok=$?  # (before the message's $(...) resets $?)
    check "a DONE $variant vouches for nothing: step 4 (a flipped state) not used, resumed from 2: $(head -c 150 "$WORK/err")" $ok
done
rm -rf "$WORK/dv" && cp -r "$WORK/dn" "$WORK/dv" && rm "$WORK/dv/train.lock"
printf 'gpt\033[2J\rtrainer\nrun 0123456789abcdef\n' >"$WORK/dv/DONE_00000004"
"$BIN" "${R[@]}" -x 5 -o "$WORK/dv" -y 1 >"$WORK/out" 2>"$WORK/err"
[[ $? -eq 0 && $(wc -l <"$WORK/err") -eq 1 ]] && grep -qF 'not a DONE marker of this trainer ("gpt\x1b[2J\x0dtrainer")' "$WORK/err"
ok=$?  # (before the message's $(...) resets $?)
check "a DONE whose first line holds control bytes: the one warning line quotes them ($(head -c 150 "$WORK/err" | cat -v))" $ok
echo precious >"$WORK/victim"
mkdir "$WORK/sl1" && ln -s "$WORK/victim" "$WORK/sl1/train.lock"
expect_error "a symbolic link as train.lock" "train.lock: cannot create the lock file (a symbolic link, not followed)" \
    "${R[@]}" -x 1 -o "$WORK/sl1"
mkdir "$WORK/sl2"
for f in model_00000001.bin.tmp state_00000001_00000.bin.tmp DONE_00000001.tmp; do ln -s "$WORK/victim" "$WORK/sl2/$f"; done
expect_error "symbolic links planted as the checkpoint's .tmp files: not the run's" \
    "DONE_00000001.tmp is not a file this run wrote" "${R[@]}" -x 1 -o "$WORK/sl2"
[[ $(find "$WORK/sl2" -type l | wc -l) -eq 3 ]]
check "the links are kept, not written through" $?
rm "$WORK"/sl2/*.tmp
"$BIN" "${R[@]}" -x 1 -o "$WORK/sl2" -y 1 >/dev/null 2>&1 && "$BIN" "${R[@]}" -x 2 -o "$WORK/sl2" -y 1 2>&1 |
    grep -q "resuming from step 1 " && [[ -f "$WORK/sl2/DONE_00000001" && ! -L "$WORK/sl2/DONE_00000001" ]]
check "without them the checkpoint is written and resumes" $?
for log in main.jsonl main.log; do
    mkdir "$WORK/sl_$log" && ln -s "$WORK/victim" "$WORK/sl_$log/$log"
    expect_error "a symbolic link as a fresh run's $log" "sl_$log/$log: a symbolic link, not followed" \
        "${R[@]}" -x 1 -o "$WORK/sl_$log"
    [[ $(cat "$WORK/victim") == precious ]]
    ok=$?
    check "no link target was written: $(head -c 40 "$WORK/victim")" $ok
done
# a FIFO as a log: refused at once, never waited on (nothing here opens its other side, so an open
# that waited would hang until the guard); the FIFO is left as it was
for log in main.jsonl main.log; do
    mkdir "$WORK/fifo_$log" && mkfifo "$WORK/fifo_$log/$log"
    expect_error "a FIFO as a fresh run's $log" "fifo_$log/$log: not a regular file" "${R[@]}" -x 1 -o "$WORK/fifo_$log"
    [[ -p "$WORK/fifo_$log/$log" ]]
    check "... the FIFO $log is left in place" $?
done
echo mine >"$WORK/sl2/notes.tmp"
"$BIN" "${R[@]}" -x 3 -o "$WORK/sl2" -y 1 >/dev/null 2>&1 && [[ $(cat "$WORK/sl2/notes.tmp") == mine ]]
check "-y 1 removes only its own stale temporaries: the user's notes.tmp stays" $?
# train.lock removed while the run holds the folder: a second trainer is still refused
: >"$WORK/first"  # emptied first: the poll below must not see an earlier run's lines
"$BIN" "${R[@]}" -x 99999 -n 1 -o "$WORK/busy2" >"$WORK/first" 2>&1 &
first=$!
until grep -q "^checkpoint: step 1 " "$WORK/first" || ! kill -0 $first 2>/dev/null; do sleep 0.05; done
rm -f "$WORK/busy2/train.lock"
expect_error "a second trainer after train.lock was removed" "another trainer is writing into this folder" \
    "${R[@]}" -x 99999 -o "$WORK/busy2" -y 1
n=$(grep -c "^checkpoint: step" "$WORK/first")
until [[ $(grep -c "^checkpoint: step" "$WORK/first") -gt $((n + 1)) ]] || ! kill -0 $first 2>/dev/null; do sleep 0.05; done
[[ $(cat "$WORK/busy2/train.lock" 2>/dev/null) == "$first" ]]
check "the holder writes train.lock again at its next checkpoint (pid $first)" $?
kill -9 $first
wait $first 2>/dev/null
# a full disk under main.jsonl (writes 3 to 6 fail, strace injects ENOSPC): the records wait and
# are written in order once the disk has room; still full at the end: an error, exit 1
if command -v strace >/dev/null; then
    full() {  # full DIR WHEN: a 12-step run whose main.jsonl writes number WHEN fail
        mkdir -p "$1" && : >"$1/main.jsonl"
        strace -f -qq -o /dev/null -P "$(cd "$1" && pwd)/main.jsonl" -e trace=write -e inject=write:error=ENOSPC:when="$2" \
            "$BIN" -e "$TINY" -i "$WORK/good.bin" -j "$WORK/good.bin" -b 2 -t 16 -x 12 -v 4 -o "$1" >"$WORK/out" 2>"$WORK/err"
    }
    full "$WORK/full1" 3..6
    rc=$?
    python3 - "$WORK/full1/main.jsonl" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]  # every line whole
train = [r["step"] for r in records if "loss" in r]
sys.exit(train != list(range(1, 13)) or len(records) != 16)
PY
    ok=$?
    [[ $rc -eq 0 && $ok -eq 0 && $(wc -l <"$WORK/err") -eq 1 ]] &&
        grep -q "^warning: .*main.jsonl: cannot write (No space left on device)" "$WORK/err"
    ok=$?
    check "a disk full for 4 log writes: one warning, all 16 records written whole and in order: $(cat "$WORK/err")" $ok
    full "$WORK/full2" 3+
    rc=$?
    [[ $rc -eq 1 ]] && tail -n 1 "$WORK/err" | grep -q "^error: .*main.jsonl: 14 record(s) could not be written"
    ok=$?
    check "a disk still full at the end: exit $rc, $(tail -n 1 "$WORK/err")" $ok
else
    check "strace is installed (dev/install_deps.sh installs it)" 1
fi

# signals: SIGTERM stops after the current step with a checkpoint and exit 0; a second signal
# ends the run at once; a file-size limit (SIGXFSZ) is one error line, earlier checkpoints kept
: >"$WORK/sig1"  # emptied first: the poll below must not see an earlier run's lines
"$BIN" "${R[@]}" -x 99999 -o "$WORK/sigterm" >"$WORK/sig1" 2>&1 &
pid=$!
until grep -qE "^step +2/" "$WORK/sig1" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
kill -TERM $pid
wait $pid
rc=$?
n=$(grep -o "stopped by a signal after step [0-9]*" "$WORK/sig1" | grep -o "[0-9]*$")
[[ $rc -eq 0 && -n $n && -e "$WORK/sigterm/DONE_$(printf %08d "$n")" ]] && grep -q "resume with -y 1" "$WORK/sig1"
check "SIGTERM: stops after step ${n:-?} with its checkpoint, exit $rc" $?
: >"$WORK/sig2"  # emptied first: the poll below must not see an earlier run's lines
"$BIN" "${R[@]}" -x 99999 -o "$WORK/sigtwice" >"$WORK/sig2" 2>&1 &
pid=$!
until grep -qE "^step +2/" "$WORK/sig2" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
kill -STOP $pid && kill -TERM $pid && kill -INT $pid && kill -CONT $pid  # both pending, then delivered together
wait $pid
rc=$?
[[ $rc -gt 128 ]] && ! grep -q "stopped by a signal" "$WORK/sig2"
check "a second signal ends the run at once (exit $rc, by the signal)" $?
# issue 23 item 4: a run suspended (SIGSTOP, as Ctrl-Z or a scheduler's suspend) for twice its
# --stall-timeout is not stalled: continued, it trains on, and SIGTERM then stops it cleanly. The
# stop is sent after a step line and counted from when /proc shows the process stopped; a slow
# machine only makes the steps around it slower, each still far below the timeout.
: >"$WORK/susp" >"$WORK/susperr"  # emptied first: the poll below must not see an earlier run's lines
"$BIN" "${R[@]}" -x 99999 --stall-timeout 5 >"$WORK/susp" 2>"$WORK/susperr" &
pid=$!
until grep -qE "^step +2/" "$WORK/susp" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
kill -STOP $pid
until [[ $(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -c1) == T ]] || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
at=$(grep -cE "^step +[0-9]+/" "$WORK/susp")
sleep 10  # the suspension itself (a longer one would test the same)
kill -CONT $pid
until grep -qE "^step +$((at + 2))/" "$WORK/susp" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
kill -TERM $pid 2>/dev/null
wait $pid
rc=$?
n=$(grep -o "stopped by a signal after step [0-9]*" "$WORK/susp" | grep -o "[0-9]*$")
[[ $rc -eq 0 && -n $n && $n -ge $((at + 2)) && ! -s "$WORK/susperr" ]] &&
    [[ $(grep -cE "^step +[0-9]+/" "$WORK/susp") -eq $n ]]
ok=$?
check "stopped after step $at for 10 s, twice --stall-timeout 5, then continued: trains on to step ${n:-?}, SIGTERM ends it with exit $rc$(head -c 200 "$WORK/susperr" | sed 's/^/; /')" $ok
# (the limit is set on the running trainer, after MPI's start-up, which a limit would break)
: >"$WORK/out" >"$WORK/err"  # emptied first: the poll below must not see an earlier run's lines
"$BIN" "${R[@]}" -x 99999 -n 1 -o "$WORK/fsz" >"$WORK/out" 2>"$WORK/err" &
pid=$!
until grep -qE "^step +3/" "$WORK/out" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
prlimit --pid $pid --fsize=100000
wait $pid
rc=$?
[[ $rc -eq 1 && $(wc -l <"$WORK/err") -eq 1 ]] && grep -q "^error: .*File too large" "$WORK/err" &&
    ! ls "$WORK/fsz" | grep -q '\.tmp$' && last=$(ls "$WORK/fsz" | grep -E '^DONE_[0-9]+$' | tail -n 1 | sed 's/^DONE_0*//') &&
    "$BIN" "${R[@]}" -x $((last + 1)) -o "$WORK/fsz" -y 1 2>&1 | grep -q "resuming from step $last "
ok=$?
check "a file-size limit: one error line, exit $rc (not SIGXFSZ), no .tmp, the last complete checkpoint (${last:-?}) resumes: $(cat "$WORK/err")" $ok

# sampling: the same seed gives the same text, another seed another
sample() { "$BIN" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 1 -v 0 -s 1 -g 12 --seed "$1" --top-k "$2" 2>/dev/null | grep "sample:"; }
s1=$(sample 5 0) s2=$(sample 5 0) s3=$(sample 6 0) s4=$(sample 5 1)
[[ -n $s1 && "$s1" == "$s2" && "$s1" != "$s3" && -n $s4 ]]
check "sampling is deterministic for a seed and changes with it: $s1" $?

# a tokenizer smaller than the model's vocabulary: refused before training, one error line (was an abort at the first sample)
python3 - "$WORK/tok300.bin" <<'PY'
import struct, sys
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240328, 2, 300, 299, *[0] * 252))
    for i in range(300):
        f.write(bytes([1, i]) if i < 256 else bytes([2, 97, i - 200]))
PY
expect_error "--tokenizer with fewer tokens than the model" "tok300.bin: 300 tokens, fewer than the model's vocabulary of 512" \
    -e "L=1,C=32,H=2,V=512,maxT=64" -x 2 -v 0 -s 1 --tokenizer "$WORK/tok300.bin"

# batch ramp: A grows from the start tokens to -d, lr scaled by sqrt (B x T = 32 tokens)
"$BIN" -e "$TINY" -i "$WORK/good.bin" -t 16 -x 6 -v 0 -b 2 -d 256 --ramp-tokens 64 --ramp-steps 4 --ramp-lr sqrt -l 1e-3 -u 0 \
    -k constant >"$WORK/out" 2>&1
tokens=$(grep -E '^step +[0-9]+/6' "$WORK/out" | sed -E 's/.* ([0-9]+) tok\/step.*/\1/' | tr '\n' ' ')
lrs=$(grep -E '^step +[0-9]+/6' "$WORK/out" | sed -E 's/.*lr ([0-9.e+-]+) .*/\1/' | tr '\n' ' ')
[[ "$tokens" == "64 128 160 224 256 256 " && "$lrs" == "5.00e-04 7.07e-04 7.91e-04 9.35e-04 1.00e-03 1.00e-03 " ]]
check "batch ramp 64 -> 256 tokens over 4 steps (got: $tokens), lr x sqrt(tokens/target) (got: $lrs)" $?
expect_error "unknown ramp lr rule" "none, linear or sqrt" --ramp-lr cubic

# HellaSwag (-h 1) from a small eval file in llm.c's format: the accuracy at
# each evaluation, the same in two runs
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
    rec = [65535, 2 * (len(body) + 2)] + body
    examples.append(rec)
header = [20240522, 1, len(examples), max(2 * len(r) for r in examples)] + [0] * 252
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *header))
    for r in examples:
        f.write(struct.pack("<%dH" % len(r), *r))
PY
hs() {
    "$BIN" -e "L=1,C=32,H=2,V=256,maxT=64" -i "$WORK/good.bin" -j "$WORK/good.bin" -b 4 -t 64 -x 2 -v 2 -m 1 -h 1 \
        --hellaswag-file "$WORK/hs.bin" 2>&1 | grep "HellaSwag accuracy"
}
h1=$(hs) h2=$(hs)
[[ $(echo "$h1" | wc -l) -eq 2 && "$h1" == "$h2" ]] && echo "$h1" | grep -q "(10 of 10 examples fit T=64)"
ok=$?
check "-h 1: HellaSwag accuracy at steps 0 and 2, the same in two runs: $(echo $h1 | tr '\n' ' ')" $ok
expect_error "-h 1 with a token id beyond the model's vocabulary" "hs.bin" -e "L=1,C=32,H=2,V=100,maxT=64" -i "$WORK/small_v.bin" -t 16 -x 1 -h 1 \
    --hellaswag-file "$WORK/hs.bin"

# the memory plan, printed without running
"$BIN" -e d12 -b 8 -t 1024 --memory-plan 1 >"$WORK/plan" 2>&1
grep -q "memory plan per rank (B=8, T=1024" "$WORK/plan" && grep -q "fp32 gradients" "$WORK/plan" &&
    grep -q "activations (B x T x C x L)" "$WORK/plan" && grep -q "^  total" "$WORK/plan"
ok=$?
check "--memory-plan 1 prints the plan of d12 and exits: $(grep '^  total' "$WORK/plan" | tr -s ' ')" $ok
"$BIN" -e d12 -b 8 -t 1024 -r 2 --memory-plan 1 >"$WORK/plan2" 2>&1
a0=$(grep "activations" "$WORK/plan" | awk '{print $(NF-1)}') a2=$(grep "activations" "$WORK/plan2" | awk '{print $(NF-1)}')
awk "BEGIN{exit !($a2 < $a0)}"
check "-r 2 plans fewer activation bytes ($a2 MiB < $a0 MiB)" $?
"$BIN" -e d12 -b 8 -t 1024 -r 3 --memory-plan 1 >"$WORK/plan3" 2>&1
a3=$(grep "activations" "$WORK/plan3" | awk '{print $(NF-1)}')
awk "BEGIN{exit !($a3 < $a2)}"
check "-r 3 plans fewer activation bytes than -r 2 ($a3 MiB < $a2 MiB)" $?

# -b auto on a small virtual device: the largest B that fits (a divisor of
# the 32 sequences of -d), then A for -d; twice that B must not fit
AUTO=(-e "L=1,C=32,H=2,V=256,maxT=128" -t 128 -d 4096 -x 1 -v 0) auto_mb=40 auto_t=128 auto_d=4096
CPUCUDA_DEVICE_MEMORY_MB=$auto_mb "$BIN" "${AUTO[@]}" -b auto >"$WORK/auto" 2>&1
rc=$?
batch=$(grep "^batch:" "$WORK/auto")
b=$(echo "$batch" | sed -E 's/batch: B=([0-9]+) .*/\1/')
CPUCUDA_DEVICE_MEMORY_MB=$auto_mb "$BIN" "${AUTO[@]}" -b $((2 * b)) >"$WORK/auto2" 2>&1
rc2=$?
[[ $rc -eq 0 && $b -ge 1 && $rc2 -ne 0 ]] && grep -q "^error: out of device memory" "$WORK/auto2" &&
    [[ $batch == "batch: B=$b x T=$auto_t x N=1 x A=$((auto_d / auto_t / b)) = $auto_d tokens per step" ]]
ok=$?
check "-b auto on $auto_mb MiB: $batch; B=$((2 * b)) runs out of memory" $ok
# -b auto on an H200's 141 GB (reported by the CPU runtime): B at most what the val data
# holds (small.bin: 6 sequences of T=16), with a note, and it trains; -v 0 reads no val
# data, so a val set too small for B is no obstacle then, and an error naming both otherwise
CPUCUDA_DEVICE_MEMORY_MB=134400 "$BIN" -e "$TINY" -i "$WORK/good.bin" -j "$WORK/small.bin" -t 16 -b auto -x 1 -m 1 \
    >"$WORK/auto141" 2>&1
rc=$?
[[ $rc -eq 0 ]] && grep -q "^-b auto: B at most 6: the val data .* holds 6 sequences of T=16" "$WORK/auto141" &&
    grep -q "^batch: B=6 x T=16 x N=1 x A=1 = 96 tokens per step" "$WORK/auto141" &&
    grep -qE "^step +1/1 " "$WORK/auto141" && grep -q "^step 1: val loss" "$WORK/auto141"
ok=$?  # (before the message's $(...) resets $?)
check "-b auto on 141 GB trains with the B its val data holds (exit $rc): $(grep -E '^(batch|error)' "$WORK/auto141")" $ok
# and on the built-in corpus (no -i) with -v 0: no val data read, B at most the 16 sequences of -d
(cd "$WORK" && CPUCUDA_DEVICE_MEMORY_MB=134400 "$OLDPWD/$BIN" -e "L=1,C=32,H=2,V=256,maxT=64" -b auto -d 1024 -v 0 -x 1 \
    >"$WORK/auto141b" 2>&1)
rc=$?
[[ $rc -eq 0 ]] && grep -q "^batch: B=16 x T=64 x N=1 x A=1 = 1024 tokens per step" "$WORK/auto141b" &&
    grep -qE "^step +1/1 " "$WORK/auto141b"
ok=$?  # (before the message's $(...) resets $?)
check "-b auto on 141 GB trains the built-in corpus with -v 0, B from -d (exit $rc): $(grep -E '^(batch|error)' "$WORK/auto141b")" $ok
"$BIN" -e "$TINY" -i "$WORK/good.bin" -j "$WORK/small.bin" -b 8 -t 16 -x 1 -v 0 >/dev/null 2>&1
check "-v 0 opens no val loader: a val set of 6 sequences does not stop B=8" $?
expect_error "a val set too small for B names both numbers" "small.bin: too few tokens: 100 in 1 shard(s), need at least B\*T+1 = 129 (B=8" \
    -e "$TINY" -i "$WORK/good.bin" -j "$WORK/small.bin" -b 8 -t 16 -x 1 -v 1

# issue 23 item 10: flags that would be ignored or misread are refused, -d's suggestion does not overflow,
# a step without a counted target is not taken, a descriptor is not shadowed by a path, a weight that
# bf16 cannot hold is refused at load time, and dev/fuzz_cli.py fuzzes the flags of --help
Q=(-e "$TINY" -i "$WORK/good.bin" -t 16 -x 1 -v 0)
expect_error "-x 0 (was a whole epoch; one epoch is -1)" "-x 0: give the number of optimizer steps (-x -1 is one epoch" \
    -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -v 0 -x 0
expect_error "-n without -o (did nothing)" "-n: checkpoints need -o" "${Q[@]}" -n 1
expect_error "-nk without -o (did nothing)" "-nk: checkpoints need -o" "${Q[@]}" -nk 2
expect_error "a flag given twice (the last value won)" "flag -b given twice" "${Q[@]}" -b 2 -b 3
expect_error "--ramp-tokens without --ramp-steps (no ramp)" "--ramp-tokens 32: a batch ramp needs --ramp-steps too" \
    "${Q[@]}" --ramp-tokens 32
expect_error "--ramp-steps without --ramp-tokens (no ramp)" "--ramp-steps 3: a batch ramp needs --ramp-tokens too" \
    "${Q[@]}" --ramp-steps 3
expect_error "--ramp-lr without a ramp" "--ramp-lr sqrt: there is no batch ramp" "${Q[@]}" --ramp-lr sqrt
# (UBSan halts the sanitizer build at a signed overflow in this suggestion)
expect_error "-d 2^63-1: the suggestion stops below a long's top (was -d -9223372036854775808)" \
    "-d 9223372036854775807 is not a multiple of B x T x N = 4 x 16 x 1 = 64 tokens; try -d 9223372036854775744\$" \
    "${Q[@]}" -b 4 -d 9223372036854775807
expect_error "-d of more micro-batches than an int holds (was out of memory)" \
    "-d 9223372036854775744: 144115188075855871 micro-batches of B x T x N = 64 tokens per step, more than 2147483647" \
    "${Q[@]}" -b 4 -d 9223372036854775744

# --packing slots, B=1: step 2's sequence is the shard's last document, its end-of-text token alone,
# with no target: no loss to log, and AdamW (momentum) would still move every weight
python3 - "$WORK/lastdoc.bin" <<'PY'
import struct, sys
n = 40
tokens = [(i * 7) % 255 for i in range(n - 1)] + [255]  # document 0: 39 tokens; document 1: token 255 alone
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *[0] * 253))
    f.write(struct.pack("<%dH" % n, *tokens))
PY
"$BIN" -e "$TINY" -i "$WORK/lastdoc.bin" --packing slots -b 1 -t 16 -x 2 -n 1 -v 0 -l 1e-2 -o "$WORK/notarget" \
    >"$WORK/out" 2>&1
rc=$?
adam=$(python3 -c "
import struct, sys
d = open(sys.argv[1], 'rb').read(); extra = struct.unpack_from('<i', d, 16 * 4)[0]
print(struct.unpack_from('<i', d, len(d) - extra + 4)[0])  # ResumeInfo.adam_step" "$WORK/notarget/state_00000002_00000.bin")
[[ $rc -eq 0 ]] && grep -qE '^step +1/2 \| loss [0-9.]+ ' "$WORK/out" &&
    grep -qE '^step +2/2 \| skipped: no counted target' "$WORK/out" && ! grep -qE '^step +2/2 \| loss' "$WORK/out" &&
    cmp -s "$WORK/notarget/model_00000001.bin" "$WORK/notarget/model_00000002.bin" && [[ $adam == 1 ]]
check "a step with every target masked is skipped: said so, no loss 0 logged, weights unchanged, AdamW step $adam (1)" $?

# a descriptor stays one whatever the folder holds (an earlier -o d12); a file named d12 is ./d12
mkdir -p "$WORK/shadow/d12" "$WORK/shadow/$TINY" "$WORK/named"
"$BIN" -e d12 --memory-plan 1 -b 1 -t 64 >"$WORK/plan_ref" 2>&1
(cd "$WORK/shadow" && "$OLDPWD/$BIN" -e d12 --memory-plan 1 -b 1 -t 64 >"$WORK/plan_shadow" 2>&1) &&
    cmp -s "$WORK/plan_ref" "$WORK/plan_shadow"
ok=$?
check "-e d12 beside a folder named d12 (--memory-plan 1): the plan of d12 ($(tail -1 "$WORK/plan_shadow" | tr -s ' '))" $ok
(cd "$WORK/shadow" && "$OLDPWD/$BIN" -e "$TINY" -i "$WORK/good.bin" -b 2 -t 16 -x 1 -v 0 >"$WORK/out" 2>&1) &&
    grep -q "^model: L=1 C=32 NH=2 V=256" "$WORK/out"
ok=$?
check "-e $TINY beside a folder of that name trains the descriptor's model: $(grep -E '^(model|error)' "$WORK/out")" $ok
cp "$CKPT" "$WORK/named/d12"
(cd "$WORK/named" && "$OLDPWD/$BIN" -e ./d12 -i "$WORK/good.bin" -b 2 -t 16 -x 1 -v 0 >"$WORK/out" 2>&1) &&
    grep -q "^model: L=1 C=32 NH=2 V=256" "$WORK/out"
check "-e ./d12 loads the model file named d12 (L=1)" $?

# an fp32 model file (version 3) with a weight beyond bf16's range (3.4e38 > 3.39e38, here an unused
# position's embedding), and one with a NaN: refused at load, before any step (the bf16 build)
python3 - "$CKPT" "$WORK" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
header = list(struct.unpack_from("<256i", d))
header[1] = 3  # fp32
w = [struct.unpack("<f", struct.pack("<I", r << 16))[0] for r in struct.unpack_from("<%dH" % ((len(d) - 1024) // 2), d, 1024)]
for name, i, x in (("beyond_bf16.bin", 256 * 32 + 20 * 32, 3.4e38), ("nan_weight.bin", 7, float("nan"))):
    v = list(w)
    v[i] = x  # (wpe row 20 of maxT 32: unused at T = 16)
    open("%s/%s" % (sys.argv[2], name), "wb").write(struct.pack("<256i", *header) + struct.pack("<%df" % len(v), *v))
PY
if grep -q "bf16 build" "$WORK/help"; then
    expect_error "an fp32 weight beyond bf16's range (was trained on, rounded stochastically)" \
        "beyond_bf16.bin: weight 8832 is 3.39999995e+38, beyond bf16's range" \
        -e "$WORK/beyond_bf16.bin" -i "$WORK/good.bin" -b 2 -t 16 -x 2 -v 0 -o "$WORK/beyond"
    ! grep -q "^step" "$WORK/out"
    check "... refused before any step" $?
else
    echo "SKIP an fp32 weight beyond bf16's range: not the bf16 build"
fi
expect_error "a NaN weight in a model file (was a non-finite loss at step 1)" "nan_weight.bin: weight 7 is nan, not finite" \
    -e "$WORK/nan_weight.bin" -i "$WORK/good.bin" -b 2 -t 16 -x 2 -v 0

# dev/fuzz_cli.py fuzzes exactly the flags and value forms of --help, and a few fixed runs of each target pass
python3 dev/fuzz_cli.py "$BIN" --list-flags >"$WORK/fuzz_flags" 2>&1 &&
    diff <(sed -nE 's/^  (-[^ ]+) (<[^ ]+>).*/\1 \2/p' "$WORK/help") "$WORK/fuzz_flags" >/dev/null
ok=$?
check "dev/fuzz_cli.py --list-flags: the $(wc -l <"$WORK/fuzz_flags") flags and value forms of --help" $ok
python3 dev/fuzz_cli.py "$BIN" --runs-per-target 4 --seed 5 >"$WORK/fuzz" 2>&1
ok=$?
check "dev/fuzz_cli.py, 4 runs per target: no crash, hang or bad exit ($(grep -c ' 0 crashes, 0 hangs, 0 bad exits' "$WORK/fuzz") of 3 targets clean)" $ok

echo "test_train_cli: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
