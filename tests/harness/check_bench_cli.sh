#!/usr/bin/env bash
# tests/harness/check_bench_cli.sh BENCH — bucketalloc-bench end to end on a small trace: replay and
# min-capacity print their tables and write the documented JSON keys; a bad trace line is named.
set -uo pipefail
bench=$1
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
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0xa,16,0\n1,t,grab,0xa,16,0\n' >"$work/bad.csv"
err=$("$bench" replay "$work/bad.csv" --capacity 64MiB 2>&1) && fail "a bad trace was accepted"
grep -q "bad.csv:3: Action \"grab\" is unknown" <<<"$err" || fail "the bad line was not named: $err"
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
printf 'ts_us,ev_idx,device_type,device_id,addr,bytes\n1,1,1,0,4096,3145728\n2,2,1,0,4096,-3145728\n' >"$work/k.csv"
out=$("$bench" import-kineto "$work/k.csv" -o "$work/k_trace.csv") || fail "import-kineto"
grep -q "2 events, peak live 3.00 MiB" <<<"$out" || fail "import-kineto: $out"
"$bench" replay "$work/k_trace.csv" --capacity 64MiB >/dev/null || fail "the imported trace does not replay"
echo "check_bench_cli: PASS"
