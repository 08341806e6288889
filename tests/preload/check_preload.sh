#!/usr/bin/env bash
# tests/preload/check_preload.sh PROBE PRELOAD_LIB PROBE_PTSZ DLOPEN_HOST DLOPEN_PLUGIN — the LD_PRELOAD
# drop-in on the simulated device.
#   1. Without the preload the probe gets the runtime's own error: with no driver, cudaMalloc returns
#      cudaErrorInsufficientDriver (35), which proves that (2) was served by the interposer. On a
#      machine with a GPU the probe succeeds without the preload; that case is stated, not failed.
#   2. With LD_PRELOAD and BUCKETALLOC_CONF=backend:sim every call succeeds or fails as the runtime
#      documents, and BUCKETALLOC_STATS_ON_EXIT=<path>.json shows the probe's allocations.
#   3. BUCKETALLOC_STATS_ON_EXIT=stderr prints the summary table; BUCKETALLOC_VERBOSE=1 reports the
#      bad inputs on stderr.
#   4. 8 threads making the first calls at once: no deadlock, every call served; and fork while 4
#      threads allocate: every child is served.
#   5. A bad BUCKETALLOC_CONF is reported once and the calls go to the runtime unchanged.
#   6. The per-thread-default-stream names (cudaMallocAsync_ptsz, cudaFreeAsync_ptsz) are served.
#   7. A plugin that links libcudart, loaded with RTLD_LOCAL: its calls are served (backend:sim), and
#      with backend:cuda the shim finds that libcudart (not in the global scope) and forwards to it.
set -uo pipefail
probe=$1; lib=$2; probe_ptsz=$3; dlopen_host=$4; dlopen_plugin=$5
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fail() { echo "check_preload: FAIL: $*"; exit 1; }

echo "== 1. without the preload"
out=$("$probe" 2>&1); rc=$?
echo "$out" | head -3
if ((rc == 3)); then
  grep -q "cudaMalloc(1 MiB): cudaErrorInsufficientDriver (35)" <<<"$out" ||
    grep -q "cudaMalloc(1 MiB): cudaErrorNoDevice" <<<"$out" || fail "unexpected runtime error without the preload"
elif ((rc == 0)); then
  echo "check_preload: a CUDA device is present, so the runtime itself succeeds (no no-driver error to compare)"
else
  fail "the probe failed without the preload (exit $rc)"
fi

echo "== 2. with LD_PRELOAD on the simulated device"
out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:sim BUCKETALLOC_STATS_ON_EXIT="$work/stats.json" "$probe" 2>&1)
rc=$?
echo "$out"
((rc == 0)) || fail "the probe failed under the preload (exit $rc)"
[[ -s $work/stats.json ]] || fail "no stats written to BUCKETALLOC_STATS_ON_EXIT"
/usr/bin/python3 - "$work/stats.json" <<'PY' || fail "the exit stats do not show the probe's allocations"
import json, sys
d = json.load(open(sys.argv[1]))["devices"][0]
s = d["stats"]
print(f"exit stats: {s['allocation.all.allocated']} allocations, {s['num_device_alloc']} device allocations, "
      f"peak allocated {s['allocated_bytes.all.peak']} B, {s['num_ooms']} OOM, now allocated "
      f"{s['allocated_bytes.all.current']} B")
assert d["device"] == 0
assert s["allocation.all.allocated"] == 12, s["allocation.all.allocated"]  # 1 + 2 async + 8 + 1 (64 KiB); 1 TiB, 1 EiB fail; size 0 allocates nothing
assert s["allocation.all.current"] == 0
assert s["num_ooms"] == 1  # the 1 TiB request (1 EiB is refused as an invalid size)
assert s["allocated_bytes.all.peak"] >= 7 * (5 << 20)
assert "large_pool" in d["fragmentation"]
PY

echo "== 3. stats table on stderr, verbose errors"
err=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:sim BUCKETALLOC_STATS_ON_EXIT=stderr BUCKETALLOC_VERBOSE=1 \
      "$probe" 2>&1 >/dev/null)
echo "$err" | head -5
grep -q "cudaMalloc: the output pointer is NULL -> cudaErrorInvalidValue (1)" <<<"$err" || fail "no verbose report"
grep -q "cudaErrorMemoryAllocation" <<<"$err" || fail "no verbose OOM report"
grep -q "PyTorch CUDA memory summary" <<<"$err" && grep -q "| Allocated memory" <<<"$err" || fail "no stats table on stderr"

echo "== 4. the first calls come from 8 threads at once (lazy initialization)"
out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:sim BUCKETALLOC_STATS_ON_EXIT="$work/threads.json" \
      timeout 120 "$probe" --threads 2>&1); rc=$?
echo "$out"
((rc == 0)) || fail "the threaded probe failed (exit $rc; 124 is a hang)"
/usr/bin/python3 -c "
import json, sys
s = json.load(open('$work/threads.json'))['devices'][0]['stats']
assert s['allocation.all.allocated'] == 8000 and s['allocation.all.current'] == 0, s['allocation.all.allocated']
print('threads: 8000 allocations served, none left')" || fail "the threaded probe's stats are wrong"

echo "== 4b. fork while 4 threads allocate: every child is served (pthread_atfork handlers)"
out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:sim timeout 120 "$probe" --fork 2>&1); rc=$?
echo "$out"
((rc == 0)) || fail "a fork child of the busy probe failed or hung (exit $rc)"

echo "== 5. a bad BUCKETALLOC_CONF"
out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:sim,no_such_key:1 "$probe" 2>&1); rc=$?
echo "$out" | head -2
(($(grep -c "bucketalloc preload: the allocator is not available" <<<"$out") == 1)) ||
  fail "the bad configuration was not reported exactly once"
grep -q "no_such_key" <<<"$out" || fail "the report does not name the bad key"
if ((rc == 3)); then
  grep -q "cudaMalloc(1 MiB): cudaErrorInsufficientDriver (35)" <<<"$out" || fail "the call did not go to the runtime"
elif ((rc != 0)); then
  fail "the probe failed with the calls forwarded (exit $rc)"
fi

echo "== 5b. tenants, which the shim cannot bind: refused once, naming why"
out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF="backend:sim,tenants:[long:1GiB]" "$probe" 2>&1)
(($(grep -c "bucketalloc preload: the allocator is not available" <<<"$out") == 1)) ||
  fail "tenants were not refused exactly once: $out"
grep -q "cannot bind them: remove tenants from BUCKETALLOC_CONF" <<<"$out" || fail "the refusal does not say why: $out"

echo "== 6. the per-thread default stream API (_ptsz)"
nm -D --undefined-only "$probe_ptsz" | grep -q "cudaMallocAsync_ptsz" || fail "the _ptsz probe does not call cudaMallocAsync_ptsz"
out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:sim BUCKETALLOC_STATS_ON_EXIT="$work/ptsz.json" "$probe_ptsz" 2>&1)
rc=$?
((rc == 0)) || { echo "$out"; fail "the _ptsz probe failed under the preload (exit $rc)"; }
/usr/bin/python3 -c "
import json
s = json.load(open('$work/ptsz.json'))['devices'][0]['stats']
assert s['allocation.all.allocated'] == 12, s['allocation.all.allocated']
print('ptsz: 12 allocations served')" || fail "the _ptsz probe's allocations were not served"

echo "== 7. libcudart loaded with RTLD_LOCAL by a plugin"
out=$("$dlopen_host" "$dlopen_plugin" 2>&1); echo "without the preload: $out"
native=$(grep -oE "[0-9]+$" <<<"$out")
out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:sim "$dlopen_host" "$dlopen_plugin" 2>&1); echo "backend:sim: $out"
grep -q "plugin: 0$" <<<"$out" || fail "the plugin's calls were not served on the simulated device"
out=$(LD_PRELOAD="$lib" BUCKETALLOC_CONF=backend:cuda "$dlopen_host" "$dlopen_plugin" 2>&1); echo "backend:cuda: $out"
got=$(grep -oE "plugin: [0-9]+$" <<<"$out" | grep -oE "[0-9]+$")
[[ $got == "$native" ]] || fail "with backend:cuda the plugin got $got, the runtime alone gives $native (303: libcudart not found)"

echo "check_preload: PASS"
