#!/usr/bin/env bash
# The CPU build without the CUDA toolkit: CUDA_HOME points at an empty folder
# and build/cpu-pypi takes the toolkit's headers only from those that
# dev/install_deps.sh gathers from NVIDIA's PyPI wheels (CUDA_HEADERS_DIR).
# Builds the trainer and test_layernorm, runs test_layernorm, and checks that
# no header came from anywhere but the project, the gathered folder and the
# system's /usr/include and /usr/lib (a toolkit copied under /usr/local/include,
# which g++ searches by default, would otherwise go unnoticed). Without the
# gathered headers the build must stop with one error line naming install_deps.
set -u
cd "$(dirname "$0")/.."
source test/check.sh

headers=${CUDA_HEADERS_DIR:-deps/cuda-headers/include}
work=build/pypi-headers-test
rm -rf "$work" && mkdir -p "$work/no-toolkit" "$work/no-headers"
hidden=(CUDA_HOME="$PWD/$work/no-toolkit" CUDA_HEADERS_DIR="$headers")
programs=(build/cpu-pypi/train_gpt build/cpu-pypi/test_layernorm)

make -s "${hidden[@]}" CUDA_HEADERS_DIR="$work/no-headers" "${programs[@]}" >"$work/no-headers.log" 2>&1
rc=$?
check "no toolkit and no gathered headers: make fails" test $rc -ne 0
check "... with one error line that says to run dev/install_deps.sh" \
    test "$(grep -c '^error: cuda_bf16.h is in neither .*run dev/install_deps.sh' "$work/no-headers.log")" -eq 1

if [[ ! -f $headers/cuda_bf16.h ]]; then
    echo "SKIP the build from PyPI headers: $headers has no cuda_bf16.h (dev/install_deps.sh gathers it where no toolkit is installed, or with GATHER_CUDA_HEADERS=1)"
    tally test_pypi_headers
fi

make -n -B "${hidden[@]}" "${programs[@]}" >"$work/commands.log" 2>&1
check "every compile line takes the CUDA headers from $headers and none from a toolkit" \
    bash -c "grep -q -- '-I$headers ' $work/commands.log && ! grep -E -- '-I[^ ]*(/usr/local|$work/no-toolkit)' $work/commands.log"
rm -rf build/cpu-pypi  # built afresh each run: a unit left from another header folder would pass unbuilt
make -j2 "${hidden[@]}" "${programs[@]}" >"$work/build.log" 2>&1
rc=$?
check "train_gpt and test_layernorm build with the toolkit hidden" test $rc -eq 0
[[ $rc -ne 0 ]] && tail -n 15 "$work/build.log" | sed 's/^/    /'

# every file the preprocessor read, from the line markers of the units
grep -ho '^# [0-9]* "[^"<]*"' build/cpu-pypi/train_gpt.ii build/cpu-pypi/test_layernorm.ii |
    sed -E 's/^# [0-9]+ "(.*)"$/\1/' | sort -u >"$work/headers.txt"
grep -vE "^(\./|[a-z]|$headers/|/usr/include/|/usr/lib/)" "$work/headers.txt" >"$work/foreign.txt"
check "no header from outside the project, $headers and the system" test ! -s "$work/foreign.txt"
sed 's/^/    foreign header: /' "$work/foreign.txt" | head -n 5
for h in cuda_runtime_api.h cuda_bf16.h cublasLt.h nccl.h; do
    check "$h read from $headers" grep -qx "$headers/$h" "$work/headers.txt"
done

timeout $((300 * ${TEST_TIMEOUT_SCALE:-1})) build/cpu-pypi/test_layernorm >"$work/test_layernorm.log" 2>&1
check "build/cpu-pypi/test_layernorm passes" grep -qE '^test_layernorm: [1-9][0-9]* passed, 0 failed$' "$work/test_layernorm.log"

# Where the toolkit is installed too: the same units preprocessed by the same
# rule from the toolkit's headers (the header paths in the line markers aside).
toolkit=${CUDA_HOME:-/usr/local/cuda}/include
units=(test_layernorm train_gpt)
if [[ -f $toolkit/cuda_bf16.h ]]; then
    targets=()
    for unit in "${units[@]}"; do cp "build/cpu-pypi/$unit.ii" "$work/$unit.pypi.ii"; targets+=("build/cpu-pypi/$unit.ii"); done
    make -s -B CUDA_HEADERS_DIR="$toolkit" "${targets[@]}" >"$work/toolkit-units.log" 2>&1
    strip() { sed -E "s#\"($toolkit|$headers)/#\"CUDA/#" "$1"; }
    for unit in "${units[@]}"; do
        check "$unit preprocesses to the same unit from $toolkit and from $headers" \
            cmp <(strip "build/cpu-pypi/$unit.ii") <(strip "$work/$unit.pypi.ii")
    done
else
    echo "SKIP the comparison with the toolkit's preprocessed units: no toolkit at $toolkit"
fi
tally test_pypi_headers
