#!/usr/bin/env bash
# Installs the Debian packages the CPU build and tests need: a C++ compiler,
# Python 3 (the launch rewriter), OpenBLAS (cuBLASLt on the CPU), Open MPI
# (NCCL on the CPU), Boost.Context (fibers), nlohmann-json (header-only JSON for the
# tokenizer and data tools). The CUDA toolkit is expected under
# /usr/local/cuda (or CUDA_HOME); it is not a Debian package.
set -euo pipefail
packages=(build-essential python3 libopenblas-dev libopenmpi-dev openmpi-bin libboost-context-dev nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install_deps: all packages present"
    exit 0
fi
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO=sudo
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
