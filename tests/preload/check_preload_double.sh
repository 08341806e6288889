#!/usr/bin/env bash
# tests/preload/check_preload_double.sh PROGRAM SHIM DOUBLE_DIR — the LD_PRELOAD shim through its
# real runtime lookup, on the CUDA double (tests/cuda_double) served as the process's libcudart:
# PROGRAM links the toolkit's libcudart.so.13 and LD_LIBRARY_PATH=DOUBLE_DIR makes the loader give
# it the double instead (the shim then finds the double with dlsym(RTLD_NEXT) and its backends load
# it as libcuda.so.1). Every scenario of tests/preload/preload_double_program.cc runs at CUDA driver
# versions 12.2 and 13.0, first without the shim (the double's own runtime: the scenario itself is
# right), then with it under backend:cuda and backend:vmm. `device1` has no run without the shim:
# there the side thread's cudaFree is the runtime's, which initializes device 0 (the thread's
# default device) as CUDA does; the shim serves that free itself and must not.
set -uo pipefail
program=$1; shim=$2; double_dir=$3
fail() { echo "check_preload_double: FAIL: $*"; exit 1; }
[[ -e $double_dir/libcudart.so.13 ]] || fail "no CUDA double in $double_dir"
for version in 12020 13000; do
  for scenario in exhaust device1 capture destroy perthread; do
    if [[ $scenario != device1 ]]; then
      out=$(CUDA_DOUBLE_DRIVER_VERSION=$version LD_LIBRARY_PATH="$double_dir" timeout 120 "$program" "$scenario" 2>&1) ||
        { echo "$out"; fail "$scenario at driver $version without the shim"; }
    fi
    for conf in backend:cuda backend:vmm; do
      out=$(CUDA_DOUBLE_DRIVER_VERSION=$version LD_LIBRARY_PATH="$double_dir" LD_PRELOAD="$shim" \
            BUCKETALLOC_CONF=$conf BUCKETALLOC_VERBOSE=1 timeout 120 "$program" "$scenario" 2>&1)
      rc=$?
      echo "$out" | grep -E "PASS|FAIL|exhaust:|destroy:" | sed "s/^/[driver $version, $conf] /"
      ((rc == 0)) || { echo "$out"; fail "$scenario at driver $version with the shim ($conf), exit $rc"; }
      grep -q "the allocator is not available" <<<"$out" && fail "the shim did not serve the program ($conf)"
    done
  done
done
echo "check_preload_double: every scenario passed at both driver versions, with and without the shim"
