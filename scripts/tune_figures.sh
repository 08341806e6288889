#!/usr/bin/env bash
# scripts/tune_figures.sh — `bucketalloc-bench tune` over the 13 traces of scripts/harness_figures.sh (12
# generated serving traces, two request files x two models x three KV layouts, and the real GPU
# trace): for each, bucketalloc's default, tune's recommended bucketalloc CONF and its recommended
# PyTorch CONF, each on the part tune held out (the trace's second half), as min capacity / that
# part's peak live bytes, and the simulated backend time at min capacity of the default and of the
# recommendation. A markdown table goes to stdout (docs/harness.md, "Tune"); each trace's
# tune JSON stays in $WORK.
#
# Usage: scripts/tune_figures.sh
# Environment: as scripts/harness_figures.sh (BENCH, DATA, WORK, AZURE_LIMIT, MOONCAKE_LIMIT); JOBS,
# tune's threads (default 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BENCH=${BENCH:-build/release/tools/bucketalloc-bench}
WORK=${WORK:-/tmp/harness_figures}
export BENCH WORK
mapfile -t TRACES < <(TRACES_ONLY=1 scripts/harness_figures.sh)
for trace in "${TRACES[@]}"; do
  echo "== $(basename "$trace")" >&2
  start=$SECONDS
  "$BENCH" tune "$trace" --jobs "${JOBS:-2}" --json "${trace%.csv}.tune.json" 2>/dev/null | grep -E "^recommended" >&2
  echo "   $((SECONDS - start)) s" >&2
done
/usr/bin/python3 - "${TRACES[@]}" <<'PY'
import json, sys
def ratio(f, live):
    return f"{f['min_capacity_bytes'] / live:.4f}" if f else "-"
def ms(f):
    return f"{f['simulated_backend_ms']:.0f}" if f else "-"
print("| trace | bucketalloc default | pytorch-policy | bucketalloc:backend:vmm | pytorch-expandable | tune: bucketalloc | tune: PyTorch | backend ms: default / tune bucketalloc | recommended bucketalloc CONF | recommended PYTORCH_CUDA_ALLOC_CONF | tune s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for t in sys.argv[1:]:
    j = json.load(open(t[:-4] + ".tune.json"))
    live = j["held_out_part"]["peak_live_bytes"]
    held = {p["allocator"]: p["held_out_part"] for p in j["points"]}
    b, p = j["bucketalloc"], j["pytorch"]
    name = t.rsplit("/", 1)[-1][:-4]
    print(f"| {name} | {ratio(held.get('bucketalloc'), live)} | {ratio(held.get('pytorch-policy'), live)} | "
          f"{ratio(held.get('bucketalloc:backend:vmm'), live)} | {ratio(held.get('pytorch-expandable'), live)} | "
          f"{ratio(b['held_out_part'], live)} | {ratio(p['held_out_part'], live)} | "
          f"{ms(held.get('bucketalloc'))} / {ms(b['held_out_part'])} | `{b['BUCKETALLOC_CONF'] or '(default)'}` | "
          f"`{p['PYTORCH_CUDA_ALLOC_CONF'] or '(default)'}` | {j['seconds']:.0f} |")
PY
