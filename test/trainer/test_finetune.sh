#!/bin/bash
# The fine-tuning flow end to end on a small model: a transformers-made Llama
# folder (test/ref/llama3_hf_ft: V = 2512, the test ranks' 2256 ids and Llama
# 3's 256 specials; dev/make_llama3_fixture.py --finetune) -> text tokenized by
# prepro with the test ranks file (test/data/tiktoken_test.ranks) into uint32
# shards -> train_llama3 -e FOLDER a few steps with --doc-mask 1 at the
# tokenizer's document token -> the checkpoint's model folder -> the logits
# llama3_logits computes from it against LlamaForCausalLM.from_pretrained's on
# the same folder (dev/compare_llama3_logits.py; a SKIP line where torch or
# transformers is missing, the rest runs everywhere).
#   bash test/trainer/test_finetune.sh [BUILD_DIR]   (default build/cpu-fp32)
cd "$(dirname "$0")/../.." || exit 1
source test/check.sh
BUILD=${1:-build/cpu-fp32}
FIXTURE=test/ref/llama3_hf_ft
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the text: README.md's first 4,000 bytes, its paragraphs the documents
head -c 4000 README.md >"$work/text.txt"
build/host/prepro --tiktoken test/data/tiktoken_test.ranks --uint32 --split-on-blank-lines --val-tokens 256 \
    --out "$work/ft" "$work/text.txt" >"$work/prepro" 2>&1
doc=$(sed -nE 's/.*each document starts with token ([0-9]+) .*/\1/p' "$work/prepro")
check "prepro --tiktoken test ranks --uint32: vocabulary 2512 (the fixture's), uint32 shards, documents start at 2256" \
    bash -c "grep -q 'vocabulary 2512 (llama3 pattern, uint32 shards)' '$work/prepro' && [[ '$doc' == 2256 ]] &&
             grep -q '\"vocab_size\": 2512' '$FIXTURE/config.json'"
# header: magic 20240801, version 7, the token count; 4 bytes a token after the 1024-byte header
header() { od -A n -t d4 -N 12 "$1" | xargs; }
check "the val shard: llm.c's uint32 header (20240801 7 256), 1024 + 4 x 256 bytes, first token 2256" \
    bash -c "[[ '$(header "$work/ft_val_000000.bin")' == '20240801 7 256' && \$(stat -c %s '$work/ft_val_000000.bin') == 2048 &&
             \$(od -A n -t u4 -j 1024 -N 4 '$work/ft_val_000000.bin' | xargs) == 2256 ]]"
run=$work/run
timeout $((300 * ${TEST_TIMEOUT_SCALE:-1})) "$BUILD/train_llama3" -e "$FIXTURE" -i "$work/ft_train_*.bin" -j "$work/ft_val_*.bin" \
    -b 4 -t 32 -x 4 -l 1e-2 -v 4 -m 1 -s 0 --doc-mask 1 --doc-token "$doc" -o "$run" >"$work/train" 2>&1
check "train_llama3 -e $FIXTURE, 4 steps with --doc-mask 1 --doc-token 2256: documents found, the val loss falls" \
    bash -c "grep -q 'documents: starting at token 2256' '$work/train' && grep -qE '^step +4/4 \| loss [0-9]+\.[0-9]+' '$work/train' &&
             awk '/val loss/ {v[n++] = \$NF} END {exit !(n == 2 && v[1] < v[0])}' '$work/train'"
m=$run/model_00000004
check "the checkpoint: model_00000004/ of config.json and model.safetensors, vocab_size 2512, fp32 (F32 tensors)" \
    bash -c "[[ \$(ls -A '$m' | tr '\n' ' ') == 'config.json model.safetensors ' ]] && grep -q '\"vocab_size\": 2512' '$m/config.json' &&
             grep -q '\"float32\"' '$m/config.json' && head -c 4096 '$m/model.safetensors' | grep -q '\"F32\"'"
check "train_llama3 -e takes the checkpoint folder back (1 step)" \
    bash -c "'$BUILD/train_llama3' -e '$m' -i '$work/ft_train_*.bin' -b 4 -t 32 -x 1 -v 0 -s 0 --doc-mask 1 --doc-token $doc \
             >'$work/again' 2>&1 && grep -qE '^step +1/1' '$work/again'"
# the comparison: the val shard's first 32 tokens (two documents; both sides attend causally over all 32)
tokens=$(od -A n -t u4 -j 1024 -N 128 "$work/ft_val_000000.bin" | xargs)
# llama3_logits, the trainer's side of the comparison, without torch: T x V fp32 values, finite, and one
# error line for a token outside the vocabulary
check "llama3_logits on the checkpoint: 32 x 2512 fp32 logits, all finite" \
    bash -c "'$BUILD/llama3_logits' '$m' '$work/logits.f32' $tokens >/dev/null && [[ \$(stat -c %s '$work/logits.f32') == $((32 * 2512 * 4)) ]] &&
             python3 -c 'import array, math, sys; a = array.array(\"f\", open(sys.argv[1], \"rb\").read()); sys.exit(not all(map(math.isfinite, a)))' '$work/logits.f32'"
check "llama3_logits refuses token 2512 (= V): one error line, exit 1" \
    bash -c "'$BUILD/llama3_logits' '$m' '$work/bad.f32' 1 2512 2>'$work/err'; [[ \$? == 1 && \$(wc -l <'$work/err') == 1 ]] &&
             grep -q '^error: token 2512: not an id of the vocabulary (V=2512)' '$work/err'"
if python3 -c "import torch, transformers" 2>/dev/null; then
    python3 dev/compare_llama3_logits.py "$BUILD/llama3_logits" "$m" $tokens >"$work/cmp" 2>&1
    rc=$?
    sed -E 's/^(PASS|FAIL) /  measured: /' "$work/cmp"
    check "the checkpoint's logits: llama3_logits = LlamaForCausalLM.from_pretrained within 1e-5 (fp32)" \
        bash -c "[[ $rc == 0 ]] && grep -q '^PASS logits' '$work/cmp'"
    # the same comparison against the fixture before training must fail: the
    # checkpoint holds the trained weights, and the bound tells them apart
    python3 dev/compare_llama3_logits.py "$BUILD/llama3_logits" "$m" --hf "$FIXTURE" $tokens >"$work/cmp0" 2>&1
    rc0=$?
    sed -E 's/^(PASS|FAIL) /  measured: /' "$work/cmp0"
    check "... and transformers on the fixture before training does not match them (4 steps moved the logits)" \
        bash -c "[[ $rc0 == 1 ]] && grep -q '^FAIL logits' '$work/cmp0'"
else
    echo "SKIP test_finetune's logits comparison: torch or transformers is not installed (python3 -c 'import torch, transformers' fails)"
fi
tally test_finetune
