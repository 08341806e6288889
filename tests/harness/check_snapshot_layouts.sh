#!/usr/bin/env bash
# tests/harness/check_snapshot_layouts.sh BENCH IMPORTER — the tools read every layout torch has
# written since _dump_snapshot exists (issue 42 item 1), as tests/harness/torch_snapshot_layouts.py
# writes them with Python's pickle (and in the C++ pickler's form): `doctor` reads each (the layouts
# without time_us with a warning that says so), and `tune` reads each to the same figures as the trace
# tools/import_torch_snapshot.py makes of it (min capacities depend on the events, not their times);
# the hostile pickles of issue 42 (a 1 MiB string referenced 20,000 times, a history of one shared
# entry) are answered at once, not expanded.
set -uo pipefail
bench=$1; importer=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fail() { echo "check_snapshot_layouts: FAIL: $*"; exit 1; }
/usr/bin/python3 "$here/torch_snapshot_layouts.py" "$work" --entries 3000 --hostile >/dev/null || fail "writing the layouts"

# tune's figures of the default, on the part it tunes on and the held-out part.
default_line() { grep "default (pytorch-policy)" "$1" | tr -s ' '; }

for layout in torch-2.0 torch-2.1 torch-2.2 torch-2.3 torch-2.5 torch-2.8 torch-2.10 torch-cpp; do
  pickle="$work/$layout.pickle"
  timeout 60 "$bench" doctor "$pickle" --capacity 80GiB --json "$work/d.json" >"$work/out" 2>"$work/err" ||
    fail "$layout: doctor: $(cat "$work/err")"
  case $layout in
    torch-2.0 | torch-2.1)
      grep -q 'device_traces\[0\] has no "time_us" (torch before 2.2' "$work/err" ||
        fail "$layout: no warning that its history has no time_us: $(cat "$work/err")" ;;
    *) [[ ! -s $work/err ]] || fail "$layout: unexpected warnings: $(cat "$work/err")" ;;
  esac
  /usr/bin/python3 "$importer" "$pickle" -o "$work/t.csv" >/dev/null || fail "$layout: import_torch_snapshot.py"
  timeout 120 "$bench" tune "$pickle" --jobs 2 --budget-s 100 >"$work/ours" 2>"$work/err" ||
    fail "$layout: tune: $(cat "$work/err")"
  timeout 120 "$bench" tune "$work/t.csv" --jobs 2 --budget-s 100 >"$work/python" 2>"$work/err" ||
    fail "$layout: tune of the Python importer's trace: $(cat "$work/err")"
  ours=$(default_line "$work/ours"); python=$(default_line "$work/python")
  [[ -n $ours && $ours == "$python" ]] ||
    fail "$layout: tune read directly: '$ours'; through import_torch_snapshot.py: '$python'"
  echo "$layout: $ours"
done

# Hostile: answered within seconds (a read of the string bomb expanded it to 20 GB and aborted).
for hostile in string_bomb shared_entries; do
  timeout 20 "$bench" doctor "$work/$hostile.pickle" --capacity 80GiB >"$work/out" 2>"$work/err"
  rc=$?
  ((rc == 0 || rc == 1)) || fail "$hostile: doctor exited $rc: $(cat "$work/err")"
done
echo "check_snapshot_layouts: PASS"
