#!/usr/bin/env bash
# scripts/check_install.sh — checks that the installed package works for a consumer:
#   1. builds the library (Release; tests, benchmarks and tools off) into build-install/, or takes
#      the build tree BUILD_DIR names as it is (scripts/test.sh: the one its tests ran from, so CI
#      compiles the library once less; the install rules do not depend on the build type or on
#      what else the tree builds),
#   2. installs it into a temporary prefix,
#   3. configures, builds and runs examples/consumer against that prefix (find_package(bucketalloc)):
#      a C++ program on bucketalloc::bucketalloc and a C program on bucketalloc::c_abi.
# Prints "install check: PASS" at the end; any failure exits non-zero.
# Environment: JOBS (parallel build jobs, default 2), KEEP_PREFIX=1 keeps the temporary prefix,
# BUILD_DIR (a configured and built tree of this repository; default: build-install/, built here).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
jobs="${JOBS:-2}"
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

work="$(mktemp -d "${TMPDIR:-/tmp}/bucketalloc-install-check.XXXXXX")"
prefix="$work/prefix"
cleanup() {
  if [[ "${KEEP_PREFIX:-0}" == 1 ]]; then
    echo "install check: kept $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

build="${BUILD_DIR:-}"
if [[ -z $build ]]; then
  build=build-install
  echo "== configure and build the library ($build/)"
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUCKETALLOC_BUILD_TESTS=OFF -DBUCKETALLOC_BUILD_BENCH=OFF -DBUCKETALLOC_BUILD_TOOLS=OFF
else
  [[ -f $build/CMakeCache.txt ]] || {
    echo "check_install.sh: BUILD_DIR=$build is not a configured build tree (no CMakeCache.txt); accepted: a" \
         "tree configured from this repository, e.g. build/release, or BUILD_DIR unset to build one" >&2
    exit 1
  }
  echo "== the library as built in $build/ (brought up to date)"
fi
cmake --build "$build" -j "$jobs"

echo "== install into $prefix"
cmake --install "$build" --prefix "$prefix"

echo "== configure and build examples/consumer against the installed package"
cmake -S examples/consumer -B "$work/consumer-build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix"
cmake --build "$work/consumer-build" -j "$jobs"

echo "== run the consumers (C++ library, C ABI)"
"$work/consumer-build/bucketalloc_consumer"
"$work/consumer-build/bucketalloc_c_consumer"

echo "install check: PASS"
