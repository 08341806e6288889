#!/usr/bin/env bash
# scripts/test_python.sh — the Python package as a GPU server installs it, in a clean environment:
#   1. builds the self-contained wheel (scripts/build_wheel.sh: scikit-build-core, auditwheel);
#   2. installs it into a fresh venv outside the source tree (no system site packages), with the
#      real torch (the PyPI CUDA wheel, which imports and drives its own allocator objects without a
#      driver), accelerate, prometheus_client, pytest and pytest-xdist, from wheels cached under
#      the project's cache directory;
#   3. runs the package's pytest suite (python/torch_plugin/tests, copied beside the venv) against
#      the installed copy, BUCKETALLOC_LIBRARY unset, in a mount namespace (unshare) where every
#      file of the system's Abseil is hidden under a bind mount of /dev/null: tests/test_installed.py
#      checks every installed binary with ldd against the manylinux allowlist and runs
#      bucketalloc-bench and the bucketalloc-preload launcher from the venv's bin/;
#   4. runs the one test that needs the system's Abseil (the source tree's own build) outside it.
#
#   scripts/test_python.sh [pytest args...]
#
# Environment: BUCKETALLOC_CACHE_DIR, where downloaded wheels and built modules are kept (default
# ~/.cache/bucketalloc); KEEP_VENV=1 keeps the temporary venv and prints its path. Needs root or
# unprivileged user namespaces (unshare). Exits non-zero when a test fails.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

# The build's output goes on to stderr as it comes (a dup of the descriptor: reopening /dev/stderr
# would truncate a log file it points at); its last line is the wheel's path.
build_log="$(mktemp)"
scripts/build_wheel.sh | tee "$build_log" >&2
wheel=$(tail -1 "$build_log")
rm -f "$build_log"
[[ -f $wheel ]] || { echo "test_python.sh: the wheel build printed no wheel path" >&2; exit 1; }

source scripts/wheel_cache.sh  # cache, wheels, cached_install
torch_version=2.15.0
work="$(mktemp -d "${TMPDIR:-/tmp}/bucketalloc-wheel-test.XXXXXX")"
cleanup() {
  if [[ "${KEEP_VENV:-0}" == 1 ]]; then echo "test_python.sh: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

echo "== a fresh venv in $work/venv (no system site packages)"
/usr/bin/python3 -m venv "$work/venv"
py="$work/venv/bin/python"
# About 3 GB the first time.
cached_install "$py" "torch==$torch_version" accelerate pytest pytest-xdist prometheus_client
"$py" -m pip install --quiet --no-index --no-deps "$wheel"
cp -r python/torch_plugin/tests "$work/tests"
find "$work/tests" -name __pycache__ -prune -exec rm -rf {} +

# The system's Abseil, hidden in the namespace: each real file (the .so links point at them).
mapfile -t hidden < <(ls /usr/lib/x86_64-linux-gnu/libabsl_*.so.*.*.* 2>/dev/null)
if ((${#hidden[@]} == 0)); then
  echo "test_python.sh: no system Abseil found to hide (/usr/lib/x86_64-linux-gnu/libabsl_*); scripts/setup.sh" \
       "installs libabsl-dev, which the check of the installed wheel needs" >&2
  exit 1
fi
unshare_cmd=(unshare --mount --propagation private)
if [[ $(id -u) -ne 0 ]]; then unshare_cmd+=(--map-root-user); fi

unset BUCKETALLOC_LIBRARY BUCKETALLOC_CONF PYTHONPATH
export BUCKETALLOC_SOURCE_TREE="$repo" BUCKETALLOC_TEST_INSTALLED=1
# torch.utils.cpp_extension builds the tests' probe module there, once per torch and source.
export TORCH_EXTENSIONS_DIR="$cache/torch_extensions" BUCKETALLOC_CACHE_DIR="$cache"
export BUCKETALLOC_TEST_HIDDEN
BUCKETALLOC_TEST_HIDDEN=$(IFS=:; echo "${hidden[*]}")
# pytest-xdist: JOBS processes share the tests (most of each one's time is a child process importing
# torch, one core each); the tests share no fixed port or file (a build of the native module
# replaces its file atomically, torch's extension builds take torch's lock).
export BUCKETALLOC_TEST_WORKERS="${JOBS:-2}"

echo "== pytest from $work/tests on the installed package, the system's Abseil hidden (${#hidden[@]} files)"
cd "$work"
"${unshare_cmd[@]}" bash -c '
  set -e
  IFS=: read -ra files <<<"$BUCKETALLOC_TEST_HIDDEN"
  for f in "${files[@]}"; do mount --bind /dev/null "$f"; done
  exec "$0" -m pytest -q -rs -p no:cacheprovider -n "$BUCKETALLOC_TEST_WORKERS" tests "$@"  # -rs: every skip says why
' "$py" "$@"

echo "== the source tree's own build, outside the namespace"
unset BUCKETALLOC_TEST_HIDDEN
"$py" -m pytest -q -rs -p no:cacheprovider tests/test_loader.py -k source_tree
