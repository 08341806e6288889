#!/usr/bin/env bash
# scripts/demo.sh — the main job: set up, build, and run the demo (a variable-length serving
# workload, plain best fit vs tiers). On the simulated device unless a CUDA device is usable.
# Extra arguments go to bucketalloc_demo (see --help).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="${CUDA_HOME:-/usr/local/cuda}" >/dev/null
ninja -C build/release -j"${JOBS:-2}" bucketalloc_demo
backend=sim
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then backend=cuda; fi
exec build/release/tools/bucketalloc_demo --backend "$backend" "$@"
