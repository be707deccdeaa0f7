# Sourced by the dataset scripts in data/: paths, downloads, the GPT-2 files, build/host tools.
# Outputs go to data/<name>/ and data/gpt2/ (not committed).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GPT2_URL=https://openaipublic.blob.core.windows.net/gpt-2/models/124M
THREADS=${THREADS:-$(nproc)}

die() { echo "error: $*" >&2; exit 1; }

# fetch URL FILE: downloads (resuming a .part file) and renames into place when complete.
fetch() {
    local url=$1 out=$2
    [[ -s $out ]] && { echo "have $out"; return 0; }
    command -v curl >/dev/null || die "curl not found (apt-get install curl), or pass a local file with --input"
    mkdir -p "$(dirname "$out")"
    echo "downloading $url"
    curl -fL --retry 3 -C - --progress-bar -o "$out.part" "$url" ||
        die "download of $url failed (no network? pass a local file with --input)"
    mv "$out.part" "$out"
}

# abspath PATH: an absolute path (the file must exist).
abspath() { [[ -e $1 ]] || die "$1: no such file"; echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }

# gpt2_dir: prints a directory holding encoder.json and vocab.bpe: data/gpt2 if it has them,
# else $SHARED_DATA/gpt2 (default ../shared/data), else downloads OpenAI's files into data/gpt2.
gpt2_dir() {
    local shared=${SHARED_DATA:-$ROOT/../shared/data}
    if [[ -s $ROOT/data/gpt2/encoder.json && -s $ROOT/data/gpt2/vocab.bpe ]]; then
        echo "$ROOT/data/gpt2"
    elif [[ -s $shared/gpt2/encoder.json && -s $shared/gpt2/vocab.bpe ]]; then
        echo "$(cd "$shared/gpt2" && pwd)"
    else
        fetch "$GPT2_URL/encoder.json" "$ROOT/data/gpt2/encoder.json" >&2
        fetch "$GPT2_URL/vocab.bpe" "$ROOT/data/gpt2/vocab.bpe" >&2
        echo "$ROOT/data/gpt2"
    fi
}

# tool NAME: builds build/host/NAME if needed and prints its path.
tool() {
    make -C "$ROOT" -s "build/host/$1" >&2 || die "building build/host/$1 failed"
    echo "$ROOT/build/host/$1"
}
