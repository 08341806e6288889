#!/usr/bin/env bash
# scripts/test.sh — set up, build and run every test:
#   1. RelWithDebInfo, as the wheel and the benchmarks are built: the benchmark harness's tests, the
#      command-line checks, the checks of the sources (layers, rooms) and of the built products
#      (exports, the C host, Prometheus, the LD_PRELOAD shim, the CUDA double's programs), not the
#      library's own suites (BUCKETALLOC_BUILD_LIBRARY_TESTS=OFF), which step 2 runs;
#   2. the library's suites under AddressSanitizer + UndefinedBehaviorSanitizer, built without NDEBUG
#      so that invariants are checked after every slow-path event: every test but the benchmark
#      harness's (BUCKETALLOC_BUILD_HARNESS=OFF; the fuzzers of step 3 run its readers and replays
#      under the same sanitizers);
#   3. the libFuzzer targets of fuzz/ (clang, ASan+UBSan), each for FUZZ_SECONDS (default 20) from its
#      seed corpus (scripts/fuzz.sh);
#   4. the concurrency stress test under ThreadSanitizer;
#   5. the Python package as a GPU server installs it (scripts/test_python.sh): the self-contained
#      wheel (scikit-build-core, auditwheel) in a fresh venv with the real torch, its pytest suite
#      run from the installed copy with the system's Abseil hidden, bucketalloc-bench and the
#      bucketalloc-preload launcher from the venv's bin/;
#   6. the installed package (step 1's tree, installed): examples/consumer built with
#      find_package(bucketalloc);
#   7. the format: every C, C++ and CUDA file as .clang-format says (scripts/format.sh --check).
# Ends with "N passed, N failed". Environment: JOBS (default 2), FUZZ_SECONDS (default 20).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh || exit 1
jobs="${JOBS:-2}"
cuda=(-DCUDAToolkit_ROOT="${CUDA_HOME:-/usr/local/cuda}")
passed=0
failed=0
step() {  # step NAME COMMAND...
  local name="$1"; shift
  echo "=== $name"
  local start=$SECONDS
  if "$@"; then
    passed=$((passed + 1)); echo "=== $name: PASS ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1)); echo "=== $name: FAIL ($((SECONDS - start)) s)"
  fi
}

# Debug information: line tables (-g1), which every failure's stack trace and the sanitizers' reports
# need, not the variables' (-g), whose generation took about a third of each build's compile time.
build_release() {
  cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cuda[@]}" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DBUCKETALLOC_BUILD_LIBRARY_TESTS=OFF >/dev/null &&
    ninja -C build/release -j"$jobs"
}
test_release() { ctest --test-dir build/release -j"$jobs" --output-on-failure; }

# ASan+UBSan at -O1, as the fuzzers (AddressSanitizer's own advice for reasonable speed): a test file
# compiles in about 40% of its -O2 -g time, and the suite runs a little slower. The tests' own code
# at -O0 (but the few whose own code does the work: tests/CMakeLists.txt), half the compile time.
build_asan() {
  cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cuda[@]}" \
    -DBUCKETALLOC_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DBUCKETALLOC_TEST_OPTIMIZATION=0 \
    -DBUCKETALLOC_BUILD_BENCH=OFF -DBUCKETALLOC_BUILD_TOOLS=OFF -DBUCKETALLOC_BUILD_HARNESS=OFF >/dev/null &&
    ninja -C build/asan -j"$jobs"
}
test_asan() {
  ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan -j"$jobs" --output-on-failure
}

build_tsan() {
  cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cuda[@]}" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DBUCKETALLOC_SANITIZE=thread -DBUCKETALLOC_BUILD_BENCH=OFF -DBUCKETALLOC_BUILD_TOOLS=OFF >/dev/null &&
    ninja -C build/tsan -j"$jobs" concurrency_test
}
test_tsan() { TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 build/tsan/tests/concurrency_test; }

step "build (RelWithDebInfo)" build_release
step "tests (RelWithDebInfo)" test_release
step "Python wheel in a clean venv (pytest with the real torch, bench, preload launcher)" scripts/test_python.sh
step "build (ASan+UBSan, invariant checks on)" build_asan
step "tests (ASan+UBSan)" test_asan
step "fuzzers (libFuzzer, ${FUZZ_SECONDS:-20} s per target)" scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
step "build (TSan)" build_tsan
step "concurrency stress (TSan)" test_tsan
step "installed package (examples/consumer)" env BUILD_DIR=build/release scripts/check_install.sh
step "format (clang-format)" scripts/format.sh --check
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
