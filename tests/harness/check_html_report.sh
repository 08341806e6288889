#!/usr/bin/env bash
# tests/harness/check_html_report.sh BENCH — `bucketalloc-bench compare --html` writes a report that
# needs no network, and headless Chromium draws all of its charts without a script error.
#
# The report's script sets data-charts-rendered on <body> after drawing and appends every error
# (uncaught exceptions, rejected promises, content-security-policy violations, a chart that threw)
# to data-errors; Chromium's --dump-dom shows both. Chromium's console log (--enable-logging) is
# checked as well: the report writes nothing to the console unless something went wrong.
# Chromium is the Debian package `chromium` (scripts/setup.sh installs it); without it this test
# fails, it does not skip.
set -uo pipefail
bench=$1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fail() { echo "check_html_report: FAIL: $*"; exit 1; }

chromium_bin=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[[ -n "$chromium_bin" && -x "$chromium_bin" ]] ||
  fail "chromium is not installed: scripts/setup.sh installs the Debian package chromium (or set CHROMIUM)"

# A trace with a sawtooth of live bytes, blocks of several sizes (so the caching allocators hold
# free blocks in several bins at their peak), and a capacity at which nocache runs out.
{
  echo "Thread,Time,Action,Pointer,Size,Stream"
  for round in 0 1 2; do
    for i in $(seq 1 12); do
      echo "1,00:00:00.000001,allocate,0x$((round * 100 + i)),$((i * 700000 + 4096)),0x0"
    done
    for i in $(seq 1 2 12); do echo "1,00:00:00.000002,free,0x$((round * 100 + i)),$((i * 700000 + 4096)),0x0"; done
    for i in $(seq 2 2 12); do echo "1,00:00:00.000003,free,0x$((round * 100 + i)),$((i * 700000 + 4096)),0x0"; done
  done
} >"$work/t.csv"
out=$("$bench" compare "$work/t.csv" --allocators bucketalloc,pytorch-policy,pytorch-expandable,nocache --capacity 64MiB \
      --html "$work/report.html" --json "$work/c.json") || fail "compare --html: $out"
echo "$out"
[[ -s "$work/report.html" ]] || fail "no report written"
echo "report: $(wc -c <"$work/report.html") bytes"

# Self-contained: no external scripts, stylesheets, images, frames, fonts or URLs. The SVG namespace
# name is a URI that nothing fetches.
html=$(sed 's#http://www.w3.org/2000/svg##g' "$work/report.html")
grep -qiE 'https?://' <<<"$html" && fail "the report names a URL: $(grep -oiE 'https?://[^"'"'"' ]*' <<<"$html" | head -3)"
grep -qiE '<script[^>]+src=|<link[[:space:]]|<img[[:space:]]|<iframe|@import|url\(' <<<"$html" &&
  fail "the report references an external resource"
grep -q "Content-Security-Policy" "$work/report.html" || fail "the report lacks its no-network policy"
/usr/bin/python3 -c "
import json
c = json.load(open('$work/c.json'))
assert [x['at_capacity']['allocator'] for x in c] == ['bucketalloc', 'pytorch-policy', 'pytorch-expandable', 'nocache'], c
for x in c:
    t = x['timeline']
    assert t['events'] == 72 and len(t['event']) == 72, t['events']
    if x['at_capacity']['ooms'] == 0:  # every block was served: the replay held what the trace held
        assert max(t['live_bytes']) == x['at_capacity']['peak_live_bytes'], x['at_capacity']['allocator']
    assert 'peak_fragmentation' in x and x['peak_fragmentation']['reserved'] > 0
assert c[3]['at_capacity']['ooms'] > 0, 'nocache should run out at 64 MiB'
for i in (1, 2):  # pytorch-policy and pytorch-expandable
    assert any(b['count'] > 0 for b in c[i]['peak_fragmentation']['histogram']), c[i]['at_capacity']['allocator'] + ' holds free blocks at its peak'
" || fail "compare JSON (timeline, peak_fragmentation)"

# Render it. --dump-dom prints the DOM after the load event, when the inline scripts have run.
"$chromium_bin" --version || fail "chromium does not start"
timeout 120 "$chromium_bin" --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
  --user-data-dir="$work/profile" --enable-logging=stderr --v=0 --dump-dom "file://$work/report.html" \
  >"$work/dom.html" 2>"$work/chromium.log"
rc=$?
((rc == 0)) || { tail -20 "$work/chromium.log"; fail "chromium exited with $rc"; }
body=$(grep -o '<body[^>]*>' "$work/dom.html" | head -1)
echo "rendered: $body"
[[ -n "$body" ]] || fail "chromium dumped no <body>"
grep -q 'data-errors=' <<<"$body" && fail "script errors: $body"
grep -q 'data-charts-expected="8"' <<<"$body" || fail "the report should expect 8 charts: $body"
grep -q 'data-charts-rendered="8"' <<<"$body" || fail "not every chart rendered: $body"
(($(grep -o '<svg class="chart"[^>]*data-rendered="true"' "$work/dom.html" | wc -l) == 8)) ||
  fail "8 rendered <svg> charts expected"
# The timelines hold their three series; the caching allocators' histograms have bars.
(($(grep -o '<path class="reserved" d="M[0-9]' "$work/dom.html" | wc -l) == 4)) || fail "a timeline lacks its reserved series"
(($(grep -o '<rect class="bar"' "$work/dom.html" | wc -l) > 0)) || fail "no histogram bars"
if grep -E 'CONSOLE' "$work/chromium.log"; then fail "the page wrote to the console (above)"; fi
echo "check_html_report: PASS"
