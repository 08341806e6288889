#!/usr/bin/env bash
# scripts/test_python.sh — installs the PyTorch plugin (python/torch_plugin) into build/venv and runs
# its pytest suite against the built library.
#
#   scripts/test_python.sh [pytest args...]
#
# Environment: LIB, the library to test (default build/release/lib/libbucketalloc.so; build it
# first). The venv uses /usr/bin/python3 with the system site packages (pytest; torch when the
# system has it) and is created when missing. Exits non-zero when a test fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

lib="${LIB:-build/release/lib/libbucketalloc.so}"
if [[ ! -f "$lib" ]]; then
  echo "test_python.sh: $lib does not exist; build it (cmake -S . -B build/release -G Ninja &&" \
       "ninja -C build/release) or set LIB=/path/to/libbucketalloc.so" >&2
  exit 1
fi
lib="$(realpath "$lib")"

venv=build/venv
if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
# setuptools builds in the source tree; a stale build/ there would put removed modules in the wheel.
rm -rf python/torch_plugin/build
"$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall ./python/torch_plugin

BUCKETALLOC_LIBRARY="$lib" "$venv/bin/python" -m pytest -q -rs python/torch_plugin/tests "$@"  # -rs: every skip says why
