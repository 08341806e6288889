#!/usr/bin/env bash
# tests/harness/check_bench_cli.sh BENCH [SOURCE_DIR] — bucketalloc-bench end to end on a small trace:
# replay and min-capacity print their tables and write the documented JSON keys; a bad trace line is
# named. With SOURCE_DIR: `generate serving` from the vendored data (data/) in the three KV layouts,
# their meta files, min_capacity_over_true_need, a multi-trace compare, and bad generator input.
set -uo pipefail
bench=$1
src=${2:-}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fail() { echo "check_bench_cli: FAIL: $*"; exit 1; }
cat >"$work/t.csv" <<'CSV'
Thread,Time,Action,Pointer,Size,Stream
1,00:00:00.000001,allocate,0xa,10485760,0x0
1,00:00:00.000002,allocate,0xb,20971520,0x0
1,00:00:00.000003,free,0xa,10485760,0x0
1,00:00:00.000004,allocate,0xc,5242880,0x0
1,00:00:00.000005,free,0xb,20971520,0x0
1,00:00:00.000006,free,0xc,5242880,0x0
CSV
out=$("$bench" replay "$work/t.csv" --allocator nocache --capacity 64MiB --json "$work/r.json") || fail "replay"
echo "$out"
grep -q "backend calls *6" <<<"$out" || fail "nocache should make 6 backend calls"
out=$("$bench" min-capacity "$work/t.csv" --allocator nocache --json "$work/m.json" 2>"$work/progress") || fail "min-capacity"
echo "$out"
grep -q "min capacity *30.00 MiB (1.000 x peak live)" <<<"$out" || fail "nocache's min capacity should be 30 MiB"
grep -q "min-capacity nocache:" "$work/progress" || fail "no progress on stderr"
/usr/bin/python3 -c "
import json, sys
r = json.load(open('$work/r.json')); m = json.load(open('$work/m.json'))
assert r['peak_live_bytes'] == 30 << 20 and r['ooms'] == 0 and r['backend_calls'] == 6, r
assert m['min_capacity_bytes'] == 30 << 20 and m['min_capacity_over_live'] == 1.0, m
" || fail "JSON results"
# Driver time (issue 43): every allocator's compare and min-capacity JSON carries it, under the profile chosen.
"$bench" compare "$work/t.csv" --capacity 64MiB --costs gpu2-published --json "$work/c.json" \
  --allocators bucketalloc,bucketalloc:backend:vmm,pytorch-policy,pytorch-expandable,nocache >/dev/null || fail "compare"
/usr/bin/python3 -c "
import json
keys = {'profile', 'total_ms', 'request_path_ms', 'background_ms', 'warmup_ms', 'steady_ms', 'p99_request_us',
        'synchronizations'}
rows = json.load(open('$work/c.json'))
assert len(rows) == 5, rows
for row in rows:
    for part in ('at_capacity', 'min_capacity'):
        d = row[part]['driver_time']
        assert keys <= set(d), (row[part]['allocator'], part, d)
        assert d['profile'] == 'gpu2-published', d
m = json.load(open('$work/m.json'))['driver_time']
assert m['profile'] == 'a100-published' and m['request_path_ms'] == m['total_ms'] == 0.18, m
" || fail "driver_time in compare's and min-capacity's JSON"
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0xa,16,0\n1,t,grab,0xa,16,0\n' >"$work/bad.csv"
err=$("$bench" replay "$work/bad.csv" --capacity 64MiB 2>&1) && fail "a bad trace was accepted"
grep -q "bad.csv:3: Action \"grab\" is unknown" <<<"$err" || fail "the bad line was not named: $err"
# Input that was accepted or misreported (issue 16): each is an error naming the flag or line.
expect_error() {  # expect_error NEEDLE ARGS...: the command fails and says NEEDLE, before any table
  local needle=$1; shift
  local err
  err=$("$bench" "$@" 2>&1) && fail "accepted: $*"
  grep -qF -- "$needle" <<<"$err" || fail "$*: expected \"$needle\", got: $err"
  grep -q "^bucketalloc " <<<"$err" && fail "$*: a table row was printed before the error: $err"
  return 0
}
expect_error "the allocator list is empty; accepted:" compare "$work/t.csv" --allocators '' --capacity 64MiB
expect_error 'allocator "jemalloc" is unknown' compare "$work/t.csv" --allocators bucketalloc,jemalloc --capacity 64MiB
expect_error "capacity 5120GiB is more than the simulated device can hold; accepted: 2MiB to 4096GiB" \
  replay "$work/t.csv" --capacity 5TiB
expect_error "cost --malloc-us nan: accepted a number of microseconds from 0 to 1000000" \
  replay "$work/t.csv" --capacity 64MiB --malloc-us nan
expect_error "cost --free-us inf" replay "$work/t.csv" --capacity 64MiB --free-us inf
expect_error "cost --vmm-call-us -1" min-capacity "$work/t.csv" --vmm-call-us -1
expect_error 'cost profile "h100" is not built in; accepted: a100-published, gpu2-published, flat, or the path' \
  compare "$work/t.csv" --allocators bucketalloc --capacity 64MiB --costs h100
echo '{"profile": "x", "calls": {"cudaMalloc": []}}' >"$work/costs.json"
expect_error "calls.cudaMalloc is not an array of 1 to 64" replay "$work/t.csv" --capacity 64MiB --costs "$work/costs.json"
printf '\x01\x02\xff\xfe binary\n' >"$work/binary.csv"
expect_error 'found "\x01\x02\xff\xfe binary"' replay "$work/binary.csv" --capacity 64MiB
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0xa,18446744073709551615,0\n' >"$work/huge.csv"
for a in bucketalloc pytorch-policy nocache; do
  expect_error "huge.csv:2: Size 18446744073709551615 is larger than any allocator accepts" \
    replay "$work/huge.csv" --allocator "$a" --capacity 64MiB
done
echo '{"traceEvents":[{"name":5,"ts":1,"args":{"Addr":4096,"Bytes":1}}]}' >"$work/k1.json"
expect_error '"name" is 5; accepted: a string' import-kineto "$work/k1.json" -o "$work/k.csv"
echo '{"traceEvents":[{"name":"[memory]","ts":"abc","args":{"Addr":4096,"Bytes":1}}]}' >"$work/k2.json"
expect_error '"ts" is "abc"' import-kineto "$work/k2.json" -o "$work/k.csv"
out=$("$bench" compare "$work/t.csv" --allocators bucketalloc,pytorch-policy,nocache --capacity 64MiB \
      --json "$work/c.json") || fail "compare"
echo "$out"
(($(grep -cE "^(bucketalloc|pytorch-policy|nocache) " <<<"$out") == 3)) || fail "compare should print 3 rows"
/usr/bin/python3 -c "
import json
c = json.load(open('$work/c.json'))
assert [x['at_capacity']['allocator'] for x in c] == ['bucketalloc', 'pytorch-policy', 'nocache']
assert c[2]['min_capacity']['min_capacity_bytes'] == 30 << 20 and c[2]['at_capacity']['backend_calls'] == 6
" || fail "compare JSON"
err=$("$bench" replay "$work/t.csv" --capacity 64MiB --device tpu 2>&1) && fail "--device tpu was accepted"
grep -q "\-\-device tpu: accepted sim or cuda" <<<"$err" || fail "bad --device: $err"
printf 'ts_us,ev_idx,device_type,device_id,addr,bytes\n1,1,1,0,4096,3145728\n2,2,1,0,4096,-3145728\n' >"$work/k.csv"
out=$("$bench" import-kineto "$work/k.csv" -o "$work/k_trace.csv") || fail "import-kineto"
grep -q "2 events, peak live 3.00 MiB" <<<"$out" || fail "import-kineto: $out"
"$bench" replay "$work/k_trace.csv" --capacity 64MiB >/dev/null || fail "the imported trace does not replay"
if [[ -n $src ]]; then
  requests=$src/data/requests/azure_llm_inference_trace_2023_conv.csv
  model=$src/data/models/Llama-3.1-8B-Instruct.config.json
  for layout in tiered growth paged; do
    out=$("$bench" generate serving --requests "$requests" --model "$model" --limit 40 --time-scale 0.05 \
          --kv-layout "$layout" -o "$work/s_$layout.csv") || fail "generate serving --kv-layout $layout"
    echo "$out"
    grep -q "requests 40 served" <<<"$out" || fail "generate should serve 40 requests: $out"
    [[ -f $work/s_$layout.meta.json ]] || fail "no meta file beside the $layout trace"
  done
  /usr/bin/python3 -c "
import json
m = [json.load(open('$work/s_%s.meta.json' % l)) for l in ('tiered', 'growth', 'paged')]
assert len({x['true_peak_need_bytes'] for x in m}) == 1, 'the true need must not depend on the layout'
for x in m:
    assert x['model']['kv_bytes_per_token'] == 131072 and x['served'] == 40, x
    assert x['weight_bytes'] < x['true_peak_need_bytes'] <= x['peak_live_bytes'], x
assert m[0]['options']['kv_layout'] == 'tiered' and m[2]['options']['kv_pool_tokens'] > 0
assert m[0]['bucketalloc_tiers_conf'].startswith('tiers_tokens:[1024,') and m[0]['bucketalloc_tiers_conf'].endswith(',bytes_per_token:2048'), m[0]
assert m[2]['bucketalloc_tiers_conf'] == ''
" || fail "meta files"
  cmp -s <("$bench" generate serving --requests "$requests" --model "$model" --limit 40 --time-scale 0.05 \
           -o "$work/again.csv" >/dev/null && cat "$work/again.csv") "$work/s_tiered.csv" ||
    fail "the generator is not deterministic"
  out=$("$bench" min-capacity "$work/s_paged.csv" --allocator bucketalloc --json "$work/sm.json" 2>/dev/null) ||
    fail "min-capacity of a generated trace"
  grep -q "true need (meta file)" <<<"$out" || fail "min-capacity should show the true need: $out"
  /usr/bin/python3 -c "
import json
m = json.load(open('$work/sm.json'))
assert m['min_capacity_over_true_need'] >= 1.0 and m['true_need_bytes'] > 0, m
" || fail "min_capacity_over_true_need"
  out=$("$bench" compare "$work/s_tiered.csv" "$work/s_paged.csv" --allocators bucketalloc,pytorch-policy \
        --capacity 40GiB --json "$work/sc.json") || fail "compare of two traces"
  echo "$out"
  /usr/bin/python3 -c "
import json
c = json.load(open('$work/sc.json'))
assert [x['trace'].rsplit('/', 1)[-1] for x in c] == ['s_tiered.csv'] * 2 + ['s_paged.csv'] * 2, c
assert all('min_capacity_over_true_need' in x['min_capacity'] for x in c)
" || fail "compare JSON of two traces"
  err=$("$bench" generate serving --requests "$requests" --model "$model" --kv-layout blocks -o "$work/x.csv" 2>&1) &&
    fail "a bad --kv-layout was accepted"
  grep -q "accepted tiered, growth or paged" <<<"$err" || fail "bad --kv-layout: $err"
  err=$("$bench" generate serving --requests "$model" --model "$model" -o "$work/x.csv" 2>&1) &&
    fail "a config was accepted as requests"
  grep -q "config.json:1: not a JSON object; a request file that starts with '{' is read as Mooncake" <<<"$err" ||
    fail "bad requests: $err"
  echo '{"model_type":"gemma"}' >"$work/gemma.json"
  err=$("$bench" generate serving --requests "$requests" --model "$work/gemma.json" -o "$work/x.csv" 2>&1) &&
    fail "an unmodelled model was accepted"
  grep -q "modelled: llama" <<<"$err" || fail "bad model: $err"
  # plan: the budget, the profile and the settings, checked by replay; the check's command writes
  # the same trace, which serves its requests with no OOM at the budget.
  out=$("$bench" plan --model "$model" --card 24GiB --requests "$requests" --check-requests 40 \
        --json "$work/plan.json" --html "$work/plan.html") || fail "plan: $out"
  echo "$out"
  grep -q "parameters 8.03 billion; weights per GPU 14.96 GiB; KV per token per GPU 128.00 KiB" <<<"$out" ||
    fail "plan: $out"
  grep -q '<section id="plan">' "$work/plan.html" || fail "plan --html"
  /usr/bin/python3 -c "
import json
p = json.load(open('$work/plan.json'))
assert p['fits'] and p['max_num_seqs'] >= 1 and p['max_model_len'] >= 4259, p
assert p['kv_bytes_per_token'] == 131072 and p['weights_bytes'] == 2 * 8030261248, p
assert p['measured_margin_bytes'] >= 0 and p['smallest_card_bytes'] == 20 * 2**30, p
assert [b['bucket'] for b in p['buckets']] == ['S', 'M', 'L', 'XL'], p
paged = [c for c in p['checks'] if c['what'] == 'recommended' and c['layout'] == 'paged'][0]
print(paged['command'].replace('TRACE.csv', '$work/planned.csv'))
print(p['budget_bytes'])
" >"$work/plan_cmd" || fail "plan --json"
  read -r -a cmd < <(sed -n 1p "$work/plan_cmd")
  budget=$(sed -n 2p "$work/plan_cmd")
  "$bench" "${cmd[@]:1}" >/dev/null || fail "the plan's command: ${cmd[*]}"
  out=$("$bench" replay "$work/planned.csv" --allocator pytorch-policy --capacity "$budget") || fail "replay planned"
  grep -Eq "^OOMs +0 " <<<"$out" || fail "the planned trace has OOMs at the budget: $out"
  out=$("$bench" plan --model "$model" --card 16GiB --requests "$requests" --no-check --json "$work/small.json") ||
    fail "plan on a small card: $out"
  grep -q "the card is too small" <<<"$out" || fail "plan on 16 GiB: $out"
  err=$("$bench" plan --model "$model" --card 80GiB --dtype fp4 2>&1) && fail "plan --dtype fp4 was accepted"
  grep -q "accepted bf16, fp16, fp8 or int4" <<<"$err" || fail "plan --dtype: $err"
  # generate serving with a GPU's share: fp8 weights over 2 GPUs.
  out=$("$bench" generate serving --requests "$requests" --model "$model" --limit 10 --dtype fp8 \
        --tensor-parallel 2 -o "$work/tp.csv") || fail "generate --dtype --tensor-parallel: $out"
  /usr/bin/python3 -c "
import json
m = json.load(open('$work/tp.meta.json'))
assert m['weight_bytes'] == (6979321856 + 2 * 1050673152) // 2 + 2 * 266240, m['weight_bytes']
assert m['model']['kv_bytes_per_token'] == 65536, m
" || fail "generate --dtype fp8 --tensor-parallel 2"
  # --tenant-split and a tenant CONF: the demo's burst of long requests over steady short ones
  # (scripts/long_burst_requests.py, smaller here): one shared pool fails short requests (stream 0),
  # a pool for the long ones keeps them at zero; min-capacity counts only what a card could serve.
  /usr/bin/python3 "$src/scripts/long_burst_requests.py" "$requests" "$work/burst.csv" --short 150 --long 12 --at 10 \
    >/dev/null || fail "long_burst_requests.py"
  "$bench" generate serving --requests "$work/burst.csv" --model "$model" --tenant-split 4096 \
    -o "$work/burst_trace.csv" | grep -q "12 requests longer than 4096 tokens" || fail "generate --tenant-split"
  tiers=$(/usr/bin/python3 -c "import json; print(json.load(open('$work/burst_trace.meta.json'))['bucketalloc_tiers_conf'])")
  out=$("$bench" replay "$work/burst_trace.csv" --capacity 24GiB --allocator "bucketalloc:$tiers" \
        --json "$work/shared.json") || fail "replay shared: $out"
  out=$("$bench" replay "$work/burst_trace.csv" --capacity 24GiB --allocator "bucketalloc:$tiers,tenants:[long:3GiB]" \
        --json "$work/split.json") || fail "replay split: $out"
  echo "$out"
  grep -q "tenant long .* of its cap 3.00 GiB" <<<"$out" || fail "replay split: $out"
  /usr/bin/python3 -c "
import json
shared, split = json.load(open('$work/shared.json')), json.load(open('$work/split.json'))
assert shared['ooms_by_stream'].get('0', 0) > 0, shared
assert split['ooms_by_stream'].get('0', 0) == 0 and split['ooms_by_stream']['2'] > 0, split
assert [t['tenant'] for t in split['tenants']] == ['default', 'long'], split
assert split['tenants'][0]['ooms'] == 0 and split['tenants'][1]['ooms_at_cap'] == split['tenant_cap_ooms'] > 0, split
" || fail "the two-tenant replay"
  out=$("$bench" min-capacity "$work/burst_trace.csv" --allocator "bucketalloc:$tiers,tenants:[long:3GiB]") ||
    fail "min-capacity with tenants: $out"
  # Issue 27 (10): the OOMs at the long tenant's cap are cause tenant_cap in the replay's count, its
  # timeline and the doctor's verdict, whose lever names the tenant's cap (not tiers or stitching).
  grep -q "tenant cap [0-9]*: a tenant's own cap refused them" <<<"$("$bench" replay "$work/burst_trace.csv" \
    --capacity 24GiB --allocator "bucketalloc:$tiers,tenants:[long:3GiB]" --timeline "$work/split.jsonl,1000")" ||
    fail "replay split: no tenant cap count"
  out=$("$bench" doctor "$work/split.jsonl") || fail "doctor on the two-tenant timeline: $out"
  grep -q "^device 0: tenant_cap" <<<"$out" && grep -q "raise tenant 'long' (cap 3.00 GiB)'s cap" <<<"$out" ||
    fail "doctor on the two-tenant timeline names no tenant cap: $out"
  ! grep -q "^device 0: fragmentation" <<<"$out" || fail "doctor calls tenant-cap OOMs fragmentation: $out"
  err=$("$bench" generate serving --requests "$work/burst.csv" --model "$model" --kv-layout paged --tenant-split 4096 \
        -o "$work/x.csv" 2>&1) && fail "--tenant-split with the paged layout was accepted"
  grep -q "tiered or growth layout" <<<"$err" || fail "--tenant-split paged: $err"
fi
# doctor: a timeline written by replay --timeline, the trace itself, a repeat, a snapshot with and
# without history, and what it refuses.
{
  echo "Thread,Time,Action,Pointer,Size,Stream"
  # 40 s at 32 MiB, then a jump to 96 MiB that live memory explains (a long request), kept to the end.
  for i in $(seq 0 39); do printf '1,00:00:%02d.000000,allocate,0x%x,33554432,0x0\n' "$i" $((0x1000 + i)); \
    printf '1,00:00:%02d.500000,free,0x%x,33554432,0x0\n' "$i" $((0x1000 + i)); done
  echo "1,00:00:40.000000,allocate,0xbig,100663296,0x0"
  for i in $(seq 41 59); do printf '1,00:00:%02d.000000,allocate,0x%x,1048576,0x0\n' "$i" $((0x2000 + i)); \
    printf '1,00:00:%02d.500000,free,0x%x,1048576,0x0\n' "$i" $((0x2000 + i)); done
} | sed 's/0xbig/0xb16/' >"$work/spike.csv"
"$bench" replay "$work/spike.csv" --capacity 256MiB --timeline "$work/spike.jsonl,500" >/dev/null || fail "replay --timeline"
[[ $(grep -c time_s "$work/spike.jsonl") -ge 100 ]] || fail "replay --timeline: $(wc -l <"$work/spike.jsonl") lines"
out=$("$bench" doctor "$work/spike.jsonl" --json "$work/d.json" --html "$work/d.html") || fail "doctor TIMELINE: $out"
echo "$out"
grep -q "device 0: spike_long_request" <<<"$out" || fail "doctor: no spike_long_request"
grep -q 'data-verdict="spike_long_request"' "$work/d.html" || fail "doctor --html: no verdict"
/usr/bin/python3 -c "
import json
d = json.load(open('$work/d.json'))
assert [v['verdict'] for v in d['verdicts']] == ['spike_long_request'], d
assert all(set(v) == {'verdict', 'evidence', 'lever', 'from_s', 'to_s', 'device'} for v in d['verdicts']), d
" || fail "doctor --json"
out=$("$bench" doctor "$work/spike.csv" --capacity 256MiB --allocator pytorch-policy) || fail "doctor TRACE: $out"
grep -q "(trace, .* samples)" <<<"$out" && grep -q "spike_long_request" <<<"$out" || fail "doctor TRACE: $out"
out=$("$bench" doctor "$work/t.csv" --capacity 64MiB --repeat 3) || fail "doctor --repeat: $out"
grep -q "device 0:" <<<"$out" || fail "doctor --repeat: $out"
err=$("$bench" doctor "$work/spike.csv" 2>&1) && fail "a trace without --capacity was diagnosed"
grep -q "needs --capacity SIZE" <<<"$err" || fail "doctor without --capacity: $err"
echo "garbage" >"$work/garbage.txt"
err=$("$bench" doctor "$work/garbage.txt" --capacity 1GiB 2>&1) && fail "garbage was diagnosed"
grep -q "is neither a timeline (JSON lines), a snapshot (JSON) nor a trace (RMM CSV)" <<<"$err" || fail "garbage: $err"
# A snapshot without history: the moment its segments show (here: most of the reserved memory is cache).
echo '{"segments": [{"device": 0, "total_size": 104857600, "allocated_size": 10485760, "active_size": 10485760,
  "requested_size": 10485760, "blocks": [{"size": 10485760, "state": "active_allocated"},
  {"size": 94371840, "state": "inactive"}]}], "device_traces": [[]]}' >"$work/snap.json"
# On a card of 108 MiB the reserved memory is near the cap: cache held in the way.
out=$("$bench" doctor "$work/snap.json" --capacity 108MiB) || fail "doctor SNAPSHOT: $out"
grep -q "(snapshot, 1 samples)" <<<"$out" && grep -q "device 0: cache_held" <<<"$out" || fail "doctor SNAPSHOT: $out"
# On a card of 512 MiB memory is not short: healthy, the cache said.
out=$("$bench" doctor "$work/snap.json" --capacity 512MiB) || fail "doctor SNAPSHOT: $out"
grep -q "device 0: healthy" <<<"$out" && grep -q "never short" <<<"$out" || fail "doctor SNAPSHOT on 512 MiB: $out"
err=$("$bench" doctor "$work/snap.json" 2>&1) && fail "a snapshot without history was diagnosed without --capacity"
grep -q "capacity" <<<"$err" || fail "doctor SNAPSHOT without --capacity: $err"
# With history: replayed.
echo '{"segments": [], "device_traces": [[
  {"action": "alloc", "addr": 4096, "size": 1048576, "time_us": 0, "stream": 0},
  {"action": "free_requested", "addr": 4096, "size": 1048576, "time_us": 5, "stream": 0},
  {"action": "free_completed", "addr": 4096, "size": 1048576, "time_us": 10, "stream": 0}]]}' >"$work/hist.json"
out=$("$bench" doctor "$work/hist.json" --capacity 64MiB) || fail "doctor SNAPSHOT with history: $out"
grep -q "(snapshot, .* samples)" <<<"$out" || fail "doctor SNAPSHOT with history: $out"
# Issue 27: a replay device that cannot be made is an error for every policy, never an abort (7);
# a doctor input with nothing readable, or figures no sample shows, is not "healthy" (8); many
# devices take one pass (9); a byte-order mark, a directory, an empty --timeline (14).
if (ulimit -v 4194304 && "$bench" replay "$work/t.csv" --allocator nocache --capacity 64MiB >/dev/null 2>&1); then
  for a in bucketalloc bucketalloc:backend:vmm pytorch-policy; do
    err=$(ulimit -v 4194304; "$bench" replay "$work/t.csv" --allocator "$a" --capacity 80GiB 2>&1)
    rc=$?
    [[ $rc == 1 ]] || fail "replay --allocator $a under ulimit -v: exit $rc (not 1): $err"
    grep -q "the simulated replay device of 80GiB cannot be made: .*; accepted: a --capacity whose address space" \
      <<<"$err" || fail "replay --allocator $a under ulimit -v: $err"
  done
  err=$(ulimit -v 4194304; "$bench" doctor "$work/t.csv" --capacity 80GiB 2>&1)
  rc=$?
  [[ $rc == 1 ]] && grep -q "replay device of 80GiB cannot be made" <<<"$err" ||
    fail "doctor TRACE under ulimit -v: exit $rc: $err"
else
  echo "check_bench_cli: the bench does not run under ulimit -v 4194304 (a sanitizer build?): its checks skipped"
fi
expect_error '--timeline "": timeline "" names no file; accepted: PATH[,interval_ms]' \
  replay "$work/t.csv" --capacity 64MiB --timeline ""
expect_error '--timeline ",500": timeline ",500" names no file' replay "$work/t.csv" --capacity 64MiB --timeline ",500"
line=$(head -1 "$work/spike.jsonl")
expect_doctor_error() {  # expect_doctor_error NEEDLE FILE: doctor FILE fails naming FILE and NEEDLE
  local needle=$1 file=$2 err
  err=$("$bench" doctor "$file" 2>&1) && fail "doctor accepted $file: $err"
  grep -qF -- "$file" <<<"$err" && grep -qF -- "$needle" <<<"$err" || fail "doctor $file: expected \"$needle\": $err"
  grep -q "healthy" <<<"$err" && fail "doctor $file: called healthy: $err"
  return 0
}
printf '%s' "${line:0:120}" >"$work/cut.jsonl"
expect_doctor_error "holds no timeline sample (its only line is cut off or not a sample" "$work/cut.jsonl"
printf '{garbage' >"$work/garbage.json"
expect_doctor_error "holds no timeline sample" "$work/garbage.json"
printf '{"allocated_bytes.all.current": 0, "num_ooms": 0}' >"$work/stats.json"  # bucketalloc_stats_json
expect_doctor_error "expected a file: a timeline (JSON lines" "$work/stats.json"
: >"$work/empty.jsonl"
expect_doctor_error "is empty; expected a file" "$work/empty.jsonl"
mkdir "$work/dir"
expect_doctor_error "is a directory; expected a file" "$work/dir"
sed 's/"device":0,/"device":65536,/' "$work/spike.jsonl" >"$work/d65536.jsonl"
expect_doctor_error "is of device 65536; accepted: devices 0 to 65535" "$work/d65536.jsonl"
printf '\xef\xbb\xbf' | cat - "$work/spike.jsonl" >"$work/bom.jsonl"
out=$("$bench" doctor "$work/bom.jsonl") || fail "doctor with a byte-order mark: $out"
grep -q "device 0: spike_long_request" <<<"$out" || fail "doctor with a byte-order mark: $out"
sed '5s/.*/{"time_s": 2.0, "dev/' "$work/spike.jsonl" >"$work/damaged.jsonl"  # a line cut, then the next one
out=$("$bench" doctor "$work/damaged.jsonl" 2>"$work/damaged.err") || fail "doctor with a damaged line: $out"
grep -q "device 0: spike_long_request" <<<"$out" || fail "doctor with a damaged line: $out"
grep -q "damaged.jsonl:5: not a timeline sample: .*; skipped" "$work/damaged.err" ||
  fail "doctor with a damaged line: no warning: $(cat "$work/damaged.err")"
# 1 TiB reserved under a 1 MiB cap was "healthy, 104857600% of the cap": now said (over_cap), not
# healthy; a cap lowered below what was reserved shows it too, so it is no contradiction.
sed 's/"capacity_bytes":[0-9]*/"capacity_bytes":1048576/; s/"reserved_bytes":[0-9]*/"reserved_bytes":1099511627776/' \
  "$work/spike.jsonl" >"$work/overcap.jsonl"
out=$("$bench" doctor "$work/overcap.jsonl") || fail "reserved above the cap: $out"
grep -q "device 0: over_cap" <<<"$out" && grep -q "104857600% of the 1.00 MiB cap" <<<"$out" ||
  fail "reserved above the cap: $out"
grep -q "healthy" <<<"$out" && fail "reserved above the cap called healthy: $out"
# Live memory above the reserved memory that holds it: no bucketalloc sample shows that.
sed 's/"allocated_bytes":[0-9]*/"allocated_bytes":1099511627776/' "$work/spike.jsonl" >"$work/impossible.jsonl"
out=$("$bench" doctor "$work/impossible.jsonl" --json "$work/i.json" 2>"$work/i.err") && fail "impossible figures: $out"
grep -q "device 0: inconsistent" <<<"$out" && grep -q "samples contradict themselves" <<<"$out" ||
  fail "impossible figures: $out"
grep -q "healthy" <<<"$out" && fail "impossible figures called healthy: $out"
grep -q "not a bucketalloc timeline, or a corrupted one" "$work/i.err" || fail "impossible figures: $(cat "$work/i.err")"
grep -q '"verdict": "inconsistent"' "$work/i.json" || fail "impossible figures --json: $(cat "$work/i.json")"
# 80,000 lines over 40,000 devices: about a second with one pass; quadratic (each device over every
# line), it took over 30 s.
/usr/bin/python3 - "$line" "$work/many.jsonl" <<'PY'
import json, sys
sample = json.loads(sys.argv[1])
with open(sys.argv[2], "w") as f:
    for i in range(80000):
        sample["time_s"], sample["device"] = float(i // 40000), i % 40000
        f.write(json.dumps(sample, separators=(",", ":")) + "\n")
PY
start=$SECONDS
out=$(timeout 10 "$bench" doctor "$work/many.jsonl" --html "$work/many.html") || fail "doctor on 40,000 devices: exit $?"
[[ $(grep -c "^device [0-9]*: " <<<"$out") == 40000 ]] || fail "doctor on 40,000 devices: not one verdict each"
echo "doctor on 80,000 lines over 40,000 devices: $((SECONDS - start)) s"
# Every writer reports a failed write, to the file's close (issue 42 item 7): /dev/full opens, then
# fails the write, so a tool that checks the stream before closing it exits 0 with nothing written.
if [[ -w /dev/full ]]; then
  full_fails() {  # full_fails ARGS...: the command exits non-zero, saying the write failed
    local err
    err=$("$bench" "$@" 2>&1 >/dev/null) && fail "a failed write went unreported: $*"
    grep -q "/dev/full: writing .* failed: No space left on device" <<<"$err" || fail "$*: got: $err"
  }
  full_fails replay "$work/t.csv" --capacity 64MiB --json /dev/full
  full_fails replay "$work/t.csv" --capacity 64MiB --timeline /dev/full,1
  full_fails min-capacity "$work/t.csv" --allocator nocache --json /dev/full
  full_fails compare "$work/t.csv" --allocators nocache --capacity 64MiB --json /dev/full
  full_fails compare "$work/t.csv" --allocators nocache --capacity 64MiB --html /dev/full
  full_fails doctor "$work/t.csv" --capacity 64MiB --json /dev/full
  full_fails doctor "$work/t.csv" --capacity 64MiB --html /dev/full
  full_fails import-kineto "$work/k.csv" -o /dev/full
  full_fails tune "$work/t.csv" --jobs 1 --json /dev/full
  full_fails tune "$work/t.csv" --jobs 1 --html /dev/full
  if [[ -n $src ]]; then
    full_fails generate serving --requests "$requests" --model "$model" --limit 5 -o /dev/full
    full_fails plan --model "$model" --card 80GiB --requests "$requests" --check-requests 20 --json /dev/full
    full_fails plan --model "$model" --card 80GiB --requests "$requests" --check-requests 20 --html /dev/full
  fi
  err=$("$bench" replay "$work/t.csv" --capacity 64MiB 2>&1 >/dev/full) && fail "a failed standard output went unreported"
  grep -q "writing the standard output failed: No space left on device" <<<"$err" || fail "standard output: $err"
else
  echo "check_bench_cli: WARNING: /dev/full is not writable here: the failed-write checks did NOT run" >&2
fi
echo "check_bench_cli: PASS"
