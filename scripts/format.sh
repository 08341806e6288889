#!/usr/bin/env bash
# scripts/format.sh — formats every C, C++ and CUDA file of the repository with clang-format
# (.clang-format): .c .cc .cpp .cxx .h .hpp .cu .cuh, whatever the folder (the torch extensions' .cpp
# files of the Python tests too), or with --check reports the files that are not formatted and exits 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mapfile -t files < <(git ls-files -- '*.c' '*.cc' '*.cpp' '*.cxx' '*.h' '*.hpp' '*.cu' '*.cuh')
if [[ ${1:-} == --check ]]; then
  clang-format --dry-run -Werror "${files[@]}"
  echo "format: ${#files[@]} files formatted as .clang-format says"
else
  clang-format -i "${files[@]}"
fi
