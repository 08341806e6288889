#!/usr/bin/env bash
# tests/tools/check_measure_driver_costs.sh PROGRAM DOUBLE_DIR [BENCH] — bucketalloc-measure-driver-costs
# (tools/measure_driver_costs.cc) without a GPU, on the CUDA double (tests/cuda_double) served as its
# libcudart through LD_LIBRARY_PATH=DOUBLE_DIR (the driver's functions then come from the double's
# cudaGetDriverEntryPointByVersion):
#   - at CUDA driver version 13.0 with a small --budget-s: exit 0, no rule of the double broken, and
#     a cost file with every call the reader needs (src/harness/replay/driver_costs.h): the
#     documented sizes, strictly increasing, bytes integers in [0, 2^50], us and p99_us in [0, 1e6],
#     one synchronize point at 0 bytes, nothing else; on stderr, the series kept out of the file (a
#     free after queued work, cuMemSetAccess over a whole run) and synchronize called the idle round
#     trip. Only 13.0: the program links libcudart.so.13, which refuses a CUDA 12.x driver; the
#     double, served as that libcudart, does not model the refusal, so a 12.x run here would pass
#     where the real program cannot run at all;
#   - on a 64 MiB device: the sizes over half the free memory left out (2 and 20 MiB remain);
#   - --profile and stdout output; --device out of range: exit 1 naming it and the accepted range;
#   - --budget-s nan and inf refused naming the flag; -o into a missing directory refused with the
#     reason before anything is measured;
#   - without the double (the real libcudart; no driver here): exit 1 with a message naming the CUDA
#     error, never a crash (on a machine with a GPU it measures instead, and the file is checked);
#   - with BENCH (bucketalloc-bench): `replay --costs FILE` reads the file and names its profile.
set -uo pipefail
program=$1; double_dir=$2; bench=${3:-}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fail() { echo "check_measure_driver_costs: FAIL: $*"; exit 1; }
[[ -e $double_dir/libcudart.so.13 ]] || fail "no CUDA double in $double_dir"

# check_json FILE PROFILE [MALLOC_SIZES]: the cost file's shape (sizes as a comma list of bytes).
check_json() {
  python3 - "$@" <<'PY'
import json, sys
path, profile = sys.argv[1], sys.argv[2]
malloc_sizes = [int(b) for b in sys.argv[3].split(",")] if len(sys.argv) > 3 else None
calls = ["cudaMalloc", "cudaFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
         "cuMemAddressReserve", "cuMemAddressFree", "synchronize"]
j = json.load(open(path))
def need(ok, what):
    if not ok:
        sys.exit(f"{path}: {what}")
need(isinstance(j, dict) and sorted(j) == ["calls", "profile", "source"], f"top-level keys {sorted(j)}")
need(j["profile"] == profile, f"profile {j['profile']!r}, expected {profile!r}")
need(isinstance(j["source"], str) and j["source"].startswith("bucketalloc-measure-driver-costs on "), "source")
need(sorted(j["calls"]) == sorted(calls), f"calls {sorted(j['calls'])}")
for call in calls:
    points = j["calls"][call]
    need(isinstance(points, list) and 1 <= len(points) <= 64, f"{call}: {len(points)} points")
    last = -1
    for p in points:
        need(sorted(p) == ["bytes", "p99_us", "us"], f"{call}: keys {sorted(p)}")
        need(isinstance(p["bytes"], int) and 0 <= p["bytes"] <= 2**50, f"{call}: bytes {p['bytes']}")
        need(p["bytes"] > last, f"{call}: sizes not strictly increasing at {p['bytes']}")
        last = p["bytes"]
        for key in ("us", "p99_us"):
            need(isinstance(p[key], (int, float)) and 0 <= p[key] <= 1e6, f"{call}: {key} {p[key]}")
sizes = lambda call: [p["bytes"] for p in j["calls"][call]]
need(sizes("synchronize") == [0], f"synchronize sizes {sizes('synchronize')}")
if malloc_sizes is not None:
    for call in ("cudaMalloc", "cudaFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemSetAccess", "cuMemUnmap"):
        need(sizes(call) == malloc_sizes, f"{call} sizes {sizes(call)}, expected {malloc_sizes}")
    reserve = [2 << 20, 1 << 30, 64 << 30, 1 << 40]
    for call in ("cuMemAddressReserve", "cuMemAddressFree"):
        need(sizes(call) == reserve, f"{call} sizes {sizes(call)}, expected {reserve}")
print(f"{path}: {sum(len(v) for v in j['calls'].values())} points, every call, profile {j['profile']}")
PY
}

on_double() { CUDA_DOUBLE_REPORT=stderr LD_LIBRARY_PATH="$double_dir" timeout 120 "$@"; }
mib=$((1 << 20))
all_sizes=$((2 * mib)),$((20 * mib)),$((128 * mib)),$((1024 * mib))

for version in 13000; do
  out=$(CUDA_DOUBLE_DRIVER_VERSION=$version CUDA_DOUBLE_DEVICE_MEMORY=$((4 << 30)) \
        on_double "$program" --budget-s 2 -o "$work/costs_$version.json" 2>&1)
  rc=$?
  ((rc == 0)) || { echo "$out"; fail "driver $version: exit $rc"; }
  echo "$out" | sed "s/^/[driver $version] /"
  grep -q "rule violation" <<<"$out" && fail "driver $version: the double recorded rule violations"
  grep -q "^cuMemCreate .* 1 GiB" <<<"$out" || fail "driver $version: no table row for cuMemCreate at 1 GiB"
  grep -q "not in the cost file: cuMemFree of 2 MiB after a cudaMemsetAsync of 1 GiB" <<<"$out" ||
    fail "driver $version: no free-after-queued-work series on stderr"
  grep -q "not in the cost file: cuMemSetAccess over one run of [0-9]* x 1 GiB" <<<"$out" ||
    fail "driver $version: no whole-run cuMemSetAccess on stderr"
  grep -q "^synchronize: an idle cudaDeviceSynchronize, the round trip only" <<<"$out" ||
    fail "driver $version: the table does not say synchronize is the idle round trip"
  check_json "$work/costs_$version.json" measured-cuda-device-0 "$all_sizes" || fail "driver $version: the cost file"
done

out=$(CUDA_DOUBLE_DEVICE_MEMORY=$((64 * mib)) on_double "$program" --budget-s 1 --profile small-card 2>"$work/err")
rc=$?
((rc == 0)) || { cat "$work/err"; fail "64 MiB device: exit $rc"; }
printf '%s\n' "$out" >"$work/small.json"
grep -q "128 MiB left out" "$work/err" || { cat "$work/err"; fail "64 MiB device: no note of the sizes left out"; }
check_json "$work/small.json" small-card $((2 * mib)),$((20 * mib)) || fail "64 MiB device: the cost file (stdout)"

out=$(on_double "$program" --budget-s 1 --device 7 -o "$work/none.json" 2>&1)
rc=$?
((rc == 1)) || { echo "$out"; fail "--device 7 of 2: exit $rc, expected 1"; }
grep -q "out of range" <<<"$out" || { echo "$out"; fail "--device 7: the message does not say it is out of range"; }
grep -q "accepted 0 to 1" <<<"$out" || { echo "$out"; fail "--device 7: the message does not give the range"; }
[[ -e $work/none.json ]] && fail "--device 7 wrote a cost file (or its check before measuring left one)"

for budget in nan inf; do
  out=$(on_double "$program" --budget-s $budget -o "$work/budget.json" 2>&1)
  rc=$?
  ((rc != 0)) || { echo "$out"; fail "--budget-s $budget: exit 0"; }
  grep -q -- "--budget-s.*positive finite number of seconds" <<<"$out" ||
    { echo "$out"; fail "--budget-s $budget: the message names neither the flag nor the accepted range"; }
  [[ -e $work/budget.json ]] && fail "--budget-s $budget wrote a cost file"
done

out=$(on_double "$program" --budget-s 1 -o "$work/missing/costs.json" 2>&1)
rc=$?
((rc == 1)) || { echo "$out"; fail "-o into a missing directory: exit $rc, expected 1"; }
grep -q "cannot write -o .*: No such file or directory" <<<"$out" ||
  { echo "$out"; fail "-o into a missing directory: the message gives no reason"; }
grep -q "^call " <<<"$out" && { echo "$out"; fail "-o into a missing directory: measured before checking the path"; }

# The real runtime: here no driver (cudaGetDeviceCount: error 35), a clear message and exit 1.
out=$(timeout 120 "$program" --budget-s 1 -o "$work/real.json" 2>&1)
rc=$?
if ((rc == 0)); then
  echo "check_measure_driver_costs: a CUDA device is present: checking its measured file"
  check_json "$work/real.json" "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["profile"])' \
    "$work/real.json")" || fail "the real device's cost file"
else
  echo "[no driver] $out"
  ((rc == 1)) || fail "without a driver: exit $rc, expected 1 (a crash or a timeout?)"
  grep -qE "CUDA error [0-9]+ \(cuda[A-Za-z]+" <<<"$out" || fail "without a driver: the message names no CUDA error"
fi

if [[ -n $bench ]]; then
  cat >"$work/t.csv" <<'CSV'
Thread,Time,Action,Pointer,Size,Stream
1,00:00:00.000001,allocate,0xa,10485760,0x0
1,00:00:00.000002,allocate,0xb,20971520,0x0
1,00:00:00.000003,free,0xa,10485760,0x0
1,00:00:00.000004,free,0xb,20971520,0x0
CSV
  "$bench" replay "$work/t.csv" --capacity 1GiB --allocator bucketalloc:backend:vmm --costs "$work/costs_13000.json" \
    --json "$work/replay.json" >/dev/null || fail "bucketalloc-bench replay refused the measured cost file"
  grep -q '"measured-cuda-device-0"' "$work/replay.json" || fail "the replay's JSON does not name the measured profile"
  echo "check_measure_driver_costs: bucketalloc-bench replay --costs read the measured file"
fi
echo "check_measure_driver_costs: PASS"
