#!/usr/bin/env bash
# tests/harness/check_harness_rooms.sh — the build enforces the harness's rooms (src/harness/<room>,
# CMakeLists.txt's harness section): a file of a room compiles with the include paths of its CMake
# target (CMake writes them to LAYER_ROOT/harness_<room>.include_dirs), so its own headers, those of
# the rooms it uses and the public bucketalloc/*.h are found; a room it does not use, the library's
# internal headers (src/internal, backend, memory, pool, frontend) and the layers' other roots are
# not, except the replay room's one named internal interface, frontend/observability/oom_diagnosis.h. And no
# harness source reaches around them with "../", and none includes an internal header but that one.
#
# Usage: check_harness_rooms.sh CXX LAYER_ROOT SOURCE_DIR
# Each probe preprocesses a one-line file (#include "<header>"): tests/layers/include_probes.sh.
set -uo pipefail
cxx=$1
root=$2
source_dir=$3
kind=room
prefix=harness_
# shellcheck source=tests/layers/include_probes.sh
source "$(dirname "${BASH_SOURCE[0]}")/../layers/include_probes.sh"

rooms=(replay workload reports operations planning)
expect_include_dirs "${rooms[@]}"

# Each room reaches its own headers, those of the rooms it uses, and the public headers.
expect_found replay harness/replay/replay.h
expect_found replay harness/replay/pytorch_model.h
expect_found replay bucketalloc/testing/sim_backend.h
expect_found workload harness/workload/serving.h
expect_found workload harness/replay/trace.h
expect_found reports harness/reports/report.h
expect_found reports harness/reports/page.h
expect_found operations harness/operations/doctor.h
expect_found operations harness/replay/replay.h
expect_found operations harness/reports/page.h
expect_found planning harness/planning/planner.h
expect_found planning harness/workload/serving.h
expect_found planning harness/replay/policies.h
expect_found planning harness/reports/page.h
# The one named internal interface, of the replay room only.
expect_found replay frontend/observability/oom_diagnosis.h
for r in workload reports operations planning; do expect_refused "$r" frontend/observability/oom_diagnosis.h; done

# Not a room it does not use.
expect_refused replay harness/workload/serving.h
expect_refused replay harness/reports/page.h
expect_refused replay harness/operations/doctor.h
expect_refused replay harness/planning/planner.h
expect_refused workload harness/reports/page.h
expect_refused workload harness/planning/planner.h
expect_refused reports harness/workload/serving.h
expect_refused reports harness/operations/doctor.h
expect_refused operations harness/planning/planner.h
expect_refused operations harness/workload/serving.h
expect_refused planning harness/operations/doctor.h

# No room reaches the library's internal headers (nor another header of src/frontend).
for r in "${rooms[@]}"; do
  expect_refused "$r" internal/bits.h
  expect_refused "$r" backend/registry.h
  expect_refused "$r" memory/segment.h
  expect_refused "$r" pool/large_pool.h
  expect_refused "$r" frontend/core/device_allocator.h
  expect_refused "$r" workload/kv_workload.h
done

# The sources: no "../" include, and no internal include but the named interface in replay.cc.
if grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"\.\./' "$source_dir/src/harness"; then
  echo "FAIL: a harness source includes with \"../\" (above)"
  failed=1
fi
internal=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"(internal|frontend|backend|pool|memory|cuda)/' \
  "$source_dir/src/harness" | grep -v '/src/harness/replay/replay.cc:[0-9]*:#include "frontend/observability/oom_diagnosis.h"')
if [[ -n $internal ]]; then
  echo "FAIL: a harness source includes an internal header that is not its named interface:"
  echo "$internal"
  failed=1
fi

((failed == 0)) && echo "check_harness_rooms: PASS" || echo "check_harness_rooms: FAIL"
exit $failed
