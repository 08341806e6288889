#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] — builds the libFuzzer targets of fuzz/ (clang, AddressSanitizer and
# UndefinedBehaviorSanitizer, invariant checks on) in build/fuzz and runs each for SECONDS (default
# 20) from its seed corpus (fuzz/corpus/<target>/, copied: the repository's seeds stay as they are);
# ops_fuzz runs three times: on the default configuration, with stitching (expandable segments), and
# with tenants (their binding and caps among the operations).
# Prints each run's executions; a crash, a leak or a broken property fails (its input is kept
# under build/fuzz/findings/<run>/). The runs are independent processes: JOBS of them run at once
# (the build's parallelism too). Environment: JOBS (default 2, at least 1).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${1:-20}"
jobs="${JOBS:-2}"
[[ $jobs -ge 1 ]] 2>/dev/null || { echo "fuzz.sh: JOBS=$jobs; accepted: a whole number of at least 1" >&2; exit 1; }
cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DCUDAToolkit_ROOT="${CUDA_HOME:-/usr/local/cuda}" \
  -DBUCKETALLOC_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DBUCKETALLOC_BUILD_FUZZERS=ON -DBUCKETALLOC_BUILD_TESTS=OFF -DBUCKETALLOC_BUILD_BENCH=OFF \
  -DBUCKETALLOC_BUILD_TOOLS=OFF >/dev/null || exit 1
ninja -C build/fuzz -j"$jobs" conf_fuzz trace_fuzz kineto_fuzz snapshot_fuzz workload_fuzz doctor_fuzz timeline_fuzz ops_fuzz || exit 1

export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run() {  # run NAME TARGET [-FLAG...] [ENV=VALUE...]: one fuzz run; its verdict on stdout
  local name=$1 target=$2; shift 2
  local flags=()
  while [[ $# -gt 0 && $1 == -* ]]; do flags+=("$1"); shift; done
  local corpus=build/fuzz/corpus/$name findings=build/fuzz/findings/$name
  rm -rf "$corpus" "$findings"; mkdir -p "$corpus" "$findings"
  cp fuzz/corpus/"$target"/* "$corpus"/
  local log=build/fuzz/$name.log
  if env "$@" build/fuzz/fuzz/"$target" "$corpus" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=4096 \
       -artifact_prefix="$findings/" -print_final_stats=1 "${flags[@]}" >"$log" 2>&1; then
    echo "fuzz $name: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') executions in ${seconds} s, no crash"
  else
    echo "fuzz $name: FAILED (input kept in $findings/):"
    grep -m20 -E "ERROR|property broken|SUMMARY|Test unit written" "$log"
    return 1
  fi
}
# Runs in the background, at most $jobs at once; each one's verdict is printed when all are done,
# in the order they were started.
names=()
start() {  # start NAME TARGET ...: as run
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n; done
  run "$@" >"build/fuzz/$1.verdict" 2>&1 &
  names+=("$1")
}
start conf conf_fuzz
start trace trace_fuzz
start kineto kineto_fuzz
start snapshot snapshot_fuzz -max_len=8192
start workload workload_fuzz
start doctor doctor_fuzz -max_len=8192
start timeline timeline_fuzz -max_len=8192
start ops ops_fuzz -max_len=1024
start ops_stitching ops_fuzz -max_len=1024 \
  BUCKETALLOC_FUZZ_CONF="backend:sim,capacity:96MiB,sim_total_memory:256MiB,expandable_segments:true,tiers_tokens:[16,32,64,128],bytes_per_token:128KiB"
start ops_tenants ops_fuzz -max_len=1024 \
  BUCKETALLOC_FUZZ_CONF="backend:sim,capacity:96MiB,sim_total_memory:256MiB,tenants:[a:32MiB,b:48MiB]"
wait
failed=0
for name in "${names[@]}"; do  # a run that did not finish cleanly wrote no "no crash" line
  cat "build/fuzz/$name.verdict"
  grep -q ", no crash$" "build/fuzz/$name.verdict" || failed=$((failed + 1))
done
[[ $failed -eq 0 ]]
