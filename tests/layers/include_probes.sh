# tests/layers/include_probes.sh — the include probes of check_layers.sh (the layers) and
# tests/harness/check_harness_rooms.sh (the harness's rooms), sourced by both.
# The sourcing script sets: cxx (the compiler), root (the build's include roots), kind ("layer" or
# "room") and prefix (what precedes a unit's name in its include_dirs file: "" or "harness_").
# A probe preprocesses a one-line file (#include "<header>") with the unit's include paths (CMake
# writes them to $root/<prefix><unit>.include_dirs): whether a header, and every header it includes,
# is in a unit's reach is the preprocessor's question, answered in about a fifteenth of the time a
# compile (-fsyntax-only) takes. `failed` becomes 1 on a failure.
failed=0
probe_log=$(mktemp)
trap 'rm -f "$probe_log"' EXIT

probe() {  # probe UNIT HEADER: 0 when the header and all it includes are found with UNIT's include paths
  local unit=$1 header=$2 flags=() dir
  while IFS= read -r dir; do
    [[ -z $dir || $dir == /usr/include || $dir == /usr/local/include ]] && continue  # system paths
    flags+=(-I "$dir")
  done <"$root/$prefix$unit.include_dirs"
  printf '#include "%s"\n' "$header" | "$cxx" -std=c++20 -E -o /dev/null "${flags[@]}" -x c++ - 2>"$probe_log"
}

expect_found() {  # expect_found UNIT HEADER: UNIT may include HEADER
  if probe "$1" "$2"; then
    echo "ok: $kind $1 includes $2"
  else
    echo "FAIL: $kind $1 cannot include $2, which it may:"; cat "$probe_log"
    failed=1
  fi
}

expect_refused() {  # expect_refused UNIT HEADER: HEADER is out of UNIT's reach
  if probe "$1" "$2"; then
    echo "FAIL: $kind $1 includes $2, which is out of its reach, and it was found"
    failed=1
  elif grep -q "No such file or directory" "$probe_log"; then
    echo "ok: $kind $1 cannot include $2 (not found)"
  else
    echo "FAIL: $kind $1 including $2 failed, but not because the header is out of reach:"; cat "$probe_log"
    failed=1
  fi
}

expect_include_dirs() {  # expect_include_dirs UNIT...: each unit's include paths were written
  local u
  for u in "$@"; do
    [[ -f $root/$prefix$u.include_dirs ]] || { echo "FAIL: no include paths $root/$prefix$u.include_dirs"; exit 1; }
  done
}
