"""The package's version, written once: the project(... VERSION x.y.z) of the repository's
CMakeLists.txt (bucketalloc_torch/_version.py reads it; the C ABI reports the same one). An sdist
carries the version in PKG-INFO, which is read when CMakeLists.txt is not there.
"""

import importlib.util
import pathlib
import re

from setuptools import setup

_HERE = pathlib.Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_bucketalloc_version", _HERE / "bucketalloc_torch" / "_version.py")
_version = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_version)


def _package_version() -> str:
    if _version.CMAKE_LISTS.is_file():
        return _version.read_cmake_version(_version.CMAKE_LISTS)
    pkg_info = _HERE / "PKG-INFO"
    if pkg_info.is_file():
        match = re.search(r"^Version: (.+)$", pkg_info.read_text(), re.MULTILINE)
        if match:
            return match.group(1).strip()
    raise RuntimeError(
        f"the version is read from {_version.CMAKE_LISTS} (a source checkout) or PKG-INFO (an sdist); neither is there"
    )


setup(version=_package_version())
