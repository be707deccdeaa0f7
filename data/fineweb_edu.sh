#!/usr/bin/env bash
# FineWeb-Edu sample (HuggingFaceFW/fineweb-edu, sample/10BT parquet files) ->
# data/fineweb_edu/fineweb_edu_val_000000.bin, fineweb_edu_train_000001.bin, ...: EOT before
# each document, 100M-token shards, the first shard val (llm.c's fineweb.py convention).
#   usage: data/fineweb_edu.sh [--input FILE.parquet|FILE.jsonl]... [--files N] [--threads N]
#          [--shard-size N]
#   Default: downloads the first N (default 1) parquet files of sample/10BT (about 2 GB each).
#   Parquet needs python3 with pyarrow (pip install pyarrow); JSONL input (a "text" field per
#   line) needs nothing more.
source "$(dirname "$0")/common.sh"
HF=https://huggingface.co/datasets/HuggingFaceFW/fineweb-edu/resolve/main/sample/10BT
inputs=() files=1 shard_size=100000000
while [[ $# -gt 0 ]]; do
    case $1 in
        --input) inputs+=("$(abspath "${2:?--input needs a path}")"); shift 2 ;;
        --files) files=${2:?}; shift 2 ;;
        --threads) THREADS=${2:?}; shift 2 ;;
        --shard-size) shard_size=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
OUT=$ROOT/data/fineweb_edu
mkdir -p "$OUT"
if [[ ${#inputs[@]} -eq 0 ]]; then
    for ((i = 0; i < files; i++)); do
        name=$(printf "%03d_00000.parquet" "$i")
        fetch "$HF/$name" "$OUT/$name"
        inputs+=("$OUT/$name")
    done
fi
jsonl=()
for f in "${inputs[@]}"; do
    case $f in
        *.parquet)
            j=$OUT/$(basename "$f" .parquet).jsonl
            if [[ ! -s $j ]]; then
                python3 -c "import pyarrow" 2>/dev/null || die "reading $f needs pyarrow (pip install pyarrow)"
                echo "converting $f -> $j"
                python3 - "$f" "$j.part" <<'PY'
import json, sys
import pyarrow.parquet as pq
src, dst = sys.argv[1], sys.argv[2]
with open(dst, "w", encoding="utf-8") as out:
    for batch in pq.ParquetFile(src).iter_batches(columns=["text"], batch_size=4096):
        for t in batch.column(0).to_pylist():
            out.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
PY
                mv "$j.part" "$j"
            fi
            jsonl+=("$j") ;;
        *) jsonl+=("$f") ;;
    esac
done
GPT2=$(gpt2_dir)
PREPRO=$(tool prepro)
"$PREPRO" --replace --out "$OUT/fineweb_edu" --format jsonl --field text --shard-size "$shard_size" \
    --threads "$THREADS" --gpt2-dir "$GPT2" "${jsonl[@]}"
