#!/usr/bin/env bash
# Checks that libbucketalloc.so exports only bucketalloc_* symbols (so it cannot clash with a
# host's copies of Abseil, cudart or libstdc++), that every function of bucketalloc.h is exported,
# that it does not link libcuda (it must load on a machine without a driver), and that it needs no
# static TLS (it must load with dlopen).
# Usage: check_exports.sh LIBRARY HEADER
set -euo pipefail
lib="$1"; header="$2"
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort)
foreign=$(grep -v '^bucketalloc_' <<<"$exported" || true)
if [[ -n "$foreign" ]]; then
  echo "check_exports: $lib exports symbols outside the bucketalloc_ prefix:"; echo "$foreign"; exit 1
fi
declared=$(grep -oE 'BUCKETALLOC_API [^(]*\(' "$header" | grep -oE 'bucketalloc_[a-z_]+' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [[ -n "$missing" ]]; then
  echo "check_exports: declared in $header but not exported:"; echo "$missing"; exit 1
fi
# Static TLS (an initial-exec thread_local) puts the library's whole thread-local block, 16 KiB of
# last-error text, in the static TLS space, which dlopen (ctypes, CUDAPluggableAllocator) then
# refuses: "cannot allocate memory in static TLS block".
if readelf -d "$lib" | grep -q 'STATIC_TLS'; then
  echo "check_exports: $lib needs static TLS (an initial-exec thread_local), which dlopen cannot always give"; exit 1
fi
if readelf -d "$lib" | grep -q 'NEEDED.*libcuda\.so'; then
  echo "check_exports: $lib links libcuda; reach the driver through cudaGetDriverEntryPointByVersion"; exit 1
fi
echo "check_exports: $(wc -l <<<"$exported") symbols, all bucketalloc_*; all $(wc -l <<<"$declared") declared functions exported"
