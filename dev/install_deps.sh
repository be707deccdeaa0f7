#!/usr/bin/env bash
# Installs the Debian packages the CPU build and tests need: a C++ compiler,
# Python 3 (the launch rewriter), OpenBLAS (cuBLASLt on the CPU), Open MPI
# (NCCL on the CPU), Boost.Context (fibers), nlohmann-json (header-only JSON for the
# tokenizer and data tools), xxHash (checkpoint checksums; header-only), strace (test_resume.py kills inside a checkpoint
# write with it); then numpy and safetensors for the transformers import/export test and
# matplotlib for dev/plot_log.py (pip, when the python3 on PATH lacks them; optional), and
# where nvcc is present, cuobjdump and
# nvdisasm for dev/sass_report.py (pip wheels, when not found; optional). The
# CUDA toolkit is expected under /usr/local/cuda (or CUDA_HOME); it is not a
# Debian package.
set -euo pipefail
packages=(build-essential python3 libopenblas-dev libopenmpi-dev openmpi-bin libboost-context-dev nlohmann-json3-dev libxxhash-dev strace)
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
nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
if { command -v nvcc >/dev/null || [[ -x $nvcc ]]; } && ! python3 "$(dirname "$0")/sass_report.py" --tools >/dev/null; then
    echo "install_deps: installing cuobjdump and nvdisasm (pip) for dev/sass_report.py"
    python3 -m pip install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm ||
        echo "install_deps: cuobjdump not installed; the SASS report will be skipped"
fi
