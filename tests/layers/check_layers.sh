#!/usr/bin/env bash
# tests/layers/check_layers.sh — the build enforces the layers: a file of a layer compiles against
# its own include root and those of the layers below (CMakeLists.txt, bucketalloc_layer_root), so
# a header of its own layer or one below is found and a header of a layer above is not.
#
# Usage: check_layers.sh CXX LAYER_ROOT
#   CXX         the C++ compiler of the build
#   LAYER_ROOT  the build's include roots, one folder per layer (build/<type>/layers)
# Each probe compiles a one-line file (#include "<header>") with -fsyntax-only.
set -uo pipefail
cxx=$1
root=$2
failed=0
order=(internal backend memory pool frontend)

# The -I flags of `layer`: its root and every root below it.
flags_of() {
  local layer=$1 flags=()
  for l in "${order[@]}"; do
    flags+=(-I "$root/$l")
    [[ $l == "$layer" ]] && break
  done
  printf '%s\n' "${flags[@]}"
}

probe() {  # probe LAYER HEADER: 0 when the header compiles with LAYER's roots
  local layer=$1 header=$2
  mapfile -t flags < <(flags_of "$layer")
  printf '#include "%s"\n' "$header" | "$cxx" -std=c++20 -fsyntax-only "${flags[@]}" -x c++ - 2>/tmp/check_layers.$$
}

expect_found() {
  if probe "$1" "$2"; then
    echo "ok: layer $1 includes $2"
  else
    echo "FAIL: layer $1 cannot include $2, which is its own or below:"; cat /tmp/check_layers.$$
    failed=1
  fi
}

expect_refused() {
  if probe "$1" "$2"; then
    echo "FAIL: layer $1 includes $2, a header of a layer above, and it compiled"
    failed=1
  elif grep -q "No such file or directory" /tmp/check_layers.$$; then
    echo "ok: layer $1 cannot include $2 (not found)"
  else
    echo "FAIL: layer $1 including $2 failed, but not because the header is out of reach:"; cat /tmp/check_layers.$$
    failed=1
  fi
}

for l in "${order[@]}"; do
  [[ -d $root/$l ]] || { echo "FAIL: no include root $root/$l"; exit 1; }
done

# Each layer reaches its own headers and those below.
expect_found internal internal/live_map.h
expect_found internal bucketalloc/stat_types.h
expect_found backend backend/registry.h
expect_found backend bucketalloc/testing/sim_backend.h
expect_found memory memory/segment.h
expect_found memory internal/bits.h
expect_found pool pool/large_pool.h
expect_found pool bucketalloc/backend.h
expect_found frontend frontend/device_allocator.h
expect_found frontend bucketalloc/allocator.h

# Nothing above is in reach.
expect_refused internal bucketalloc/backend.h
expect_refused internal backend/registry.h
expect_refused backend memory/segment.h
expect_refused backend cuda/cuda_backend.h        # src/ never includes CUDA headers
expect_refused memory pool/large_pool.h
expect_refused memory bucketalloc/options.h
expect_refused pool frontend/device_allocator.h
expect_refused pool bucketalloc/options.h
expect_refused pool bucketalloc/stats.h
expect_refused pool bucketalloc/allocator.h
expect_refused frontend harness/replay.h
expect_refused frontend bucketalloc/bucketalloc.h  # the C ABI is a plugin

rm -f /tmp/check_layers.$$
[[ $failed -eq 0 ]] && echo "check_layers: every layer reaches only itself and the layers below"
exit $failed
