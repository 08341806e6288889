#!/usr/bin/env bash
# scripts/gpu_check.sh — the one prepared command for a lent GPU machine.
#
# Owns: the list of checks run on a real GPU, each a step with its own timeout inside one overall
# budget, and the summary ("step <name>: PASS|FAIL|NOT RUN (seconds)" per step, then
# "gpu_check: N passed, M failed, K not run"). Exits non-zero when any step failed or a step that
# needs the GPU was not run.
# Order: what only a GPU machine can check first (each CUDA driver call's cost measured on the idle
# device and read back by the harness, PyTorch on the GPU, then the real CUDA tests and the shim),
# the CPU-only core tests last (CI runs them anyway; they are cut first when the budget runs out).
# The default budget (480 s) fits one 600 s device call.
# Libraries: PyTorch's steps run with PyTorch's own CUDA libraries (nothing of the bundle on
# LD_LIBRARY_PATH; libbucketalloc.so finds its Abseil beside itself through its RUNPATH and loads
# the driver itself); only the bundle's test programs get bundle/lib on LD_LIBRARY_PATH.
# Needs bundle/ (made here by scripts/make_gpu_bundle.sh, carried as ["bundle"]): the binaries in
# bundle/bin (packed as bundle/bin.tar.xz, unpacked here on the first run) and their libraries in
# bundle/lib. BUCKETALLOC_EXPECT_GPU=1 makes a missing GPU a failure in the tests, never a skip.
#
# Usage, from the repo root on the GPU machine:
#   bash scripts/gpu_check.sh
# Environment: GPU_CHECK_BUDGET_S (overall budget, default 480 s), BUNDLE (default bundle),
# GPU_CHECK_LOG_DIR (where gpu_check.log, every step's output, cuda_backend_test.xml and the measured
# cost file driver_costs.json go; default $OUT/gpu_check when $OUT is set, so they come back from the
# device tool, else /tmp/gpu_check).
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

# The bundle's programs need its libraries (Abseil, GoogleTest, the toolkit's libcudart for the
# preload programs); PyTorch's steps must not see them (torch loads its own CUDA libraries).
BUNDLE_LIBS="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
WITH_BUNDLE=(env LD_LIBRARY_PATH="$BUNDLE_LIBS")  # a prefix: timeout runs commands, not functions
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
NOT_RUN=0
OPTIONAL=0  # set to 1 around steps whose absence (budget spent) is not a failure

# run_step NAME TIMEOUT_S CMD...: runs CMD with a timeout (cut to what is left of the budget),
# appends its output to $LOG and records PASS (exit 0) or FAIL; with no budget left, NOT RUN (a
# failure unless OPTIONAL=1).
run_step() {
  local name=$1 timeout_s=$2
  shift 2
  local left=$((BUDGET_S - (SECONDS - START_S)))
  echo | tee -a "$LOG"
  echo "=== step $name (timeout ${timeout_s}s, ${left}s of the budget left): $*" | tee -a "$LOG"
  if ((left < 5)); then
    echo "gpu_check: no time left in the ${BUDGET_S}s budget; $name not run"
    STEP_LINES+=("step $name: NOT RUN (budget spent)")
    NOT_RUN=$((NOT_RUN + 1))
    ((OPTIONAL == 1)) || FAILED=$((FAILED + 1))
    return
  fi
  local cut=0
  ((timeout_s > left)) && timeout_s=$left && cut=1
  local t0=$SECONDS rc
  timeout --kill-after=10 "$timeout_s" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0)) note=""
  if ((rc == 124 || rc == 137)); then note=", timed out after ${timeout_s}s"; fi
  if ((rc == 0)); then
    STEP_LINES+=("step $name: PASS (${took}s)")
    PASSED=$((PASSED + 1))
  elif ((OPTIONAL == 1 && cut == 1 && (rc == 124 || rc == 137))); then
    STEP_LINES+=("step $name: NOT RUN (budget spent after ${took}s of it)")
    NOT_RUN=$((NOT_RUN + 1))
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
HAVE_TORCH=0
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && HAVE_TORCH=1
TORCH_ENV=(env PYTHONPATH="$PWD/python/torch_plugin${PYTHONPATH:+:$PYTHONPATH}"
           BUCKETALLOC_LIBRARY="$PWD/$BUNDLE/lib/libbucketalloc.so.0")

# 1. The serving trace of the replay steps: the vendored Azure requests (the first 300) served by
#    Llama-3.1-8B, as `bucketalloc-bench generate serving` writes it.
TRACE=${TMPDIR:-/tmp}/gpu_serving_trace.csv
rm -f "$TRACE"
if [[ -x $BUNDLE/bin/bucketalloc-bench ]]; then
  run_step serving_trace 20 "${WITH_BUNDLE[@]}" "$BUNDLE/bin/bucketalloc-bench" generate serving \
    --requests data/requests/azure_llm_inference_trace_2023_conv.csv \
    --model data/models/Llama-3.1-8B-Instruct.config.json --limit 300 -o "$TRACE"
else
  STEP_LINES+=("step serving_trace: FAIL (0s, $BUNDLE/bin/bucketalloc-bench missing)")
  FAILED=$((FAILED + 1))
fi

# 1a. What each CUDA driver call costs on this GPU (tools/measure_driver_costs.cc: cudaMalloc/cudaFree,
#    the cuMem* family, address reserve/free, synchronize), measured on the still idle device and
#    written to $LOG_DIR/driver_costs.json (it comes back from the device tool); then the harness must
#    read it: the serving trace replayed with backend:vmm priced by it (--costs FILE), so that one GPU
#    run calibrates bucketalloc-bench's driver time.
if [[ -x $BUNDLE/bin/bucketalloc-measure-driver-costs && -x $BUNDLE/bin/bucketalloc-bench && -s $TRACE ]]; then
  run_step driver_costs 90 "${WITH_BUNDLE[@]}" bash -c '
    set -eo pipefail
    BUNDLE=$0 TRACE=$1 LOG_DIR=$2
    rm -f "$LOG_DIR/driver_costs.json" "$LOG_DIR/replay_measured_costs.json"
    "$BUNDLE/bin/bucketalloc-measure-driver-costs" --budget-s 60 -o "$LOG_DIR/driver_costs.json"
    "$BUNDLE/bin/bucketalloc-bench" replay "$TRACE" --capacity 80GiB --allocator bucketalloc:backend:vmm \
      --costs "$LOG_DIR/driver_costs.json" --json "$LOG_DIR/replay_measured_costs.json"
    grep -q "\"measured-" "$LOG_DIR/replay_measured_costs.json" ||
      { echo "driver_costs: the replay JSON does not name the measured profile"; exit 1; }' \
    "$BUNDLE" "$TRACE" "$LOG_DIR"
else
  STEP_LINES+=("step driver_costs: FAIL (0s, no trace, or $BUNDLE/bin/bucketalloc-measure-driver-costs or bucketalloc-bench missing)")
  FAILED=$((FAILED + 1))
fi

# 1b. The wheel as a server installs it (docs/install.md): into a venv that sees the machine's own
#    torch (system site packages), without BUCKETALLOC_LIBRARY; --version must name the driver, and
#    the launchers from the venv's bin/ must serve a CUDA program (backend:cuda) and run the harness.
WHEEL=$(ls "$BUNDLE"/bucketalloc-*.whl 2>/dev/null | head -1)
if [[ -n $WHEEL && -x $BUNDLE/bin/preload_probe ]]; then
  run_step wheel 90 env -u BUCKETALLOC_LIBRARY -u BUCKETALLOC_CONF WHEEL="$WHEEL" PROBE="$BUNDLE/bin/preload_probe" \
    BUNDLE_LIBS="$BUNDLE_LIBS" bash -c '
    set -eo pipefail
    venv=$(mktemp -d)/venv
    python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install --quiet --no-index --no-deps "$WHEEL"
    cd "$(dirname "$venv")"
    "$venv/bin/python" -m bucketalloc_torch --version | tee versions.txt
    grep -qE "^CUDA driver: [0-9]+\.[0-9]+$" versions.txt
    LD_LIBRARY_PATH=$BUNDLE_LIBS "$venv/bin/bucketalloc-preload" --conf backend:cuda --stats-on-exit stats.json -- "$OLDPWD/$PROBE"
    python3 -c "import json; s = json.load(open(\"stats.json\"))[\"devices\"][0][\"stats\"]; assert s[\"allocation.all.allocated\"] == 12, s; print(\"wheel preload: 12 allocations served\")"
    "$venv/bin/bucketalloc-bench" --help >bench_help.txt
    head -2 bench_help.txt'
else
  STEP_LINES+=("step wheel: FAIL (0s, no $BUNDLE/bucketalloc-*.whl or $BUNDLE/bin/preload_probe; scripts/make_gpu_bundle.sh makes them)")
  FAILED=$((FAILED + 1))
fi

# 2. PyTorch: bucketalloc_torch.enable() on the GPU, the native path (the allocator torch holds):
#    torch.compile(mode="reduce-overhead"), cudnn.benchmark, a CUDA tensor shared with a child
#    process, MemPool/use_mem_pool and torch's own memory_stats/_snapshot/_record_memory_history,
#    each side by side with PyTorch's own allocator (peak reserved, time); then the workload vs a
#    CPU reference, record_stream, empty_cache, CUDA graphs, the OOM error and the torch.empty/del
#    latency loop (scripts/gpu_torch_check.py), with torch's own CUDA libraries.
if ((HAVE_TORCH == 1)); then
  run_step pytorch 240 "${TORCH_ENV[@]}" python3 scripts/gpu_torch_check.py
else
  STEP_LINES+=("step pytorch: FAIL (0s, python3 cannot import torch with CUDA here)")
  FAILED=$((FAILED + 1))
fi

# 3. The benchmark harness against real PyTorch: the serving trace replayed through PyTorch's native
#    allocator, expandable segments, cudaMallocAsync and bucketalloc; pytorch-policy on the simulated
#    device must predict native's peak reserved within 5%; the cost model's cudaMalloc calibration.
#    bucketalloc-bench is a bundle program: the script gives it the bundle's libraries itself.
if [[ -x $BUNDLE/bin/bucketalloc-bench && -s $TRACE && $HAVE_TORCH == 1 ]]; then
  run_step replay_pytorch 120 "${TORCH_ENV[@]}" BENCH_LD_LIBRARY_PATH="$BUNDLE_LIBS" \
    python3 scripts/gpu_replay_check.py "$TRACE" --bench "$BUNDLE/bin/bucketalloc-bench"
else
  STEP_LINES+=("step replay_pytorch: FAIL (0s, no trace, $BUNDLE/bin/bucketalloc-bench missing or no torch with CUDA)")
  FAILED=$((FAILED + 1))
fi

# 4. The cuda and vmm backends and the allocator with backend:cuda and backend:vmm on the device
#    (tests/cuda/cuda_backend_test.cc: the same source CI runs on the CUDA double; a missing GPU
#    fails it).
if [[ -x $BUNDLE/bin/cuda_backend_test ]]; then
  run_step cuda_backend_test 60 "${WITH_BUNDLE[@]}" "$BUNDLE/bin/cuda_backend_test" --gtest_brief=1 \
    "--gtest_output=xml:$LOG_DIR/cuda_backend_test.xml"
else
  STEP_LINES+=("step cuda_backend_test: FAIL (0s, $BUNDLE/bin/cuda_backend_test missing)")
  FAILED=$((FAILED + 1))
fi

# 5. The LD_PRELOAD drop-in on the GPU.
#    preload_kernel_check (tests/preload/preload_kernel_check.cu): buffers freed with cudaFreeAsync
#    on another stream while a slow kernel still reads them must not be handed out again early (0 bad
#    words), and the negative control (freed on the wrong stream, a program bug) must show bad words;
#    then cudaMalloc/cudaFree rounds; the exit stats must show bucketalloc served them.
#    preload_scenarios: the scenarios CI runs on the CUDA double (tests/preload/
#    preload_double_program.cc: exhaust, device1, capture, destroy, perthread), now real, under
#    backend:cuda and backend:vmm.
#    preload_probe: the five-call probe, whose JSON exit stats must count its 12 allocations.
PRELOAD=$PWD/$BUNDLE/lib/libbucketalloc_preload.so
if [[ -x $BUNDLE/bin/preload_kernel_check && -f $PRELOAD ]]; then
  run_step preload_kernel_check 60 "${WITH_BUNDLE[@]}" bash -c '
    lib=$0 bin=$1
    out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:cuda BUCKETALLOC_STATS_ON_EXIT=stderr "$bin" 2>&1); rc=$?
    echo "$out"
    ((rc == 0)) && grep -q "allocation" <<<"$out" || exit 1
    out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:cuda "$bin" --negative-control 2>&1); rc=$?
    echo "$out"
    ((rc == 0))' "$PRELOAD" "$BUNDLE/bin/preload_kernel_check"
else
  STEP_LINES+=("step preload_kernel_check: FAIL (0s, $BUNDLE/bin/preload_kernel_check or the preload library missing)")
  FAILED=$((FAILED + 1))
fi
if [[ -x $BUNDLE/bin/preload_double_program && -f $PRELOAD ]]; then
  run_step preload_scenarios 60 "${WITH_BUNDLE[@]}" bash -c '
    set -o pipefail
    lib=$0 bin=$1 failed=0
    for scenario in exhaust device1 capture destroy perthread; do
      for conf in backend:cuda backend:vmm; do
        LD_PRELOAD="$lib" BUCKETALLOC_CONF=$conf "$bin" "$scenario" | sed "s/^/[$conf] /" || failed=1
      done
    done
    exit $failed' "$PRELOAD" "$BUNDLE/bin/preload_double_program"
else
  STEP_LINES+=("step preload_scenarios: FAIL (0s, $BUNDLE/bin/preload_double_program or the preload library missing)")
  FAILED=$((FAILED + 1))
fi
if [[ -x $BUNDLE/bin/preload_probe && -f $PRELOAD ]]; then
  run_step preload_probe 30 "${WITH_BUNDLE[@]}" bash -c '
    stats=$(mktemp --suffix=.json)
    LD_PRELOAD="$0" BUCKETALLOC_CONF=backend:cuda BUCKETALLOC_VERBOSE=1 BUCKETALLOC_STATS_ON_EXIT="$stats" "$1" || exit 1
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))[\"devices\"][0][\"stats\"]; \
print(\"exit stats:\", s[\"allocation.all.allocated\"], \"allocations\"); sys.exit(s[\"allocation.all.allocated\"] != 12)" "$stats"
  ' "$PRELOAD" "$BUNDLE/bin/preload_probe"
else
  STEP_LINES+=("step preload_probe: FAIL (0s, $BUNDLE/bin/preload_probe or the preload library missing)")
  FAILED=$((FAILED + 1))
fi

# 6. Virtual-memory stitching on the GPU: the harness replays the serving trace with
#    bucketalloc:backend:vmm (cuMemCreate/cuMemMap granules) beside plain bucketalloc, on the
#    smallest card stitching needs and on a 130 GiB card, each against its simulated twin; no OOM
#    with stitching, and granules stitched on the small card (scripts/gpu_replay_check.py --vmm).
if [[ -x $BUNDLE/bin/bucketalloc-bench && -s $TRACE ]]; then
  run_step replay_vmm 60 "${WITH_BUNDLE[@]}" python3 scripts/gpu_replay_check.py "$TRACE" --bench "$BUNDLE/bin/bucketalloc-bench" --vmm
else
  STEP_LINES+=("step replay_vmm: FAIL (0s, no trace or $BUNDLE/bin/bucketalloc-bench missing)")
  FAILED=$((FAILED + 1))
fi

# 7. CPU-only, last and optional (CI runs them; cut first when the budget runs out): the core tests
#    on this machine's CPUs and libraries, and a short run of the micro-benchmarks. c_abi_test
#    drives the process-wide allocator of the C ABI: each of its tests needs a fresh process (as
#    ctest runs them), so run_each_test runs them one by one.
OPTIONAL=1
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
run_core_tests() {  # every core *_test binary of the bundle but the GPU one
  local failed=0 bin name
  for bin in "$BUNDLE"/bin/*_test; do
    name=$(basename "$bin")
    [[ -x $bin && $name != cuda_backend_test ]] || continue
    echo "--- $name"
    if [[ $name == c_abi_test ]]; then run_each_test "$bin" || failed=1; else "$bin" --gtest_brief=1 || failed=1; fi
  done
  return $failed
}
run_step core_tests 120 "${WITH_BUNDLE[@]}" bash -c "BUNDLE=$BUNDLE; $(declare -f run_each_test run_core_tests); run_core_tests"
if [[ -x $BUNDLE/bin/bucketalloc_microbench ]]; then
  run_step bucketalloc_microbench 45 "${WITH_BUNDLE[@]}" "$BUNDLE/bin/bucketalloc_microbench" --benchmark_min_time=0.05
fi
OPTIONAL=0

# ---- the summary
{
  echo
  echo "=== gpu_check summary ($((SECONDS - START_S))s)"
  for line in "${STEP_LINES[@]}"; do echo "$line"; done
  echo "gpu_check: $PASSED passed, $FAILED failed, $NOT_RUN not run"
} | tee -a "$LOG"
((FAILED == 0))
