#!/usr/bin/env bash
# scripts/test_python.sh — installs the PyTorch plugin (python/torch_plugin) into build/venv and runs
# its pytest suite against the built library.
#
#   scripts/test_python.sh [pytest args...]
#
# Environment: LIB, the library to test (default build/release/lib/libbucketalloc.so; build it
# first); BUCKETALLOC_CACHE_DIR, where downloaded wheels and built modules are kept (default
# ~/.cache/bucketalloc). The venv uses /usr/bin/python3 with the system site packages (pytest) and
# gets torch and accelerate; it is created when missing. Exits non-zero when a test fails.
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
# The real torch (the PyPI CUDA wheel; it imports and drives its own allocator objects without a
# driver) and accelerate, from wheels cached under the project's cache directory (downloaded once).
cache="${BUCKETALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketalloc}"
wheels="$cache/wheels"
torch_version=2.15.0
if ! "$venv/bin/python" -c "import torch, accelerate; assert torch.__version__.startswith('$torch_version')" 2>/dev/null; then
  mkdir -p "$wheels"
  if ! "$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheels" "torch==$torch_version" accelerate \
      2>/dev/null; then
    echo "test_python.sh: downloading torch $torch_version and accelerate into $wheels (about 3 GB, once)"
    "$venv/bin/python" -m pip download --quiet --dest "$wheels" "torch==$torch_version" accelerate
    "$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheels" "torch==$torch_version" accelerate
  fi
fi
# torch.utils.cpp_extension builds the tests' probe module there, once per torch and source.
export TORCH_EXTENSIONS_DIR="$cache/torch_extensions"
export BUCKETALLOC_CACHE_DIR="$cache"
# setuptools builds in the source tree; a stale build/ there would put removed modules in the wheel.
rm -rf python/torch_plugin/build
"$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall ./python/torch_plugin

BUCKETALLOC_LIBRARY="$lib" "$venv/bin/python" -m pytest -q -rs python/torch_plugin/tests "$@"  # -rs: every skip says why
