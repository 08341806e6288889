#!/usr/bin/env bash
# tests/layers/check_layers.sh — the build enforces the layers: a file of a layer compiles with the
# include paths of its CMake target (its own include root and those of the layers it links; CMake
# writes them to LAYER_ROOT/<layer>.include_dirs), so a header of its own layer or one below is
# found and a header of a layer above is not; and no source reaches around them with "../".
#
# Usage: check_layers.sh CXX LAYER_ROOT SOURCE_DIR
#   CXX         the C++ compiler of the build
#   LAYER_ROOT  the build's include roots, one folder per layer (build/<type>/layers)
#   SOURCE_DIR  the repository (its src/ and cuda/ are searched for "../" includes)
# Each probe preprocesses a one-line file (#include "<header>"): tests/layers/include_probes.sh.
set -uo pipefail
cxx=$1
root=$2
source_dir=$3
kind=layer
prefix=""
# shellcheck source=tests/layers/include_probes.sh
source "$(dirname "${BASH_SOURCE[0]}")/include_probes.sh"

expect_include_dirs internal backend cuda memory pool frontend_observability frontend_bookkeeping frontend_core

# Each layer reaches its own headers and those below.
expect_found internal internal/live_map.h
expect_found internal bucketalloc/stat_types.h
expect_found backend backend/registry.h
expect_found backend bucketalloc/testing/sim_backend.h
expect_found cuda cuda/cuda_backend.h
expect_found memory memory/segment.h
expect_found memory internal/bits.h
expect_found pool pool/large_pool.h
expect_found pool bucketalloc/backend.h
expect_found frontend_observability frontend/observability/oom_diagnosis.h
expect_found frontend_observability bucketalloc/stats.h
expect_found frontend_observability pool/pool.h
expect_found frontend_bookkeeping frontend/bookkeeping/tenants.h
expect_found frontend_bookkeeping frontend/observability/history.h
expect_found frontend_core frontend/core/device_allocator.h
expect_found frontend_core frontend/bookkeeping/pools.h
expect_found frontend_core bucketalloc/allocator.h

# Nothing above is in reach.
expect_refused internal bucketalloc/backend.h
expect_refused internal backend/registry.h
expect_refused backend memory/segment.h
expect_refused backend cuda/cuda_backend.h        # src/ never includes CUDA headers
expect_refused cuda memory/segment.h
expect_refused memory pool/large_pool.h
expect_refused memory bucketalloc/options.h
expect_refused pool frontend/core/device_allocator.h
expect_refused pool bucketalloc/options.h
expect_refused pool bucketalloc/stats.h
expect_refused pool bucketalloc/allocator.h
expect_refused frontend_observability frontend/bookkeeping/tenants.h
expect_refused frontend_observability frontend/core/device_allocator.h
expect_refused frontend_observability bucketalloc/allocator.h
expect_refused frontend_bookkeeping frontend/core/device_allocator.h
expect_refused frontend_bookkeeping bucketalloc/allocator.h
expect_refused frontend_core harness/replay/replay.h
expect_refused frontend_core bucketalloc/bucketalloc.h  # the C ABI is a plugin

# The front end's rooms, every header: found by its own room (so by the rooms above, which link
# it), refused by the rooms below and the pool layer.
rooms=(observability bookkeeping core)
for ((i = 0; i < ${#rooms[@]}; ++i)); do
  for header in "$source_dir/src/frontend/${rooms[i]}"/*.h; do
    name=frontend/${rooms[i]}/$(basename "$header")
    expect_found "frontend_${rooms[i]}" "$name"
    for ((j = 0; j < i; ++j)); do expect_refused "frontend_${rooms[j]}" "$name"; done
    expect_refused pool "$name"
  done
done

# A relative include with ".." resolves from the including file's own folder, around the include
# paths: none is allowed in the layers.
if up=$(grep -rnE '#include +"[^"]*\.\./' "$source_dir/src" "$source_dir/cuda"); then
  echo "FAIL: includes that reach around the layers with \"../\":"; echo "$up"
  failed=1
else
  echo "ok: no \"../\" include in src/ or cuda/"
fi

[[ $failed -eq 0 ]] && echo "check_layers: every layer reaches only itself and the layers below"
exit $failed
