#!/bin/bash
# Every header of llmc/ compiles alone: for each, a unit that includes only it
# goes through the CPU build's pipeline (the preprocessor with the runtime's
# CUDA headers, cpu_cuda/cudapp.py's translation, g++ -fsyntax-only). A header
# that leans on what an includer happened to include before it, or on a name
# only a trainer defines, fails here. A planted header that uses std::vector
# without <vector> must fail too (the check can fail).
# usage: test_headers_alone.sh [header ...]   (default: every header under llmc/)
cd "$(dirname "$0")/.." || exit 1
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CUDA_INC=$CUDA_HOME/include
[[ -f $CUDA_INC/cuda_bf16.h ]] || CUDA_INC=deps/cuda-headers/include
CXX=${CXX:-g++}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/headers_alone.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0

# alone <header> <expected: pass|fail>: 0 when the outcome is the expected one
alone() {
    local unit="$WORK/$(echo "$1" | tr '/.' '__').cu"
    printf '#include "%s"\n' "$1" > "$unit"
    $CXX -std=c++17 -E -x c++ -Icpu_cuda/include -I"$CUDA_INC" -I. -DCPUCUDA "$unit" -o "$unit.pp" 2> "$unit.err" &&
        python3 cpu_cuda/cudapp.py "$unit.pp" "$unit.ii" 2>> "$unit.err" &&
        $CXX -std=c++17 -fsyntax-only -Wall -Wno-unknown-pragmas -Wno-unused-function -Wno-sign-compare \
            -x c++-cpp-output "$unit.ii" 2>> "$unit.err"
    local rc=$?
    if [[ ($2 == pass && $rc -eq 0) || ($2 == fail && $rc -ne 0) ]]; then
        echo "PASS $1 ($([[ $2 == pass ]] && echo "compiles alone" || echo "fails alone, as planted"))"
        passed=$((passed + 1))
    else
        echo "FAIL $1 (expected it to $2 alone)"
        head -5 "$unit.err"
        failed=$((failed + 1))
    fi
}

headers=("$@")
[[ ${#headers[@]} -eq 0 ]] && mapfile -t headers < <(find llmc -name '*.h' -o -name '*.cuh' | sort)
for h in "${headers[@]}"; do alone "$h" pass; done
if [[ $# -eq 0 ]]; then  # the planted failure: a header missing an include of its own
    mkdir -p "$WORK/planted"
    printf '#pragma once\ninline int planted_size() { std::vector<int> v(3); return (int)v.size(); }\n' \
        > "$WORK/planted/leans.h"
    alone "$WORK/planted/leans.h" fail
fi
echo "test_headers_alone: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
