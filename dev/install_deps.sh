#!/usr/bin/env bash
# Installs the Debian packages the CPU build and tests need: a C++ compiler,
# Python 3 (the launch rewriter), OpenBLAS and oneDNN (cuBLASLt on the CPU: oneDNN
# runs the bf16 matmuls on CPUs with bf16 instructions), Open MPI
# (NCCL on the CPU), Boost.Context (fibers), nlohmann-json (header-only JSON for the
# tokenizer and data tools), xxHash (checkpoint checksums; header-only), strace (test_resume.py kills inside a checkpoint
# write with it); then numpy and safetensors for the transformers import/export test and
# matplotlib for dev/plot_log.py (pip, when the python3 on PATH lacks them; optional),
# clang-format 19.1.7 for make format and make format-check (pip, when the one the Makefile
# finds is another version; optional: the check says SKIP without it), and where nvcc is present, cuobjdump and
# nvdisasm for dev/sass_report.py (pip wheels, when not found; optional).
# The CPU build compiles against the CUDA toolkit's headers: those of
# /usr/local/cuda (or CUDA_HOME) where it is installed; otherwise the same
# headers from NVIDIA's PyPI wheels (pinned to the toolkit the project builds
# with, CUDA 13.0), downloaded with pip and gathered into deps/cuda-headers/include,
# where the Makefile finds them. No GPU, driver or toolkit is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(build-essential python3 libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin libboost-context-dev nlohmann-json3-dev libxxhash-dev strace)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install_deps: all packages present"
else
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO=sudo
    echo "install_deps: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! python3 -c "import numpy, safetensors" 2>/dev/null; then
    echo "install_deps: installing numpy and safetensors (pip) for dev/export_hf.py, dev/import_hf.py and their test"
    python3 -m pip install -q numpy safetensors || echo "install_deps: safetensors not installed; test_hf.py will be skipped"
fi
if ! python3 -c "import matplotlib" 2>/dev/null; then
    echo "install_deps: installing matplotlib (pip) for dev/plot_log.py"
    python3 -m pip install -q matplotlib || echo "install_deps: matplotlib not installed; the plot test will be skipped"
fi
# pinned: another version lays the code out differently (dev/format_check.py --find: the Makefile's)
if ! "$(python3 dev/format_check.py --find)" --version 2>/dev/null | grep -q "version 19\.1\.7\b"; then
    echo "install_deps: installing clang-format 19.1.7 (pip) for make format and make format-check"
    python3 -m pip install -q clang-format==19.1.7 || echo "install_deps: clang-format 19.1.7 not installed; make format-check will be skipped"
fi
nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
if { command -v nvcc >/dev/null || [[ -x $nvcc ]]; } && ! python3 dev/sass_report.py --tools >/dev/null; then
    echo "install_deps: installing cuobjdump and nvdisasm (pip) for dev/sass_report.py"
    python3 -m pip install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm ||
        echo "install_deps: cuobjdump not installed; the SASS report will be skipped"
fi

# The wheels' include/ folders merged give what the CPU build includes from the
# toolkit: cuda_runtime_api.h and cuda_bf16.h (runtime, with crt/ and cccl's nv/),
# cublasLt.h (cublas) and nccl.h. Versions: those of the CUDA 13.0 toolkit
# (cudart 13.0.96, crt 13.0.88, cccl 3.0.1, cuBLAS 13.1.0.3, NCCL 2.28.9).
CUDA_HEADER_WHEELS=(nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85
                    nvidia-cublas==13.1.0.3 nvidia-nccl-cu13==2.28.9)
CUDA_HEADERS_DIR=deps/cuda-headers
gather_cuda_headers() {
    local wheels=$CUDA_HEADERS_DIR/wheels
    rm -rf "$CUDA_HEADERS_DIR" && mkdir -p "$wheels"
    python3 -m pip download -q --no-deps -d "$wheels" "${CUDA_HEADER_WHEELS[@]}" || return 1
    python3 - "$wheels" "$CUDA_HEADERS_DIR/include" <<'PY' || return 1
import os, sys, zipfile
wheels, dest = sys.argv[1], sys.argv[2]
for name in sorted(os.listdir(wheels)):
    with zipfile.ZipFile(os.path.join(wheels, name)) as whl:
        for entry in whl.infolist():
            parts = entry.filename.split("/")
            if "include" in parts[:-1] and not entry.is_dir():
                rel = "/".join(parts[parts.index("include") + 1:])
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                with open(os.path.join(dest, rel), "wb") as out:
                    out.write(whl.read(entry))
PY
    rm -rf "$wheels"
    echo "${CUDA_HEADER_WHEELS[*]}" >"$CUDA_HEADERS_DIR/wheels.txt"  # written last: a complete gathering
}
# GATHER_CUDA_HEADERS=1 (.ci/run): gather them beside a toolkit too, for
# test/test_pypi_headers.sh, which builds from them with the toolkit hidden.
toolkit=${CUDA_HOME:-/usr/local/cuda}/include
if [[ "$(cat "$CUDA_HEADERS_DIR/wheels.txt" 2>/dev/null)" == "${CUDA_HEADER_WHEELS[*]}" ]]; then
    echo "install_deps: CUDA headers already gathered in $CUDA_HEADERS_DIR/include"
elif [[ ! -f $toolkit/cuda_bf16.h ]]; then
    echo "install_deps: no CUDA toolkit at $toolkit; gathering its headers from PyPI (${CUDA_HEADER_WHEELS[*]}) into $CUDA_HEADERS_DIR/include"
    gather_cuda_headers || { echo "error: install_deps: pip could not download the CUDA header wheels ${CUDA_HEADER_WHEELS[*]}"; exit 1; }
elif [[ ${GATHER_CUDA_HEADERS:-0} == 1 ]]; then
    echo "install_deps: gathering the CUDA headers from PyPI into $CUDA_HEADERS_DIR/include (the build uses $toolkit)"
    gather_cuda_headers || echo "install_deps: the CUDA header wheels were not downloaded; test_pypi_headers.sh will skip its build"
else
    echo "install_deps: CUDA headers from $toolkit"
fi
