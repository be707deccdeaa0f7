#!/usr/bin/env bash
# bash test/gpu_bare_image_check.sh DEPS_DIR: exits non-zero unless every header that
# the GPU sources include resolves from this repo, the CUDA headers, the gathered
# DEPS_DIR (make gpu-deps) or libc/libstdc++/kernel headers, i.e. what a bare GPU
# image without apt has once the device tool carries DEPS_DIR.
set -u
cd "$(dirname "$0")/.."
deps=$1
[[ -d $deps ]] || { echo "error: $deps missing (make gpu-deps)"; exit 1; }
allowed=$(mktemp)
trap 'rm -f "$allowed"' EXIT
dpkg -L libc6-dev linux-libc-dev $(dpkg -l 'libstdc++-*-dev' 'libgcc-*-dev' | awk '/^ii/ {print $2}') 2>/dev/null |
    grep '^/usr/include/' | sort -u >"$allowed"
bad=0
for src in train_gpt.cu dev/*.cu test/kernels/test_*.cu test/model/test_*.cu; do
    # the CPU runtime's CUDA headers stand in for the toolkit's; the includes are the same
    if ! hdrs=$(g++ -std=c++17 -M -x c++ -Icpu_cuda/include -I. -isystem "$deps" -DCPUCUDA "$src" 2>&1); then
        echo "$src: does not preprocess: $(grep -m1 error <<<"$hdrs")"
        continue
    fi
    tr ' \\' '\n\n' <<<"$hdrs" | grep '^/usr/include/' | sort -u | comm -23 - "$allowed" | sed "s|^|$src: not on a bare image: |"
done | { grep . && bad=1; exit $bad; }
