#!/usr/bin/env bash
# scripts/gpu_check.sh — the one prepared command for a lent GPU machine.
#
# Owns: the list of checks run on a real GPU, each a step with its own timeout inside one overall
# budget, and the summary ("step <name>: PASS|FAIL (seconds)" per step, then
# "gpu_check: N passed, M failed"). Exits non-zero when any step failed.
# Needs bundle/ (made here by scripts/make_gpu_bundle.sh, carried as ["bundle"]): the binaries in
# bundle/bin (packed as bundle/bin.tar.xz, unpacked here on the first run) and their libraries in
# bundle/lib. BUCKETALLOC_EXPECT_GPU=1 makes a missing GPU a failure in the tests, never a skip.
#
# Usage, from the repo root on the GPU machine:
#   bash scripts/gpu_check.sh
# Environment: GPU_CHECK_BUDGET_S (overall budget, default 480 s), BUNDLE (default bundle),
# GPU_CHECK_LOG_DIR (where gpu_check.log, every step's output, and cuda_backend_test.xml go; default
# $OUT/gpu_check when $OUT is set, so they come back from the device tool, else /tmp/gpu_check).
#
# Adding a check: append a `run_step <name> <timeout_s> <command...>` line in the steps section.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2  # the repo root (also when run as bundle/gpu_check.sh)
BUNDLE=${BUNDLE:-bundle}
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}

if [[ ! -d $BUNDLE/bin && -f $BUNDLE/bin.tar.xz ]]; then
  # Python's tarfile reads xz itself, so the GPU image needs no xz binary.
  python3 - "$BUNDLE/bin.tar.xz" "$BUNDLE" <<'PY' || { echo "gpu_check: could not unpack $BUNDLE/bin.tar.xz"; exit 2; }
import sys, tarfile
with tarfile.open(sys.argv[1]) as archive:
    try:
        archive.extractall(sys.argv[2], filter="data")
    except TypeError:  # a Python without extraction filters
        archive.extractall(sys.argv[2])
PY
fi
if [[ ! -d $BUNDLE/bin ]]; then
  echo "gpu_check: $PWD/$BUNDLE/bin is missing."
  echo "  Make it on the build machine with: bash scripts/make_gpu_bundle.sh"
  echo "  and carry it to the GPU machine (the device tool's carry: [\"$BUNDLE\"])."
  exit 2
fi

export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BUCKETALLOC_EXPECT_GPU=1
unset BUCKETALLOC_CONF
if [[ -n ${OUT:-} ]]; then LOG_DIR=${GPU_CHECK_LOG_DIR:-$OUT/gpu_check}; else LOG_DIR=${GPU_CHECK_LOG_DIR:-/tmp/gpu_check}; fi
mkdir -p "$LOG_DIR"
LOG=$LOG_DIR/gpu_check.log
: >"$LOG"

START_S=$SECONDS
STEP_LINES=()
PASSED=0
FAILED=0

# run_step NAME TIMEOUT_S CMD...: runs CMD with a timeout (cut to what is left of the budget),
# appends its output to $LOG and records PASS (exit 0) or FAIL.
run_step() {
  local name=$1 timeout_s=$2
  shift 2
  local left=$((BUDGET_S - (SECONDS - START_S)))
  echo | tee -a "$LOG"
  echo "=== step $name (timeout ${timeout_s}s, ${left}s of the budget left): $*" | tee -a "$LOG"
  if ((left < 5)); then
    echo "gpu_check: no time left in the ${BUDGET_S}s budget; $name not run"
    STEP_LINES+=("step $name: FAIL (0s, not run: budget spent)")
    FAILED=$((FAILED + 1))
    return
  fi
  ((timeout_s > left)) && timeout_s=$left
  local t0=$SECONDS rc
  timeout --kill-after=10 "$timeout_s" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0)) note=""
  if ((rc == 124 || rc == 137)); then note=", timed out after ${timeout_s}s"; fi
  if ((rc == 0)); then
    STEP_LINES+=("step $name: PASS (${took}s)")
    PASSED=$((PASSED + 1))
  else
    STEP_LINES+=("step $name: FAIL (${took}s, exit $rc$note)")
    FAILED=$((FAILED + 1))
  fi
}

# ---- the machine
echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n); budget ${BUDGET_S}s; logs in $LOG_DIR"
[[ -f $BUNDLE/MANIFEST ]] && head -n 4 "$BUNDLE/MANIFEST"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 20 nvidia-smi -L
  timeout 20 nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
else
  echo "gpu_check: nvidia-smi not found"
fi

# ---- the steps
# 1. The cudaMalloc and vmm backends and the allocator with backend:cuda and backend:vmm on the
#    device (tests/cuda/cuda_backend_test.cc; a missing GPU fails it).
if [[ -x $BUNDLE/bin/cuda_backend_test ]]; then
  run_step cuda_backend_test 120 "$BUNDLE/bin/cuda_backend_test" --gtest_brief=1 \
    "--gtest_output=xml:$LOG_DIR/cuda_backend_test.xml"
else
  STEP_LINES+=("step cuda_backend_test: FAIL (0s, $BUNDLE/bin/cuda_backend_test missing)")
  FAILED=$((FAILED + 1))
fi

# 2. The core tests (sim backend), on this machine's CPUs and libraries, with default options.
# c_abi_test drives the process-wide allocator of the C ABI: each of its tests needs a fresh process
# (as ctest runs them), so run_each_test runs them one by one.
run_each_test() {  # run_each_test BINARY: every test of a gtest binary in its own process
  local bin=$1 suite="" line test failed=0
  while IFS= read -r line; do
    if [[ $line != " "* ]]; then suite=${line%% *}; continue; fi
    test=${line#  }
    test=${test%% *}
    "$bin" --gtest_brief=1 "--gtest_filter=$suite$test" || failed=1
  done < <("$bin" --gtest_list_tests)
  return $failed
}
for test_bin in "$BUNDLE"/bin/*_test; do
  [[ -x $test_bin ]] || continue
  name=$(basename "$test_bin")
  [[ $name == cuda_backend_test ]] && continue
  if [[ $name == c_abi_test ]]; then
    run_step "$name" 60 bash -c "$(declare -f run_each_test); run_each_test \"\$0\"" "$test_bin"
  else
    run_step "$name" 60 "$test_bin" --gtest_brief=1
  fi
done

# 3. A short run of the micro-benchmarks (the C ABI's cost over the C++ call it wraps included).
if [[ -x $BUNDLE/bin/bucketalloc_microbench ]]; then
  run_step bucketalloc_microbench 90 "$BUNDLE/bin/bucketalloc_microbench" \
    --benchmark_min_time=0.05
fi
if [[ -x $BUNDLE/bin/bucketalloc_c_abi_bench ]]; then
  run_step bucketalloc_c_abi_bench 30 "$BUNDLE/bin/bucketalloc_c_abi_bench" --benchmark_min_time=0.1
fi

# 4. The LD_PRELOAD drop-in on the GPU (tests/preload/preload_kernel_check.cu): buffers freed with
#    cudaFreeAsync on another stream while a slow kernel still reads them must not be handed out
#    again early (0 bad words), and the negative control (freed on the wrong stream, a program bug)
#    must show bad words, which proves the check can see early reuse; then cudaMalloc/cudaFree
#    rounds. The exit stats must show bucketalloc served them. Then the five-call probe, whose JSON
#    exit stats must count its 12 allocations (it also passes without the preload on a GPU).
if [[ -x $BUNDLE/bin/preload_kernel_check && -f $BUNDLE/lib/libbucketalloc_preload.so ]]; then
  run_step preload_kernel_check 120 bash -c '
    lib=$0 bin=$1
    out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:cuda BUCKETALLOC_STATS_ON_EXIT=stderr "$bin" 2>&1); rc=$?
    echo "$out"
    ((rc == 0)) && grep -q "allocation" <<<"$out" || exit 1
    out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:cuda "$bin" --negative-control 2>&1); rc=$?
    echo "$out"
    ((rc == 0))' "$PWD/$BUNDLE/lib/libbucketalloc_preload.so" "$BUNDLE/bin/preload_kernel_check"
  run_step preload_probe 60 bash -c '
    stats=$(mktemp --suffix=.json)
    LD_PRELOAD="$0" BUCKETALLOC_CONF=backend:cuda BUCKETALLOC_VERBOSE=1 BUCKETALLOC_STATS_ON_EXIT="$stats" "$1" || exit 1
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))[\"devices\"][0][\"stats\"]; \
print(\"exit stats:\", s[\"allocation.all.allocated\"], \"allocations\"); sys.exit(s[\"allocation.all.allocated\"] != 12)" "$stats"
  ' "$PWD/$BUNDLE/lib/libbucketalloc_preload.so" "$BUNDLE/bin/preload_probe"
else
  STEP_LINES+=("step preload_kernel_check: FAIL (0s, $BUNDLE/bin/preload_kernel_check or the preload library missing)")
  FAILED=$((FAILED + 1))
fi

# 5. The serving trace of the replay steps: the vendored Azure requests (the first 300) served by
#    Llama-3.1-8B, as `bucketalloc-bench generate serving` writes it. Then virtual-memory stitching
#    on the GPU (issue 6): the harness replays it with bucketalloc:backend:vmm (cuMemCreate/cuMemMap
#    granules) beside plain bucketalloc, on the smallest card stitching needs and on a 130 GiB card,
#    each against its simulated twin; no OOM with stitching, and granules stitched on the small card
#    (scripts/gpu_replay_check.py --vmm; no PyTorch needed).
TRACE=${TMPDIR:-/tmp}/gpu_serving_trace.csv
rm -f "$TRACE"
if [[ -x $BUNDLE/bin/bucketalloc-bench ]]; then
  run_step serving_trace 30 "$BUNDLE/bin/bucketalloc-bench" generate serving \
    --requests data/requests/azure_llm_inference_trace_2023_conv.csv \
    --model data/models/Llama-3.1-8B-Instruct.config.json --limit 300 -o "$TRACE"
  run_step replay_vmm 90 python3 scripts/gpu_replay_check.py "$TRACE" --bench "$BUNDLE/bin/bucketalloc-bench" --vmm
else
  STEP_LINES+=("step replay_vmm: FAIL (0s, $BUNDLE/bin/bucketalloc-bench missing)")
  FAILED=$((FAILED + 1))
fi

# 6. PyTorch: bucketalloc_torch.enable() on the GPU (workload vs a CPU reference, stats,
#    record_stream, empty_cache, CUDA graphs, the OOM error) and the torch.empty/del latency loop
#    against PyTorch's native allocator in the same run (scripts/gpu_torch_check.py).
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  run_step pytorch 150 env PYTHONPATH="$PWD/python/torch_plugin${PYTHONPATH:+:$PYTHONPATH}" \
    BUCKETALLOC_LIBRARY="$PWD/$BUNDLE/lib/libbucketalloc.so.0" python3 scripts/gpu_torch_check.py
else
  STEP_LINES+=("step pytorch: FAIL (0s, python3 cannot import torch with CUDA here)")
  FAILED=$((FAILED + 1))
fi

# 7. The benchmark harness against real PyTorch (issue 5): the serving trace of step 5 replayed
#    through PyTorch's native allocator, expandable segments, cudaMallocAsync and bucketalloc;
#    pytorch-policy on the simulated device must predict native's peak reserved within 5%; and the
#    cost model's cudaMalloc/cudaFree calibration.
if [[ -x $BUNDLE/bin/bucketalloc-bench ]] &&
  python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  run_step replay_pytorch 240 env PYTHONPATH="$PWD/python/torch_plugin${PYTHONPATH:+:$PYTHONPATH}" \
    BUCKETALLOC_LIBRARY="$PWD/$BUNDLE/lib/libbucketalloc.so.0" \
    python3 scripts/gpu_replay_check.py "$TRACE" --bench "$BUNDLE/bin/bucketalloc-bench"
else
  STEP_LINES+=("step replay_pytorch: FAIL (0s, $BUNDLE/bin/bucketalloc-bench missing or no torch with CUDA)")
  FAILED=$((FAILED + 1))
fi

# ---- the summary
{
  echo
  echo "=== gpu_check summary ($((SECONDS - START_S))s)"
  for line in "${STEP_LINES[@]}"; do echo "$line"; done
  echo "gpu_check: $PASSED passed, $FAILED failed"
} | tee -a "$LOG"
((FAILED == 0))
