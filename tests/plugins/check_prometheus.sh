#!/usr/bin/env bash
# tests/plugins/check_prometheus.sh HOST — bucketalloc's metrics as a real Prometheus sees them.
# HOST (tests/plugins/metrics_host.c) links libbucketalloc.so and runs with
# BUCKETALLOC_METRICS_ADDR=127.0.0.1:PORT; then:
#   1. GET /metrics answers with Prometheus's content type, and `promtool check metrics` passes
#      on the text (the format and the naming conventions);
#   2. Prometheus (Debian's package, started here on 127.0.0.1 with a 1 s scrape of HOST) scrapes
#      it, and PromQL queries through its HTTP API return bucketalloc's series with the values the
#      host reported (allocated bytes, allocations, frees, OOMs by cause);
#   3. a bad address and a port already taken are reported once on stderr and change nothing else;
#   4. the timeline the host wrote meanwhile (BUCKETALLOC_TIMELINE) has its lines and its OOM.
# Everything started here is stopped on exit. prometheus, promtool and curl come from
# scripts/setup.sh; without them this test fails, it does not skip.
set -uo pipefail
host=$1
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "check_prometheus: FAIL: $*"; [[ -f "$work/prometheus.log" ]] && tail -20 "$work/prometheus.log"; exit 1; }
for tool in prometheus promtool curl python3; do
  command -v "$tool" >/dev/null || fail "$tool is not installed: scripts/setup.sh installs it (Debian packages prometheus, curl)"
done
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The host, serving its metrics; it waits on a FIFO that this script holds open.
port=$(free_port)
mkfifo "$work/stdin"
BUCKETALLOC_METRICS_ADDR=127.0.0.1:$port BUCKETALLOC_TIMELINE="$work/timeline.jsonl,100" \
  "$host" <"$work/stdin" >"$work/host.out" 2>"$work/host.err" &
pids+=($!)
exec 3>"$work/stdin"
for _ in $(seq 100); do grep -q '^ready$' "$work/host.out" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready$' "$work/host.out" || fail "the host did not start: $(cat "$work/host.err")"
value() { awk -v k="$1" '$1 == k { print $2 }' "$work/host.out"; }

# 1. The endpoint and promtool.
headers=$(curl -sS -D - -o "$work/metrics.txt" "http://127.0.0.1:$port/metrics") || fail "GET /metrics failed"
grep -qi '^content-type: text/plain; version=0.0.4' <<<"$headers" || fail "content type: $headers"
promtool check metrics <"$work/metrics.txt" || fail "promtool check metrics"
echo "promtool check metrics: passed on $(grep -vc '^#' "$work/metrics.txt") samples"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/nothing")
[[ $code == 404 ]] || fail "GET /nothing answered $code, not 404"

# 2. A real Prometheus scraping the host every second.
prom_port=$(free_port)
cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: bucketalloc
    static_configs:
      - targets: ['127.0.0.1:$port']
YAML
promtool check config "$work/prometheus.yml" >/dev/null || fail "promtool check config"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 3>&- &  # not holding the FIFO
pids+=($!)
query() {  # query PROMQL -> the value of its one sample, or nothing
  curl -sS --get "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" 2>/dev/null |
    python3 -c 'import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if len(r) == 1 else "")' 2>/dev/null
}
got=""
for _ in $(seq 120); do
  got=$(query 'bucketalloc_allocated_bytes{job="bucketalloc",device="0",pool="all"}')
  [[ -n "$got" ]] && break
  sleep 0.5
done
[[ -n "$got" ]] || fail "Prometheus returned no bucketalloc_allocated_bytes within 60 s"
check() {  # check PROMQL EXPECTED
  local v; v=$(query "$1")
  [[ "$v" == "$2" ]] || fail "$1 is '$v' through Prometheus, the host reported $2"
  echo "Prometheus: $1 = $v"
}
check 'bucketalloc_allocated_bytes{device="0",pool="all"}' "$(value allocated_bytes)"
check 'bucketalloc_allocations_total{device="0"}' "$(value allocations)"
check 'bucketalloc_frees_total{device="0"}' "$(value frees)"
check 'bucketalloc_ooms_total{device="0",cause="capacity"}' "$(value ooms_capacity)"
check 'bucketalloc_ooms_total{device="0",cause="fragmentation"}' 0
check 'bucketalloc_cached_bytes{device="0",pool="all"}' "$(value cached_bytes)"
check 'bucketalloc_free_block_size_bytes_sum{device="0",pool="all"}' "$(value cached_bytes)"
check 'up{job="bucketalloc"}' 1

# 3. A bad address, and the same port again (taken): one line each, and the host still serves.
for addr in "not-an-address" "127.0.0.1:$port"; do
  BUCKETALLOC_METRICS_ADDR=$addr "$host" </dev/null >"$work/other.out" 2>"$work/other.err" 3>&- ||
    fail "the host failed with BUCKETALLOC_METRICS_ADDR=$addr: $(cat "$work/other.err")"
  grep -q '^ready$' "$work/other.out" || fail "the host did not run with BUCKETALLOC_METRICS_ADDR=$addr"
  n=$(grep -c 'BUCKETALLOC_METRICS_ADDR' "$work/other.err")
  [[ $n == 1 ]] || fail "BUCKETALLOC_METRICS_ADDR=$addr: $n lines on stderr, not one: $(cat "$work/other.err")"
  echo "BUCKETALLOC_METRICS_ADDR=$addr: $(grep BUCKETALLOC_METRICS_ADDR "$work/other.err")"
done
# 4. The host's timeline (BUCKETALLOC_TIMELINE): lines every 100 ms while it ran, the OOM listed
#    once, and a last line at exit with what the metrics showed.
exec 3>&-
wait "${pids[0]}" || fail "the host exited with an error: $(cat "$work/host.err")"
python3 - "$work/timeline.jsonl" "$(value allocated_bytes)" "$(value ooms_capacity)" <<'PY' || fail "the timeline"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert len(lines) >= 5, f"{len(lines)} lines"
assert sum(len(l["ooms"]) for l in lines) == int(sys.argv[3]), [l["ooms"] for l in lines]
assert lines[-1]["allocated_bytes"] == int(sys.argv[2]), lines[-1]
assert lines[-1]["ooms_total"]["capacity"] == int(sys.argv[3]), lines[-1]
assert all(a["time_s"] <= b["time_s"] for a, b in zip(lines, lines[1:]))
print(f"timeline: {len(lines)} lines, the OOM listed once, the last at exit")
PY
echo "check_prometheus: PASS"
