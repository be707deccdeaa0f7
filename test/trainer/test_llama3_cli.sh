#!/bin/bash
# train_llama3's command line (default: build/cpu/train_llama3): bad input to
# what is Llama's own (the descriptor, the transformers folder, GPT-2-only
# flags) gets one "error:" line and exit 1; --help describes Llama's -r and -e;
# the built-in default trains. A checkpoint's model is a Hugging Face folder
# model_S/ of exactly config.json and model.safetensors, both listed in DONE_S;
# -e takes it; -y 1 refuses a truncated model.safetensors in it and a folder
# that is a symbolic link (falling back to the checkpoint before); -nk removes
# older folders whole. The flags and the run are llmc/run.h's, tested through
# train_gpt by test_train_cli.sh.
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

# ---- checkpoints: the model is a Hugging Face folder
run() { timeout $((300 * ${TEST_TIMEOUT_SCALE:-1})) "$BIN" -v 0 -s 0 "$@" >"$work/run" 2>&1; }
ck=$work/ck
run -x 4 -n 2 -o "$ck"
m=$ck/model_00000004
check "a checkpoint's model: the folder model_00000004 with exactly config.json and model.safetensors" \
    bash -c "[[ -d '$m' && ! -L '$m' && \$(ls -A '$m' | tr '\n' ' ') == 'config.json model.safetensors ' ]]"
# DONE lists both files of the folder with their sizes (and the state file), nothing else
grep '^file ' "$ck/DONE_00000004" | awk '{print $2, $3}' >"$work/listed"
for f in model_00000004/config.json model_00000004/model.safetensors state_00000004_00000.bin; do
    echo "$f $(stat -c %s "$ck/$f")"
done >"$work/on_disk"
check "DONE_00000004 lists model_00000004/config.json and model_00000004/model.safetensors with their sizes" \
    cmp "$work/listed" "$work/on_disk"
check "-e takes a checkpoint's model folder" bash -c "'$BIN' -e '$m' -x 1 -v 0 -s 0 >'$work/e' 2>&1 && grep -qE '^step +1/1' '$work/e'"
cp -r "$ck" "$work/ck_good"
# a truncated model.safetensors in the newest folder: -y 1 skips it, saying why, for step 2
truncate -s -1 "$m/model.safetensors"
run -x 6 -n 2 -o "$ck" -y 1
check "-y 1: a truncated model_00000004/model.safetensors is refused, the run resumes from step 2" \
    bash -c "grep -q 'checkpoint 4 not used: .*model_00000004/model.safetensors: [0-9]* bytes, its DONE says' '$work/run' &&
             grep -q 'resuming from step 2 ' '$work/run' && grep -qE '^step +6/6' '$work/run'"
# the newest folder replaced by a link to an intact copy: not followed
lk=$work/lk
cp -r "$work/ck_good" "$lk" && mv "$lk/model_00000004" "$work/intact" && ln -s "$work/intact" "$lk/model_00000004"
run -x 6 -n 2 -o "$lk" -y 1
check "-y 1: model_00000004 as a symbolic link to an intact folder is not followed, the run resumes from step 2" \
    bash -c "grep -q 'checkpoint 4 not used: .*model_00000004: a symbolic link, not followed' '$work/run' &&
             grep -q 'resuming from step 2 ' '$work/run' && [[ -f '$work/intact/model.safetensors' ]]"
# -nk 1: the older folders go whole, the newest stays
nk=$work/nk
run -x 3 -n 1 -nk 1 -o "$nk"
check "-nk 1: only model_00000003 is left of 3 checkpoints' folders" \
    bash -c "[[ \$(ls '$nk' | grep '^model_' | tr '\n' ' ') == 'model_00000003 ' && -f '$nk/model_00000003/model.safetensors' ]]"
tally test_llama3_cli
