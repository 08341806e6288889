#!/usr/bin/env bash
# scripts/demo.sh — the main job: set up, build, and run the harness demo (docs/harness.md).
#
#  1. `bucketalloc-bench generate serving` turns the first 1000 requests of the Azure LLM
#     conversation trace (data/requests, arriving 10x faster than recorded) and the
#     Llama-3.1-8B-Instruct config (data/models) into the allocation trace a PyTorch server with
#     per-request KV tensors in token tiers would produce (demo_out/serving_tiered.csv, with its
#     meta file: the workload's true peak need);
#  2. `bucketalloc-bench compare` replays it on an 80 GiB card (DEMO_CAPACITY; the trace's peak of
#     live bytes is 78.7 GiB, and PyTorch's policy and bucketalloc's defaults need a little more, so
#     they show fragmentation OOMs where tiers do not) with bucketalloc (defaults), bucketalloc with tiers for this model's
#     K/V tensors (the BUCKETALLOC_CONF the generator prints and records in the meta file:
#     tiers_tokens over bytes_per_token = kv_heads x head_dim x 2 B = 2048), bucketalloc with
#     virtual-memory stitching (backend:vmm, docs/vmm.md), pytorch-policy (PyTorch's caching
#     policy), pytorch-expandable (the same with expandable_segments:True, what PyTorch's OOM
#     message recommends) and nocache (cudaMalloc per request); it prints the table and writes
#     demo_out/report.html (charts of live vs reserved bytes and the free-block histograms; it opens
#     offline);
#  3. tenants (docs/configuration.md): steady short requests of the same trace with a burst of 48
#     long ones (scripts/long_burst_requests.py), generated with --tenant-split 4096 (long requests'
#     KV tensors on their own stream) and replayed on a 40 GiB card (DEMO_TENANT_CAPACITY) twice with
#     the tiers: in one shared pool the burst takes the memory the short requests need, and they fail;
#     with tenants:[long:12GiB] the long requests fail against their own cap and the short ones
#     (the default tenant) not once; each tenant's peak is what it needed.
# Replays run on the simulated device (unbacked: no GPU needed); `--device cuda` in
# bucketalloc-bench replays on a GPU. Environment: DEMO_OUT (demo_out), DEMO_CAPACITY (80GiB),
# DEMO_LIMIT (1000), DEMO_TENANT_CAPACITY (40GiB), JOBS (2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="${CUDA_HOME:-/usr/local/cuda}" >/dev/null
ninja -C build/release -j"${JOBS:-2}" bucketalloc_bench
bench=build/release/tools/bucketalloc-bench
out=${DEMO_OUT:-demo_out}
mkdir -p "$out"

echo "== generate: Azure conversation trace x Llama-3.1-8B-Instruct, tiered KV tensors"
"$bench" generate serving --requests data/requests/azure_llm_inference_trace_2023_conv.csv \
  --model data/models/Llama-3.1-8B-Instruct.config.json --limit "${DEMO_LIMIT:-1000}" --time-scale 0.1 \
  --kv-layout tiered -o "$out/serving_tiered.csv"

tiers=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bucketalloc_tiers_conf"])' \
  "$out/serving_tiered.meta.json")
[[ -n $tiers ]] || { echo "demo: the trace's meta file names no bucketalloc tiers (no K/V tensor above 1 MiB)" >&2; exit 1; }

echo
echo "== compare on a ${DEMO_CAPACITY:-80GiB} card (each allocator's own smallest card is searched too)"
"$bench" compare "$out/serving_tiered.csv" --capacity "${DEMO_CAPACITY:-80GiB}" \
  --allocators "bucketalloc,bucketalloc:$tiers,bucketalloc:backend:vmm,pytorch-policy,pytorch-expandable,nocache" \
  --json "$out/compare.json" --html "$out/report.html"

echo
echo "== tenants: short requests with a burst of long ones, one shared pool vs a pool for the long ones"
python3 scripts/long_burst_requests.py data/requests/azure_llm_inference_trace_2023_conv.csv "$out/requests_burst.csv"
"$bench" generate serving --requests "$out/requests_burst.csv" \
  --model data/models/Llama-3.1-8B-Instruct.config.json --kv-layout tiered --tenant-split 4096 \
  -o "$out/serving_burst.csv"
burst_tiers=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bucketalloc_tiers_conf"])' \
  "$out/serving_burst.meta.json")
for conf in "$burst_tiers" "$burst_tiers,tenants:[long:12GiB]"; do
  echo
  "$bench" replay "$out/serving_burst.csv" --capacity "${DEMO_TENANT_CAPACITY:-40GiB}" --allocator "bucketalloc:$conf" \
    --json "$out/replay_$([[ $conf == *tenants* ]] && echo split || echo shared).json"
done
