#!/bin/bash
# train_llama3's command line (default: build/cpu/train_llama3): bad input to
# what is Llama's own (the descriptor, the transformers folder, GPT-2-only
# flags, the document-start token) gets one "error:" line and exit 1; --help
# describes Llama's -r, -e and --doc-token; uint32 shards (ids >= 65536) train
# with --packing slots and --doc-mask at the right document start; the
# built-in default trains. A checkpoint's model is a Hugging Face folder
# model_S/ of exactly config.json and model.safetensors, both listed in DONE_S;
# -e takes it; -y 1 refuses a truncated model.safetensors in it and a folder
# that is a symbolic link (falling back to the checkpoint before); -nk removes
# older folders whole. The flags and the run are llmc/run/run.h's, tested through
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
check "-ge 1 is refused (GPT-2's GELU fusion is not a Llama flag)" one_error "unknown flag -ge" -ge 1 -x 1
check "a descriptor with H not dividing C is refused" one_error "H=5 does not divide C=64" -e "llama3:L=2,C=64,H=5,KV=1,F=192,V=256" -x 1
check "KV not dividing H is refused" one_error "KV=3 does not divide H=4" -e "llama3:L=2,C=64,H=4,KV=3,F=192,V=256" -x 1
for plan in "" "--memory-plan 1"; do  # the plan refuses what the run would
    check "theta 1 (RoPE's frequencies need > 1) is refused ${plan:-by a run}" \
        one_error "theta must be a finite number > 1" -e "llama3:L=2,C=64,H=4,KV=2,F=192,V=256,theta=1" -b 1 -t 64 -x 1 $plan
done
check "-ge 1 is refused by --memory-plan 1" one_error "unknown flag -ge" -ge 1 -b 1 -t 64 --memory-plan 1
check "an unknown descriptor key is refused" one_error "unknown key Q=" -e "llama3:L=2,C=64,H=4,KV=2,F=192,V=256,Q=1" -x 1
mkdir -p "$work/empty"
check "a folder without config.json is refused" one_error "config.json: cannot read" -e "$work/empty" -x 1
mkdir -p "$work/noweights" && cp test/ref/llama3_hf_tiny/tied/config.json "$work/noweights/"
check "a folder with config.json and no safetensors is refused" one_error "model.safetensors: cannot open" -e "$work/noweights" -x 1
# config.json: what the trainer does not compute is refused, not dropped (the cases: test_safetensors)
mkdir -p "$work/dropout" && python3 -c "
import json, sys
c = json.load(open('test/ref/llama3_hf_tiny/untied/config.json'))
c['attention_dropout'] = 0.1
json.dump(c, open(sys.argv[1], 'w'))" "$work/dropout/config.json"
check "a config.json with attention_dropout 0.1 is refused" one_error '"attention_dropout" "0.1" is not supported' -e "$work/dropout" -x 1
# a shard name from the index is escaped in the error: one line, not a forged second "error:" line
cp -r test/ref/llama3_hf_tiny/sharded "$work/forged"
sed -i 's/"lm_head.weight": "model-00003-of-00003.safetensors"/"lm_head.weight": "x\\nerror: forged.safetensors"/' \
    "$work/forged/model.safetensors.index.json"
check "an index naming a shard with a newline: one error line, the newline escaped" \
    one_error 'forged/x\\x0aerror: forged.safetensors: cannot open' -e "$work/forged" -x 1
check "the model line names RoPE's scaling" bash -c "'$BIN' -e 'llama3:L=1,C=32,H=2,KV=1,F=64,V=256,T=64,factor=8,orig=16' \
    -x 1 -v 0 -s 0 2>&1 | grep -qF 'T=64 untied, rope theta 500000, llama3 scaling (factor 8, low 1, high 4, original 16),'"
"$BIN" --help >"$work/help" 2>&1
check "--help: -r recomputes SwiGLU and the RMSNorms" grep -q "1 = SwiGLU, 2 = SwiGLU and the RMSNorms" "$work/help"
check "--help: -r 3 recomputes the whole block" grep -q "3 = the whole block from its input" "$work/help"
check "--help: -e names the published sizes" grep -q "llama3.2-1b" "$work/help"
check "--help: -e names llama3.1-70b" grep -q "llama3.1-70b" "$work/help"
check "--help: no GPT-2 GELU recompute text" bash -c "! grep -q '1 = GELU' '$work/help'"
# Data with ids >= 65536: llm.c's uint32 shards (magic 20240801, version 7).
# shard PATH V START LENGTHS...: documents of the given lengths, each starting
# with token START, the rest ids in [65536, V-100); the second token is V-50.
shard() {
    python3 - "$@" <<'PY'
import struct, sys
path, V, start, lengths = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [int(x) for x in sys.argv[4:]]
toks = []
for k, n in enumerate(lengths):
    toks += [start] + [65536 + (k * 131 + i * 17) % (V - 100 - 65536) for i in range(n - 1)]
toks[1] = V - 50
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240801, 7, len(toks), *[0] * 253))
    f.write(struct.pack("<%dI" % len(toks), *toks))
PY
}
# V=70000: documents start at 69000 (not V-1). A slot of T=16 holds a document
# through the next start (its last target), cut at T+1 tokens: a document of n
# tokens has min(n, T) counted targets, so the first step's 4 documents (5, 9,
# 3, 20 tokens) count 5 + 9 + 3 + 16 = 33 of B x T = 64 (util 51.6%); documents
# cut at any other token count otherwise (or are too few).
V70="llama3:L=1,C=32,H=2,KV=1,F=64,V=70000,T=16"
shard "$work/u32.bin" 70000 69000 5 9 3 20 7 11 4 6 8 12
run70() { timeout $((300 * ${TEST_TIMEOUT_SCALE:-1})) "$BIN" -e "$V70" -i "$work/u32.bin" -b 4 -t 16 -x 1 -v 0 -s 0 "$@"; }
check "uint32 shard, --packing slots --doc-mask 1 --doc-token 69000: documents found at 69000 (util 51.6%)" \
    bash -c "$(declare -f run70); BIN='$BIN' V70='$V70' work='$work' run70 --packing slots --doc-mask 1 --doc-token 69000 >'$work/run70' 2>&1 &&
             grep -q 'documents: starting at token 69000' '$work/run70' && grep -qE '^step +1/1 .*util 51\.6%' '$work/run70'"
check "uint32 shard, --doc-token 69999 (V-1, absent from the data): not the same documents (one slot per shard start)" \
    one_error "too few documents" -e "$V70" -i "$work/u32.bin" -b 4 -t 16 -x 1 -v 0 -s 0 --packing slots --doc-token 69999
check "Llama V=70000 with --packing slots and no --doc-token: one error naming --doc-token" \
    one_error "--packing slots: the token that starts a document is not known for Llama 3 with V=70000; give it with --doc-token" \
    -e "$V70" -i "$work/u32.bin" -b 4 -t 16 -x 1 -v 0 -s 0 --packing slots
check "... --doc-mask 1 with no --doc-token: the same, naming --doc-mask" \
    one_error "--doc-mask: .*--doc-token" -e "$V70" -i "$work/u32.bin" -b 4 -t 16 -x 1 -v 0 -s 0 --doc-mask 1
check "... -s 1 with no --doc-token (a sample starts at a document start): the same, naming -s" \
    one_error "-s: .*--doc-token" -e "$V70" -i "$work/u32.bin" -b 4 -t 16 -x 1 -v 0 -s 1
check "--doc-token 70000 (= V) is refused" \
    one_error "--doc-token 70000: not a token of the model's vocabulary (V=70000)" -e "$V70" -i "$work/u32.bin" -x 1 --doc-mask 1 --doc-token 70000
check "--doc-token -2 is refused" one_error "--doc-token -2" -e "$V70" -i "$work/u32.bin" -x 1 --doc-token -2
# the document token is decided from the shape alone, before the weights are drawn or read: under
# an address-space limit of 4 GB, Llama 3.1 8B's 32 GB of weights would end the run as out of memory
small_memory() { (ulimit -v 4000000 && one_error "$@"); }
check "-e llama3.1-8b --doc-mask 1 --doc-token 200000: refused before 8B weights are drawn" \
    small_memory "--doc-token 200000: not a token of the model's vocabulary (V=128256)" -e llama3.1-8b \
    -i "$work/u32.bin" -x 1 --doc-mask 1 --doc-token 200000
plan70b=$(ulimit -v 4000000 && CPUCUDA_DEVICE_MEMORY_MB=81920 "$BIN" -e llama3.1-70b --memory-plan 1 -b 1 -t 8192 -r 3 2>&1)
check "-e llama3.1-70b --memory-plan 1: the plan (of 80 layers, C=8192) without its weights: $(echo "$plan70b" | grep total | tr -s ' ')" \
    bash -c "grep -q '^  activations (B x T x C x L) *12646.1 MiB$' <<<'$plan70b' &&
    grep -q '^  total .* of 81920.0 MiB on the device (does not fit)$' <<<'$plan70b'"
check "an 8B shape with V=70000, --doc-mask 1 and no --doc-token: refused before its weights are drawn" \
    small_memory "--doc-mask: .*V=70000; give it with --doc-token" -e "llama3:L=32,C=4096,H=32,KV=8,F=14336,V=70000" \
    -i "$work/u32.bin" -x 1 --doc-mask 1
mkdir -p "$work/big" && python3 -c "
import json, sys
c = json.load(open('test/ref/llama3_hf_tiny/untied/config.json'))
c.update(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
         num_hidden_layers=32, vocab_size=70000)
json.dump(c, open(sys.argv[1], 'w'))" "$work/big/config.json"
check "a folder whose config.json gives V=70000, --doc-mask 1 and no --doc-token: refused before its (absent) tensors are read" \
    one_error "--doc-mask: .*V=70000; give it with --doc-token" -e "$work/big" -i "$work/u32.bin" -x 1 --doc-mask 1
check "the vocabulary check refuses id 69950 in a uint32 shard for V=69900 (one line)" \
    one_error "u32.bin: token id 69950 at token offset 1 (byte offset 1028) is >= vocab_size 69900" \
    -e "llama3:L=1,C=32,H=2,KV=1,F=64,V=69900,T=16" -i "$work/u32.bin" -b 4 -t 16 -x 1 -v 0 -s 0
# Llama 3's own vocabulary: documents start at <|begin_of_text|> = 128000
# without --doc-token. Three of them, for B=4 slots: the loader's count names
# them (V-1 = 128255 would find one). With B=3 a step trains them: 5 + 9 + 2 =
# 16 counted targets of 48 (util 33.3%; the shard's last token has no target),
# through the classifier's path for a row of logits larger than a block's
# shared memory (251 KB in bf16).
shard "$work/l3.bin" 128256 128000 5 9 3
L3=(-e "llama3:L=1,C=32,H=2,KV=1,F=32,V=128256,T=16" -i "$work/l3.bin" -t 16 -x 1 -v 0 -s 0 --packing slots)
check "V=128256: --packing slots starts documents at 128000 (<|begin_of_text|>) by default" \
    one_error "l3.bin: too few documents: the 1 shard(s) hold 3, need at least B = 4" "${L3[@]}" -b 4
timeout $((300 * ${TEST_TIMEOUT_SCALE:-1})) "$BIN" "${L3[@]}" -b 3 >"$work/run_l3" 2>&1
check "V=128256: one step on its 3 documents (util 33.3%, a finite loss)" \
    grep -qE '^step +1/1 \| loss [0-9]+\.[0-9]+ .*util 33\.3%' "$work/run_l3"
check "--help: --doc-token says Llama 3's default" grep -q "128000 (<|begin_of_text|>)" "$work/help"
check "the built-in default trains 3 steps" bash -c "'$BIN' -x 3 -v 0 -s 0 >'$work/run' 2>&1 && grep -qE '^step +3/' '$work/run'"
check "... its model line: plain RoPE" grep -q '^model: Llama 3 .* rope theta 500000, no scaling, ' "$work/run"

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
check "-y 1 without -e: the resume line says the model is the checkpoint's" \
    grep -q "^resuming from step 2 of $ck, its model (no -e given)$" "$work/run"
check "-y 1 with a -e of another shape: refused, naming both" \
    one_error "-e llama3:L=1,C=32,H=2,KV=1,F=64,V=256,T=64: not the model of the checkpoint of step 6 in $ck (Llama 3 L=2 " \
    -e "llama3:L=1,C=32,H=2,KV=1,F=64,V=256,T=64" -x 8 -n 2 -v 0 -s 0 -o "$ck" -y 1
# the newest folder replaced by a link to an intact copy: not followed
lk=$work/lk
cp -r "$work/ck_good" "$lk" && mv "$lk/model_00000004" "$work/intact" && ln -s "$work/intact" "$lk/model_00000004"
run -x 6 -n 2 -o "$lk" -y 1
check "-y 1: model_00000004 as a symbolic link to an intact folder is not followed, the run resumes from step 2" \
    bash -c "grep -q 'checkpoint 4 not used: .*model_00000004: a symbolic link, not followed' '$work/run' &&
             grep -q 'resuming from step 2 ' '$work/run' && [[ -f '$work/intact/model.safetensors' ]]"
check "... and stops before any step: the link is in the way of step 4 (not the run's: kept)" \
    bash -c "grep -q '^error: .*model_00000004 is not a file this run wrote' '$work/run' && ! grep -q '^step ' '$work/run' &&
             [[ -L '$lk/model_00000004' ]]"
# -nk 1: the older folders go whole, the newest stays
nk=$work/nk
run -x 3 -n 1 -nk 1 -o "$nk"
check "-nk 1: only model_00000003 is left of 3 checkpoints' folders" \
    bash -c "[[ \$(ls '$nk' | grep '^model_' | tr '\n' ' ') == 'model_00000003 ' && -f '$nk/model_00000003/model.safetensors' ]]"
# the user's files at checkpoint names: kept, or, where the run must write or prune, one error naming them
mkdir "$nk/model_00000000" && echo mine >"$nk/model_00000000/notes.txt"
run -x 4 -n 1 -nk 1 -o "$nk" -y 1
check "-nk 1 prunes step 3 and keeps a user's model_00000000/ (no DONE)" \
    bash -c "[[ ! -e '$nk/model_00000003' && -d '$nk/model_00000004' && \$(cat '$nk/model_00000000/notes.txt') == mine ]]"
echo mine >"$nk/model_00000004/notes.txt"
check "a user's file in model_00000004/, which -nk 1 would prune after step 5: one error naming it, at start-up" \
    one_error "model_00000004/notes.txt is not a file this run wrote; remove or move it (nothing was deleted)" \
    -v 0 -s 0 -x 5 -n 1 -nk 1 -o "$nk" -y 1
check "... before any step, nothing of step 4 deleted" bash -c "! grep -q '^step ' '$work/out' &&
    [[ -e '$nk/DONE_00000004' && -f '$nk/model_00000004/model.safetensors' && \$(cat '$nk/model_00000004/notes.txt') == mine ]]"
mv "$nk/model_00000004/notes.txt" "$nk/notes.txt"
run -x 6 -n 1 -nk 1 -o "$nk" -y 1
check "without it, -nk 1 trains on to step 6, pruning steps 4 and 5" \
    bash -c "[[ \$(ls '$nk' | grep '^DONE_' | tr '\n' ' ') == 'DONE_00000006 ' ]]"
mkdir "$nk/model_00000007" && echo mine >"$nk/model_00000007/notes.txt"
check "a user's folder model_00000007/ newer than the newest DONE, where the run would write step 7: one error naming it" \
    one_error "/model_00000007 is not a file this run wrote" -v 0 -s 0 -x 7 -n 1 -nk 1 -o "$nk" -y 1
check "... at start-up, before any step; the folder kept, checkpoint 6 kept" bash -c "! grep -q '^step ' '$work/out' &&
    [[ \$(cat '$nk/model_00000007/notes.txt') == mine && \$(ls '$nk' | grep '^DONE_' | tr '\n' ' ') == 'DONE_00000006 ' ]]"
rm -r "$nk/model_00000007" && echo mine >"$nk/model_00000007"
check "a user's file model_00000007 where the run writes the folder: one error naming it" \
    one_error "/model_00000007 is not a file this run wrote" -v 0 -s 0 -x 7 -n 1 -nk 1 -o "$nk" -y 1
rm "$nk/model_00000007" && echo mine >"$nk/model_00000007.tmp"
check "a user's regular file model_00000007.tmp (the run's temporary is a folder): one error naming it" \
    one_error "/model_00000007.tmp is not a file this run wrote" -v 0 -s 0 -x 7 -n 1 -nk 1 -o "$nk" -y 1
check "... the user's files kept" bash -c "[[ \$(cat '$nk/model_00000007.tmp' '$nk/notes.txt') == mine$'\n'mine ]]"
tally test_llama3_cli
