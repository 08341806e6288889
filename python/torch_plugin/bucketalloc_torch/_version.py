"""The project's version, written once: the ``project(bucketalloc VERSION x.y.z`` line of the
repository's CMakeLists.txt, which also compiles into the C ABI's ``bucketalloc_version()``.

A built package (a wheel, ``pip install .``) carries it in ``_build_info.py``, which the build
writes from CMakeLists.txt (pyproject.toml); the source tree (``PYTHONPATH=python/torch_plugin``)
reads CMakeLists.txt itself. Nothing reads installed metadata, so a source-tree copy on the path
beside an installed one reports its own version.
"""

from __future__ import annotations

import pathlib
import re

CMAKE_LISTS = pathlib.Path(__file__).resolve().parents[3] / "CMakeLists.txt"
_PATTERN = re.compile(r"project\(\s*bucketalloc\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)")


def read_cmake_version(cmake_lists: pathlib.Path) -> str:
    """The version in `cmake_lists`; RuntimeError naming the file when it has none."""
    match = _PATTERN.search(cmake_lists.read_text())
    if not match:
        raise RuntimeError(f"{cmake_lists}: no 'project(bucketalloc VERSION x.y.z' line to read the version from")
    return match.group(1)


def project_version() -> str:
    """The version of this package: the one its build wrote, else the source tree's CMakeLists.txt."""
    try:
        from ._build_info import version  # written by the wheel build only

        return version
    except ImportError:
        pass
    if CMAKE_LISTS.is_file():
        return read_cmake_version(CMAKE_LISTS)
    return "unknown"
