#!/usr/bin/env bash
# TinyStories (roneneldan/TinyStories, the GPT-4 "V2" text files: stories separated by
# <|endoftext|>) -> data/tinystories/tinystories_val_000000.bin (the official validation
# split) and tinystories_train_000001.bin, ... (100M-token shards). EOT before each story;
# each story stripped of surrounding white space, as llm.c's tinystories.py does.
#   usage: data/tinystories.sh [--input TRAIN.txt] [--val-input VALID.txt] [--threads N]
#          [--shard-size N]
#   With --input but no --val-input, the first 1,000,000 tokens of the input are the val shard.
#   Default: downloads TinyStoriesV2-GPT4-{valid,train}.txt (about 20 MB and 2.2 GB).
source "$(dirname "$0")/common.sh"
HF=https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main
input="" val_input="" shard_size=100000000
while [[ $# -gt 0 ]]; do
    case $1 in
        --input) input=$(abspath "${2:?--input needs a path}"); shift 2 ;;
        --val-input) val_input=$(abspath "${2:?--val-input needs a path}"); shift 2 ;;
        --threads) THREADS=${2:?}; shift 2 ;;
        --shard-size) shard_size=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
OUT=$ROOT/data/tinystories
mkdir -p "$OUT"
if [[ -z $input ]]; then
    fetch "$HF/TinyStoriesV2-GPT4-valid.txt" "$OUT/TinyStoriesV2-GPT4-valid.txt"
    fetch "$HF/TinyStoriesV2-GPT4-train.txt" "$OUT/TinyStoriesV2-GPT4-train.txt"
    input=$OUT/TinyStoriesV2-GPT4-train.txt
    val_input=$OUT/TinyStoriesV2-GPT4-valid.txt
fi
GPT2=$(gpt2_dir)
PREPRO=$(tool prepro)
# --replace: an earlier run's shards go, and only once this run succeeded
common=(--replace --split-on "<|endoftext|>" --threads "$THREADS" --gpt2-dir "$GPT2" --shard-size "$shard_size")
if [[ -n $val_input ]]; then
    "$PREPRO" --out "$OUT/tinystories" "${common[@]}" --val-tokens 2147483647 "$val_input"
    "$PREPRO" --out "$OUT/tinystories" "${common[@]}" --val-tokens 0 "$input"
else
    "$PREPRO" --out "$OUT/tinystories" "${common[@]}" --val-tokens 1000000 "$input"
fi
