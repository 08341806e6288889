"""The project's version, written once: the ``project(bucketalloc VERSION x.y.z`` line of the
repository's CMakeLists.txt, which also compiles into the C ABI's ``bucketalloc_version()``.

In a source checkout (``PYTHONPATH=python/torch_plugin``: this file lies in
``<repo>/python/torch_plugin/bucketalloc_torch`` beside ``<repo>/include/bucketalloc/bucketalloc.h``)
the version is read from ``<repo>/CMakeLists.txt`` itself, so a stale ``_build_info.py`` there does
not count. A built package (a wheel, ``pip install .``) carries it in ``_build_info.py``, which the
build writes from CMakeLists.txt (pyproject.toml). Nothing reads installed metadata, so a source-tree
copy on the path beside an installed one reports its own version. A copy of the package that is
neither reports "unknown", and the loader then accepts only a library named by BUCKETALLOC_LIBRARY.
"""

from __future__ import annotations

import pathlib
import re

UNKNOWN = "unknown"
# <repo>/python/torch_plugin/bucketalloc_torch/_version.py -> <repo> (Path.parent stops at the root)
REPO = pathlib.Path(__file__).resolve().parent.parent.parent.parent
CMAKE_LISTS = REPO / "CMakeLists.txt"
# True when this package is the source tree's (the loader then also tries its release build).
IN_SOURCE_TREE = CMAKE_LISTS.is_file() and (REPO / "include" / "bucketalloc" / "bucketalloc.h").is_file()
_PATTERN = re.compile(r"project\(\s*bucketalloc\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)")


def read_cmake_version(cmake_lists: pathlib.Path) -> str:
    """The version in `cmake_lists`; RuntimeError naming the file when it has none."""
    match = _PATTERN.search(cmake_lists.read_text())
    if not match:
        raise RuntimeError(f"{cmake_lists}: no 'project(bucketalloc VERSION x.y.z' line to read the version from")
    return match.group(1)


def project_version() -> str:
    """The version of this package: the source tree's CMakeLists.txt, else the one its build wrote."""
    if IN_SOURCE_TREE:
        return read_cmake_version(CMAKE_LISTS)
    try:
        from ._build_info import version  # written by the wheel build only

        return version
    except ImportError:
        return UNKNOWN
