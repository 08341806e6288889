#!/usr/bin/env bash
# tests/harness/check_tune_cli.sh BENCH SOURCE_DIR — `bucketalloc-bench tune` as an operator runs it:
# on a generated serving trace and on the same workload as a PyTorch snapshot pickle (read directly),
# its --json recommendations are allocator strings that `replay --allocator` and `min-capacity
# --allocator` take as they are, its --html page is self-contained and renders in headless Chromium
# with the front plotted and both recommendations marked; bad input (no file, an empty one, no large
# allocation, a budget too small to measure the defaults) fails with a message naming it.
# Chromium is the Debian package `chromium` (scripts/setup.sh installs it); without it this fails.
set -uo pipefail
bench=$1
src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fail() { echo "check_tune_cli: FAIL: $*"; exit 1; }
expect_error() {  # expect_error NEEDLE ARGS...: the command fails and says NEEDLE
  local needle=$1; shift
  local err
  err=$("$bench" "$@" 2>&1) && fail "accepted: $*"
  grep -qF -- "$needle" <<<"$err" || fail "$* did not say '$needle': $err"
}
chromium_bin=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[[ -n "$chromium_bin" && -x "$chromium_bin" ]] ||
  fail "chromium is not installed: scripts/setup.sh installs the Debian package chromium (or set CHROMIUM)"

"$bench" generate serving --requests "$src/data/requests/azure_llm_inference_trace_2023_conv.csv" --limit 60 \
  --model "$src/data/models/Llama-3.1-8B-Instruct.config.json" --kv-layout tiered -o "$work/t.csv" >/dev/null 2>&1 ||
  fail "generate"
out=$("$bench" tune "$work/t.csv" --capacity 40GiB --jobs 2 --json "$work/t.json" --html "$work/t.html" 2>"$work/err") ||
  fail "tune: $(cat "$work/err")"
echo "$out" | tail -20
grep -q "^recommended bucketalloc: bucketalloc" <<<"$out" || fail "no bucketalloc recommendation"
grep -q "^recommended PyTorch: pytorch-" <<<"$out" || fail "no PyTorch recommendation"
grep -qE '^\[#*\.*\] [0-9]+/[0-9]+ ' "$work/err" || fail "no progress bar on stderr: $(head -3 "$work/err")"

# The JSON: the front, both parts' figures, the recommendations.
mapfile -t rec < <(/usr/bin/python3 - "$work/t.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for key in ("trace", "tuning_part", "held_out_part", "points", "front", "recommended", "bucketalloc", "pytorch"):
    assert key in j, key
assert j["front"] and all(p["on_front"] == (p["allocator"] in j["front"]) for p in j["points"])
for family, var in (("bucketalloc", "BUCKETALLOC_CONF"), ("pytorch", "PYTORCH_CUDA_ALLOC_CONF")):
    c = j[family]
    assert c["allocator"] == j["recommended"][family]
    assert var in c and c["tuning_part"] and c["held_out_part"] and c["default_held_out_part"], c
    assert c["held_out_part"]["min_capacity_bytes"] <= c["default_held_out_part"]["min_capacity_bytes"] + \
        (0.002 * j["held_out_part"]["peak_live_bytes"] if family == "bucketalloc" else 0), c
    assert "ooms_at_capacity" in c
print(j["recommended"]["bucketalloc"]); print(j["recommended"]["pytorch"])
PY
) || fail "tune's JSON"
for a in "${rec[@]}"; do
  "$bench" replay "$work/t.csv" --allocator "$a" --capacity 40GiB >/dev/null || fail "replay --allocator '$a'"
  "$bench" min-capacity "$work/t.csv" --allocator "$a" >/dev/null 2>&1 || fail "min-capacity --allocator '$a'"
done

# The page: self-contained, and drawn.
html=$(sed 's#http://www.w3.org/2000/svg##g' "$work/t.html")
grep -qiE 'https?://' <<<"$html" && fail "the page names a URL"
grep -qiE '<script|<link[[:space:]]|<img[[:space:]]|<iframe|@import|url\(' <<<"$html" && fail "the page loads something"
grep -q "Content-Security-Policy" "$work/t.html" || fail "the page lacks its no-network policy"
measured=$(/usr/bin/python3 -c "import json,sys; print(sum(p['tuning_part'] is not None for p in json.load(open(sys.argv[1]))['points']))" "$work/t.json")
timeout 120 "$chromium_bin" --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
  --user-data-dir="$work/profile" --enable-logging=stderr --v=0 --dump-dom "file://$work/t.html" \
  >"$work/dom.html" 2>"$work/chromium.log" || { tail -20 "$work/chromium.log"; fail "chromium"; }
(($(grep -o '<circle class="point' "$work/dom.html" | wc -l) == measured)) || fail "the plot should hold $measured points"
(($(grep -o '<circle class="chosen"' "$work/dom.html" | wc -l) == 2)) || fail "both recommendations should be marked"
grep -q "BUCKETALLOC_CONF=" "$work/dom.html" || fail "the page lacks the settings to copy"
if grep -E 'CONSOLE' "$work/chromium.log"; then fail "the page wrote to the console (above)"; fi

# A PyTorch snapshot pickle of the same workload, read directly (no conversion step).
/usr/bin/python3 - "$work/t.csv" "$work/s.pickle" <<'PY'
import csv, pickle, sys
entries = []
for row in csv.DictReader(open(sys.argv[1])):
    action = {"allocate": "alloc", "free": "free_completed"}.get(row["Action"])
    if action:
        entries.append({"action": action, "addr": int(row["Pointer"], 16), "size": int(row["Size"]),
                        "stream": 0, "time_us": len(entries), "frames": []})
pickle.dump({"segments": [], "device_traces": [entries], "allocator_settings": {}}, open(sys.argv[2], "wb"))
PY
out=$("$bench" tune "$work/s.pickle" --jobs 2 --budget-s 600 2>/dev/null) || fail "tune of a snapshot pickle"
grep -q "^recommended bucketalloc:" <<<"$out" || fail "no recommendation from the snapshot"

# Bad input.
expect_error "cannot open the recording" tune "$work/missing.csv"
: >"$work/empty.csv"
expect_error "is empty" tune "$work/empty.csv"
{ echo "Thread,Time,Action,Pointer,Size,Stream"; for i in $(seq 1 50); do echo "1,0,allocate,0x$((4096 * i)),4096,0x0"; done; } \
  >"$work/small.csv"
expect_error "no allocation above 1 MiB" tune "$work/small.csv"
expect_error "--budget-s" tune "$work/t.csv" --budget-s 0.000001
# Issue 42 item 8: a NaN budget is no number (it was read as no budget); an output that cannot be
# written is found before the search (it was found after it, the search lost); a directory is one.
expect_error "--budget-s: Value nan is not a number; accepted: 0 to 1e+07" tune "$work/t.csv" --budget-s nan
for flag in --json --html; do
  start=$SECONDS
  expect_error "$work/no/such/dir/out: cannot open it for writing (checked before any work): No such file or directory" \
    tune "$work/t.csv" "$flag" "$work/no/such/dir/out"
  ((SECONDS - start <= 5)) || fail "tune $flag to an unwritable path ran the search first ($((SECONDS - start)) s)"
done
expect_error "$work is a directory; accepted: a file to write" tune "$work/t.csv" --json "$work"
expect_error "$work is a directory; accepted: a file, the recording" tune "$work"
[[ ! -e $work/no ]] || fail "the check of an output left something behind"
# A FIFO's reader is not ended by the check: it gets the whole JSON at the end.
mkfifo "$work/fifo"
cat "$work/fifo" >"$work/from_fifo" &
reader=$!
timeout 120 "$bench" tune "$work/t.csv" --jobs 2 --budget-s 60 --json "$work/fifo" >/dev/null 2>&1 ||
  fail "tune --json FIFO"
wait "$reader"
/usr/bin/python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$work/from_fifo" || fail "the FIFO's JSON"
echo "check_tune_cli: PASS"
