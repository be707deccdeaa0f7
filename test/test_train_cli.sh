#!/usr/bin/env bash
# The trainer's command line: bad input gets one clear "error:" line and a
# non-zero exit (never a crash); a short run works end to end.
# Usage: test/test_train_cli.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
cd "$(dirname "$0")/.."
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
    "$BIN" "$@" >"$WORK/out" 2>"$WORK/err"
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
shard good.bin 5000 256
shard small.bin 100 256
shard badtok.bin 5000 300

"$BIN" --help >"$WORK/help" 2>&1
check "--help exits 0" $?
grep -q -- "-d <int>" "$WORK/help" && grep -q "B x T x N x A" "$WORK/help"
check "--help names the flags and the batch equation" $?

expect_error "unknown flag" "unknown flag -Z" -Z 1
expect_error "flag without a value" "needs a value" -i "$WORK/good.bin" -b
expect_error "non-numeric value" "expected an integer" -b four
expect_error "bad descriptor" "not a checkpoint file or a model descriptor" -e "L=two"
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
expect_error "checkpoint with a wrong magic" "not a model checkpoint" -e "$WORK/magic.bin" -i "$WORK/good.bin"
expect_error "checkpoint with a wrong version" "unsupported checkpoint version 4" -e "$WORK/version.bin" -i "$WORK/good.bin"
expect_error "truncated checkpoint" "truncated" -e "$WORK/trunc.bin" -i "$WORK/good.bin"
expect_error "checkpoint shorter than its header" "truncated checkpoint header" -e "$WORK/short.bin" -i "$WORK/good.bin"
"$BIN" -e "$CKPT" -i "$WORK/good.bin" -b 2 -t 16 -x 1 -v 0 >/dev/null 2>&1
check "the written checkpoint loads and trains" $?

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

# the built-in corpus (no -i): 100 steps close most of the gap to the known floor
(cd "$WORK" && "$OLDPWD/$BIN" -x 100 -v 100 >"$WORK/builtin" 2>&1)
check "built-in corpus run" $?
gap=$(grep "^step 100: val loss" "$WORK/builtin" | sed -E 's/.*\(([0-9.]+)% of the initial gap\).*/\1/')
grep -q "loss floor of the val data: 1.154616" "$WORK/builtin" && [[ -n $gap ]] && awk "BEGIN{exit !($gap < 30)}"
check "built-in corpus: floor 1.154616 printed; after 100 steps the val gap is ${gap:-?}% of the initial gap (< 30%)" $?

echo "test_train_cli: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
