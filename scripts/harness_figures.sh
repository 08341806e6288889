#!/usr/bin/env bash
# scripts/harness_figures.sh — the benchmark figures of issue 5: serving traces from two request
# files x two models x the three KV layouts, and the real GPU trace, each replayed by bucketalloc and
# pytorch-policy, PyTorch's expandable segments with 20 MiB and 2 MiB large pages (and any extra
# allocators), with min-capacity, fragmentation OOMs and backend calls.
#
# For each trace: `min-capacity` of pytorch-policy gives capacity C; `compare` at C then gives every
# allocator's replay at the same capacity (OOMs, backend calls) and its own min-capacity. A markdown
# table goes to stdout; the JSON of every run stays in $WORK.
#
# Usage: scripts/harness_figures.sh [EXTRA_ALLOCATOR ...]
# Environment: BENCH (default build/release/tools/bucketalloc-bench), DATA (the request traces and
# configs not vendored into data/: default ../shared/data), WORK (default /tmp/harness_figures),
# AZURE_LIMIT (2000), MOONCAKE_LIMIT (300), COSTS (the driver's prices: a profile or a cost file,
# passed to every run as --costs; default the tool's, docs/harness.md "Driver time"). Mooncake's long contexts are admitted while the running
# requests hold at most 400,000 tokens (--max-kv-tokens), so its traces fit an 80 GiB card.
# TRACES_ONLY=1: writes the 13 traces to $WORK and prints their paths, one per line, and nothing
# else (scripts/tune_figures.sh tunes the same traces).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BENCH=${BENCH:-build/release/tools/bucketalloc-bench}
DATA=${DATA:-../shared/data}
WORK=${WORK:-/tmp/harness_figures}
mkdir -p "$WORK"
ALLOCATORS="bucketalloc,pytorch-policy,pytorch-expandable,pytorch-expandable:large_page_mb=2"
COST_FLAGS=()
if [[ -n "${COSTS:-}" ]]; then COST_FLAGS=(--costs "$COSTS"); fi
for extra in "$@"; do ALLOCATORS+=",$extra"; done

declare -A REQUESTS=(
  [azure_conv]="--requests data/requests/azure_llm_inference_trace_2023_conv.csv --limit ${AZURE_LIMIT:-2000} --time-scale 0.1"
  [mooncake_conv]="--requests $DATA/mooncake_fast25_conversation_trace.jsonl --limit ${MOONCAKE_LIMIT:-300} --time-scale 0.2 --max-kv-tokens 400000"
)
declare -A MODELS=(
  [llama31_8b]=data/models/Llama-3.1-8B-Instruct.config.json
  [qwen25_7b]=data/models/Qwen2.5-7B-Instruct.config.json
)

TRACES=()
for r in azure_conv mooncake_conv; do
  for m in llama31_8b qwen25_7b; do
    for layout in tiered growth paged; do
      trace=$WORK/${r}_${m}_${layout}.csv
      # shellcheck disable=SC2086
      "$BENCH" generate serving ${REQUESTS[$r]} --model "${MODELS[$m]}" --kv-layout "$layout" -o "$trace" >&2
      TRACES+=("$trace")
    done
  done
done
"$BENCH" import-kineto data/traces/hta_kineto_trace_v100_rank1_profile_memory.json.gz -o "$WORK/gpu_kineto_v100.csv" >&2
TRACES+=("$WORK/gpu_kineto_v100.csv")
if [[ "${TRACES_ONLY:-0}" == 1 ]]; then
  printf '%s\n' "${TRACES[@]}"
  exit 0
fi

for trace in "${TRACES[@]}"; do
  base=${trace%.csv}
  echo "== $(basename "$base")" >&2
  "$BENCH" min-capacity "$trace" --allocator pytorch-policy "${COST_FLAGS[@]}" --json "$base.pt_min.json" >/dev/null 2>&1
  capacity=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["min_capacity_bytes"])' "$base.pt_min.json")
  "$BENCH" compare "$trace" --allocators "$ALLOCATORS" --capacity "$capacity" "${COST_FLAGS[@]}" \
    --json "$base.compare.json" >&2
done

python3 - "$WORK" "${TRACES[@]}" <<'EOF'
import json, sys
work, traces = sys.argv[1], sys.argv[2:]
gib = lambda b: f"{b / 2**30:.2f}"
def results():  # (trace name, one allocator's compare result), trace by trace
    for t in traces:
        rows = json.load(open(t[:-4] + ".compare.json"))
        for r in rows["results"] if isinstance(rows, dict) else rows:
            yield t.rsplit("/", 1)[-1][:-4], r
print("| trace | allocator | min capacity GiB | min / live | min / true need | frag. OOMs at C | backend calls at C | simulated backend ms at C |")
print("|---|---|---|---|---|---|---|---|")
for name, r in results():
    at, m = r["at_capacity"], r["min_capacity"]
    need = m.get("min_capacity_over_true_need")
    print(f"| {name} | {at['allocator']} | {gib(m['min_capacity_bytes'])} | {m['min_capacity_over_live']:.3f} | "
          f"{'' if need is None else f'{need:.3f}'} | {at['fragmentation_ooms']} | {at['backend_calls']} | "
          f"{at['simulated_backend_ms']:.1f} |")
# The driver's time at C, under the prices of the runs (its profile named in each row).
print()
print("| trace | allocator | profile | request-path ms | p99 us | background ms | synchronizations (after the peak) |")
print("|---|---|---|---|---|---|---|")
for name, r in results():
    d = r["at_capacity"]["driver_time"]
    print(f"| {name} | {r['at_capacity']['allocator']} | {d['profile']} | {d['request_path_ms']:,.0f} | "
          f"{d['p99_request_us']:,.0f} | {d['background_ms']:,.0f} | {d['synchronizations']:,} "
          f"({d['steady_synchronizations']:,}) |")
EOF
