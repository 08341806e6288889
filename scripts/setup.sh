#!/usr/bin/env bash
# scripts/setup.sh — installs what bucketalloc needs to build and test on Debian 12, when missing.
# Debian packages: a C++20 compiler, CMake, Ninja, clang (libFuzzer, for fuzz/), clang-format (the tree's format), Abseil, GoogleTest, Google Benchmark, mimalloc
# (benchmark baseline), nlohmann-json, CLI11, zlib (gzip traces); Python 3 with venv, pip, setuptools and pytest (the
# PyTorch plugin and its tests); Chromium (html_report renders bucketalloc-bench's HTML report headless); Prometheus
# and curl (the metrics test scrapes a process with a real Prometheus and checks its output with promtool).
# The CUDA toolkit is expected at /usr/local/cuda (CUDA_HOME overrides); it is not a Debian package of the right version.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config clang clang-format libabsl-dev libgtest-dev libgmock-dev
          libbenchmark-dev libmimalloc-dev nlohmann-json3-dev libcli11-dev zlib1g-dev xz-utils
          python3 python3-venv python3-pip python3-setuptools python3-pytest chromium prometheus curl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cuda="${CUDA_HOME:-/usr/local/cuda}"
# The library needs the toolkit's headers only (it loads the driver at run time); the test programs
# of the LD_PRELOAD shim link the toolkit's shared libcudart.
if [[ ! -f "$cuda/include/cuda.h" || ! -f "$cuda/include/cuda_runtime_api.h" || ! -e "$cuda/lib64/libcudart.so" ]]; then
  echo "setup: the CUDA toolkit was not found at $cuda (need include/cuda.h, include/cuda_runtime_api.h and" \
       "lib64/libcudart.so); install CUDA 12 or 13 there or set CUDA_HOME" >&2
  exit 1
fi
echo "setup: dependencies present (CUDA toolkit at $cuda)"
