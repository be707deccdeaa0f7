#!/bin/bash
# train_llama3's command line (default: build/cpu/train_llama3): bad input to
# what is Llama's own (the descriptor, the transformers folder, GPT-2-only
# flags) gets one "error:" line and exit 1; --help describes Llama's -r and -e;
# the built-in default trains. The flags and the run are llmc/run.h's, tested
# through train_gpt by test_train_cli.sh.
#   bash test/trainer/test_llama3_cli.sh [TRAINER]
cd "$(dirname "$0")/../.." || exit 1
source test/check.sh
BIN=${1:-build/cpu/train_llama3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# one_error PATTERN ARGS...: exit 1, exactly one stderr line, "error: ...PATTERN"
one_error() {
    local pattern=$1
    shift
    timeout $((300 * ${TEST_TIMEOUT_SCALE:-1})) "$BIN" "$@" >"$work/out" 2>"$work/err"
    local rc=$?
    [[ $rc -eq 1 && $(wc -l <"$work/err") -eq 1 ]] && grep -q "^error: .*$pattern" "$work/err"
}
check "-ge 1 is refused (GPT-2's GELU fusion)" one_error "Llama 3 has no GELU" -ge 1 -x 1
check "a descriptor with H not dividing C is refused" one_error "H=5 does not divide C=64" -e "llama3:L=2,C=64,H=5,KV=1,F=192,V=256" -x 1
check "KV not dividing H is refused" one_error "KV=3 does not divide H=4" -e "llama3:L=2,C=64,H=4,KV=3,F=192,V=256" -x 1
check "an unknown descriptor key is refused" one_error "unknown key Q=" -e "llama3:L=2,C=64,H=4,KV=2,F=192,V=256,Q=1" -x 1
mkdir -p "$work/empty"
check "a folder without config.json is refused" one_error "config.json: cannot read" -e "$work/empty" -x 1
mkdir -p "$work/noweights" && cp test/ref/llama3_hf_tiny/tied/config.json "$work/noweights/"
check "a folder with config.json and no safetensors is refused" one_error "model.safetensors: cannot open" -e "$work/noweights" -x 1
"$BIN" --help >"$work/help" 2>&1
check "--help: -r recomputes SwiGLU and the RMSNorms" grep -q "1 = SwiGLU, 2 = SwiGLU and the RMSNorms" "$work/help"
check "--help: -e names the published sizes" grep -q "llama3.2-1b" "$work/help"
check "--help: no GPT-2 GELU recompute text" bash -c "! grep -q '1 = GELU' '$work/help'"
check "the built-in default trains 3 steps" bash -c "'$BIN' -x 3 -v 0 -s 0 >'$work/run' 2>&1 && grep -qE '^step +3/' '$work/run'"
tally test_llama3_cli
