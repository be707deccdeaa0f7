#!/usr/bin/env bash
# Tiny Shakespeare -> data/tinyshakespeare/tinyshakespeare_{val_000000,train_000001}.bin with
# llm.c's recipe: split on blank lines, EOT before each section, the first 32,768 tokens val,
# the remaining 305,260 train. Also writes the tokenizer as data/gpt2/gpt2_tokenizer.bin.
#   usage: data/tinyshakespeare.sh [--input PATH] [--threads N]
#   default input: downloaded from karpathy/char-rnn (the file llm.c and nanoGPT use)
source "$(dirname "$0")/common.sh"
URL=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
input=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --input) input=$(abspath "${2:?--input needs a path}"); shift 2 ;;
        --threads) THREADS=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
OUT=$ROOT/data/tinyshakespeare
mkdir -p "$OUT"
if [[ -z $input ]]; then
    fetch "$URL" "$OUT/input.txt"
    input=$OUT/input.txt
fi
GPT2=$(gpt2_dir)
PREPRO=$(tool prepro)
mkdir -p "$ROOT/data/gpt2"
"$PREPRO" --replace --out "$OUT/tinyshakespeare" --split-on-blank-lines --val-tokens 32768 --threads "$THREADS" \
    --gpt2-dir "$GPT2" --write-tokenizer "$ROOT/data/gpt2/gpt2_tokenizer.bin" "$input"
