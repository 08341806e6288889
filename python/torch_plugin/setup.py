"""The package's version, written once: the project(... VERSION x.y.z) of the repository's CMakeLists.txt.

The C ABI reports the same version (bucketalloc_version(), compiled in from CMake), and the package
exposes it as ``bucketalloc_torch.__version__`` (from its installed metadata). An sdist carries the
version in PKG-INFO, which setuptools reads when CMakeLists.txt is not there.
"""

import pathlib
import re

from setuptools import setup

_CMAKE = pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt"
_PKG_INFO = pathlib.Path(__file__).resolve().parent / "PKG-INFO"


def _version() -> str:
    if _CMAKE.is_file():
        match = re.search(r"project\(\s*bucketalloc\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", _CMAKE.read_text())
        if not match:
            raise RuntimeError(f"{_CMAKE}: no 'project(bucketalloc VERSION x.y.z' line to read the version from")
        return match.group(1)
    if _PKG_INFO.is_file():
        match = re.search(r"^Version: (.+)$", _PKG_INFO.read_text(), re.MULTILINE)
        if match:
            return match.group(1).strip()
    raise RuntimeError(f"the version is read from {_CMAKE} (a source checkout) or PKG-INFO (an sdist); neither is there")


setup(version=_version())
