#!/usr/bin/env bash
# scripts/make_gpu_bundle.sh — builds the test binaries here and packs bundle/ for a lent GPU machine.
#
# Owns: the bundle that scripts/gpu_check.sh runs on the GPU machine, whose image has no Abseil,
# GoogleTest or Google Benchmark: bundle/bin (cuda_backend_test, every core *_test, and
# bucketalloc_microbench and bucketalloc_c_abi_bench when built, bucketalloc-bench,
# bucketalloc-measure-driver-costs, preload_probe and preload_kernel_check), bundle/lib
# (libbucketalloc.so.0, the C ABI PyTorch loads, libbucketalloc_preload.so, libcudart.so for the
# programs that link it, and the non-system shared libraries all of these load:
# Abseil, GoogleTest/GoogleMock, Google Benchmark, mimalloc, and any shared library of this
# build), bundle/gpu_check.sh and bundle/MANIFEST. The libraries load the CUDA driver at run time
# and link no cudart; only the preload programs and bucketalloc-measure-driver-costs link the
# toolkit's libcudart.so (it travels); the tests that run on the CUDA double (*_double_test) stay
# behind: on a GPU machine they would load the real libcuda.so.1 in its place. The system's
# libc/libstdc++ are not copied (the GPU image is newer, which is compatible).
# The bundle must stay within the device tool's 64 MiB carry limit: binaries and libraries are
# stripped when they would take more than 40 MiB, and bundle/bin travels as bundle/bin.tar.xz (each
# test binary links the whole core statically, so the ~50 of them share most of their bytes and
# compress about 9:1); gpu_check.sh unpacks it with Python's tarfile (no xz binary needed there).
#
# Usage (from anywhere; it works in the repo root):
#   bash scripts/make_gpu_bundle.sh           # build-gpu/, Release, -j2
#   BUILD_DIR=build-x JOBS=4 bash scripts/make_gpu_bundle.sh
# Then run on the GPU machine with carry ["bundle"]:  bash scripts/gpu_check.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-2}
BUNDLE=${BUNDLE:-bundle}
LIMIT_BYTES=$((64 * 1024 * 1024))
# Leave headroom under the 64 MiB carry limit for the rest of the working tree.
STRIP_ABOVE_BYTES=${STRIP_ABOVE_BYTES:-$((40 * 1024 * 1024))}

if command -v ninja >/dev/null 2>&1; then GENERATOR=Ninja; else GENERATOR="Unix Makefiles"; fi
if [[ -f $BUILD_DIR/CMakeCache.txt ]]; then
  # Keep the generator of an existing build directory (cmake refuses to switch it).
  GENERATOR=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$BUILD_DIR/CMakeCache.txt")
fi

echo "== configure $BUILD_DIR ($GENERATOR, Release)"
cmake -S . -B "$BUILD_DIR" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release \
  -DBUCKETALLOC_BUILD_TESTS=ON -DBUCKETALLOC_BUILD_BENCH=ON
echo "== build (-j$JOBS)"
cmake --build "$BUILD_DIR" -j "$JOBS"

# ---- the binaries
CUDA_TEST=$BUILD_DIR/tests/cuda/cuda_backend_test
if [[ ! -x $CUDA_TEST ]]; then
  echo "make_gpu_bundle: $CUDA_TEST was not built" >&2
  exit 1
fi
mapfile -t TESTS < <(find "$BUILD_DIR/tests" -type f -name '*_test' ! -name '*_double_test' -perm -u+x | sort)
BINARIES=("${TESTS[@]}")
mapfile -t BENCH < <(find "$BUILD_DIR/bench" -type f -name 'bucketalloc_*bench' -perm -u+x | sort)
BINARIES+=("${BENCH[@]}")
# The benchmark harness (gpu_check's replay_pytorch step).
if [[ ! -x $BUILD_DIR/tools/bucketalloc-bench ]]; then
  echo "make_gpu_bundle: $BUILD_DIR/tools/bucketalloc-bench was not built" >&2
  exit 1
fi
BINARIES+=("$BUILD_DIR/tools/bucketalloc-bench")
# Each CUDA driver call's cost on the GPU (gpu_check's driver_costs step); built with the toolkit's libcudart.
if [[ ! -x $BUILD_DIR/tools/bucketalloc-measure-driver-costs ]]; then
  echo "make_gpu_bundle: $BUILD_DIR/tools/bucketalloc-measure-driver-costs was not built" >&2
  exit 1
fi
BINARIES+=("$BUILD_DIR/tools/bucketalloc-measure-driver-costs")
# The LD_PRELOAD drop-in's programs (the kernel check needs nvcc; CMake builds it when nvcc works).
for program in preload_probe preload_kernel_check preload_double_program; do
  if [[ ! -x $BUILD_DIR/tests/$program ]]; then
    echo "make_gpu_bundle: $BUILD_DIR/tests/$program was not built" >&2
    exit 1
  fi
  BINARIES+=("$BUILD_DIR/tests/$program")
done
SHARED_LIB=$BUILD_DIR/lib/libbucketalloc.so.0
PRELOAD_LIB=$BUILD_DIR/lib/libbucketalloc_preload.so
for lib in "$SHARED_LIB" "$PRELOAD_LIB"; do
  if [[ ! -e $lib ]]; then
    echo "make_gpu_bundle: $lib was not built" >&2
    exit 1
  fi
done

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
declare -A SEEN=()
for bin in "${BINARIES[@]}"; do
  name=$(basename "$bin")
  if [[ -n ${SEEN[$name]:-} ]]; then
    echo "make_gpu_bundle: two binaries named $name (${SEEN[$name]} and $bin)" >&2
    exit 1
  fi
  SEEN[$name]=$bin
  cp "$bin" "$BUNDLE/bin/$name"
done

# ---- the shared libraries they need that the GPU image lacks
# ldd lines look like "libabsl_status.so.20220623 => /lib/x86_64-linux-gnu/libabsl_... (0x...)";
# copy under the soname (the left side), following symlinks.
wanted_lib() {
  local soname=$1 path=$2
  # libcudart.so travels too: the preload programs link it dynamically (the image may lack it).
  [[ $soname =~ absl|gtest|gmock|benchmark|mimalloc|bucketalloc|libcudart ]] && return 0
  [[ $path == "$ROOT"/* ]] && return 0  # a shared library of this build
  return 1
}
missing=0
cp -L "$SHARED_LIB" "$BUNDLE/lib/libbucketalloc.so.0"
cp -L "$PRELOAD_LIB" "$BUNDLE/lib/libbucketalloc_preload.so"
for bin in "$BUNDLE"/bin/* "$BUNDLE/lib/libbucketalloc.so.0" "$BUNDLE/lib/libbucketalloc_preload.so"; do
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    if [[ $path == "not" ]]; then
      echo "make_gpu_bundle: $(basename "$bin") needs $soname, which is not found here" >&2
      missing=1
      continue
    fi
    if wanted_lib "$soname" "$path" && [[ ! -e $BUNDLE/lib/$soname ]]; then
      cp -L "$path" "$BUNDLE/lib/$soname"
    fi
  done < <(ldd "$bin")
done
((missing == 0)) || exit 1

cp scripts/gpu_check.sh "$BUNDLE/gpu_check.sh"
# The self-contained wheel (docs/install.md), installed on the GPU machine by gpu_check.sh's wheel step.
wheel=$(scripts/build_wheel.sh | tail -1) || { echo "make_gpu_bundle: scripts/build_wheel.sh failed" >&2; exit 1; }
cp "$wheel" "$BUNDLE/"

bundle_bytes() { du -sb "$BUNDLE" | cut -f1; }
if (($(bundle_bytes) > STRIP_ABOVE_BYTES)); then
  echo "== stripping (bundle is $(($(bundle_bytes) / 1024 / 1024)) MiB)"
  strip --strip-unneeded "$BUNDLE"/bin/* "$BUNDLE"/lib/* 2>/dev/null || true
fi

{
  echo "bucketalloc GPU bundle (bin/ is packed as bin.tar.xz)"
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo none)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)')"
  echo "build: $BUILD_DIR (Release)"
  echo
  (cd "$BUNDLE" && find . -type f ! -name MANIFEST -printf '%s\t%p\n' | sort -k2)
} >"$BUNDLE/MANIFEST"

unpacked=$(bundle_bytes)
ls "$BUNDLE/bin"
echo "== packing $BUNDLE/bin into $BUNDLE/bin.tar.xz"
tar -C "$BUNDLE" -cf - bin | xz -T"$JOBS" -6 >"$BUNDLE/bin.tar.xz"
rm -rf "$BUNDLE/bin"
size=$(bundle_bytes)
echo "== $BUNDLE/: ${#BINARIES[@]} binaries, $(find "$BUNDLE/lib" -type f | wc -l) libraries," \
  "$((size / 1024)) KiB ($((size / 1024 / 1024)) MiB; limit 64 MiB; $((unpacked / 1024 / 1024)) MiB unpacked)"
if ((size > LIMIT_BYTES)); then
  echo "make_gpu_bundle: $BUNDLE/ is over the 64 MiB carry limit" >&2
  exit 1
fi
echo "run on the GPU machine with carry [\"$BUNDLE\"]:  bash scripts/gpu_check.sh"
