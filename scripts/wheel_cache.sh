# scripts/wheel_cache.sh — sourced by build_wheel.sh and test_python.sh: the project's cache of
# downloaded wheels, and installing from it.
#   cache:  BUCKETALLOC_CACHE_DIR, else $XDG_CACHE_HOME/bucketalloc, else ~/.cache/bucketalloc
#   wheels: $cache/wheels
#   cached_install PYTHON REQUIREMENT...  installs the requirements into PYTHON's environment from
#       the cache only, downloading them (with their dependencies) from PyPI the first time.
cache="${BUCKETALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketalloc}"
wheels="$cache/wheels"

cached_install() {
  local python=$1; shift
  if ! "$python" -m pip install --quiet --no-index --find-links "$wheels" "$@" 2>/dev/null; then
    echo "downloading $* into $wheels (once)" >&2
    mkdir -p "$wheels"
    "$python" -m pip download --quiet --dest "$wheels" "$@"
    "$python" -m pip install --quiet --no-index --find-links "$wheels" "$@"
  fi
}
