"""The project's version, written once: the ``project(bucketalloc VERSION x.y.z`` line of the
repository's CMakeLists.txt, which also compiles into the C ABI's ``bucketalloc_version()``.

An installed package reads it from its metadata (setup.py wrote it there from CMakeLists.txt); a
source tree that was never installed (``PYTHONPATH=python/torch_plugin``) reads CMakeLists.txt.
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
    """The version of this package: its metadata when installed, else the source tree's CMakeLists.txt."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("bucketalloc-torch")
    except PackageNotFoundError:
        pass
    if CMAKE_LISTS.is_file():
        return read_cmake_version(CMAKE_LISTS)
    return "unknown"
