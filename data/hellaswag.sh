#!/usr/bin/env bash
# HellaSwag validation -> data/hellaswag/hellaswag_val.bin (llm.c's eval format).
#   usage: data/hellaswag.sh [--input hellaswag_val.jsonl | hellaswag_val_full.txt] [--threads N]
#   Default: downloads rowanz/hellaswag's data/hellaswag_val.jsonl (10,042 items).
source "$(dirname "$0")/common.sh"
URL=https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl
input=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --input) input=$(abspath "${2:?--input needs a path}"); shift 2 ;;
        --threads) THREADS=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
OUT=$ROOT/data/hellaswag
mkdir -p "$OUT"
if [[ -z $input ]]; then
    fetch "$URL" "$OUT/hellaswag_val.jsonl"
    input=$OUT/hellaswag_val.jsonl
fi
GPT2=$(gpt2_dir)
HS=$(tool hellaswag)
"$HS" --input "$input" --out "$OUT/hellaswag_val.bin" --gpt2-dir "$GPT2" --threads "$THREADS"
