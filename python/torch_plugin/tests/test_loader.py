"""Finding and loading libbucketalloc.so, and the declared ABI.

Loading is once per process, so every test that loads a library does it in a child process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from bucketalloc_torch import _lib
from helpers import TESTS_DIR, run_python

# The repository: BUCKETALLOC_SOURCE_TREE when the suite runs from a copy (scripts/test_python.sh).
REPO = pathlib.Path(os.environ.get("BUCKETALLOC_SOURCE_TREE") or TESTS_DIR.parents[2])
HEADER = REPO / "include" / "bucketalloc" / "bucketalloc.h"
RELEASE_LIBRARY = REPO / "build" / "release" / "lib" / "libbucketalloc.so"
# The installed wheel's folder of grafted libraries (auditwheel), which a copy of its library needs.
BUNDLED_DIR = pathlib.Path(_lib.__file__).resolve().parent.parent / "bucketalloc.libs"


def test_every_function_of_the_header_is_declared():
    if not HEADER.is_file():
        pytest.fail(f"needs the source tree's header ({HEADER}): set BUCKETALLOC_SOURCE_TREE to the repository")
    declared = set(re.findall(r"^BUCKETALLOC_API\b[^(]*?\b(bucketalloc_\w+)\(", HEADER.read_text(), re.MULTILINE))
    assert len(declared) > 20
    assert declared == set(_lib._SIGNATURES)


def test_library_env_naming_a_missing_file(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere" / "libbucketalloc.so"
    monkeypatch.setenv("BUCKETALLOC_LIBRARY", str(missing))
    with pytest.raises(_lib.BucketallocError, match="BUCKETALLOC_LIBRARY=.*: no such file") as info:
        _lib._candidates()
    assert str(missing) in str(info.value)


def test_library_env_naming_a_file_that_is_not_a_library(monkeypatch, tmp_path):
    not_a_library = tmp_path / "libbucketalloc.so"
    not_a_library.write_text("not an ELF file")
    monkeypatch.setenv("BUCKETALLOC_LIBRARY", str(not_a_library))
    with pytest.raises(_lib.BucketallocError, match=f"BUCKETALLOC_LIBRARY={not_a_library}: cannot load it: "):
        _lib._load()


def test_a_library_without_the_abi_is_refused():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    with pytest.raises(_lib.BucketallocError, match="libc does not export bucketalloc_malloc, bucketalloc_free, "):
        _lib._declare(libc, "libc")


def built_library() -> str:
    """The library under test: BUCKETALLOC_LIBRARY, else the installed package's, else the source
    tree's release build."""
    if os.environ.get("BUCKETALLOC_LIBRARY"):
        path = os.environ["BUCKETALLOC_LIBRARY"]
    elif _lib.PACKAGE_LIBRARY.is_file():
        path = str(_lib.PACKAGE_LIBRARY)
    else:
        path = str(RELEASE_LIBRARY)
    if not os.path.isfile(path):
        pytest.fail(f"needs a built library ({path}): build it or install the package")
    return path


def copy_env(monkeypatch) -> None:
    """Lets a copy of the library, moved out of the installed package, find the libraries that
    auditwheel grafted beside the package (its RUNPATH is relative to its own folder)."""
    if BUNDLED_DIR.is_dir():
        monkeypatch.setenv("LD_LIBRARY_PATH", str(BUNDLED_DIR))


@pytest.mark.skipif(ctypes.util.find_library("bucketalloc") is not None, reason="a libbucketalloc is installed system-wide")
def test_not_found_lists_every_place_tried(monkeypatch, tmp_path):
    monkeypatch.delenv("BUCKETALLOC_LIBRARY", raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    run_python(
        f"""
        import pathlib
        from bucketalloc_torch import _lib
        _lib.PACKAGE_LIBRARY = pathlib.Path("{tmp_path}/lib/libbucketalloc.so")
        _lib.SOURCE_TREE_LIBRARY = pathlib.Path("{tmp_path}/build/libbucketalloc.so")
        try:
            _lib.lib()
        except _lib.BucketallocError as e:
            message = str(e)
        else:
            raise AssertionError("a library was loaded from " + _lib.library_path())
        assert message.startswith("cannot find libbucketalloc.so. Tried:"), message
        for expected in [
            "{tmp_path}/lib/libbucketalloc.so (the package's lib/ directory): not found",
            "{tmp_path}/build/libbucketalloc.so (the source tree's release build): not found",
            "libbucketalloc.so (the dynamic loader's search (LD_LIBRARY_PATH, ldconfig)): libbucketalloc.so: "
            "cannot open shared object file",
            "set BUCKETALLOC_LIBRARY=/path/to/libbucketalloc.so",
        ]:
            assert expected in message, (expected, message)
        """
    )


def test_the_package_copy_is_used_without_the_environment(monkeypatch, tmp_path):
    copy = tmp_path / "lib" / "libbucketalloc.so"
    copy.parent.mkdir()
    shutil.copy(built_library(), copy)
    monkeypatch.delenv("BUCKETALLOC_LIBRARY", raising=False)
    copy_env(monkeypatch)
    run_python(
        f"""
        import pathlib
        from bucketalloc_torch import _lib
        _lib.PACKAGE_LIBRARY = pathlib.Path("{copy}")
        assert _lib.library_path() == "{copy}", _lib.library_path()
        assert _lib.lib().bucketalloc_device_count() == 1
        """,
        conf="backend:sim",
    )


def test_the_source_tree_finds_its_release_build(monkeypatch):
    if os.environ.get("BUCKETALLOC_TEST_HIDDEN"):
        pytest.skip("the system's Abseil is hidden, which the source tree's build links (scripts/test_python.sh "
                    "runs this test again outside the mount namespace)")
    if not RELEASE_LIBRARY.is_file():
        pytest.fail(f"needs {RELEASE_LIBRARY} (ninja -C build/release)")
    monkeypatch.delenv("BUCKETALLOC_LIBRARY", raising=False)
    package_parent = REPO / "python" / "torch_plugin"
    run_python(
        f"""
        from bucketalloc_torch import _lib
        assert _lib.__file__.startswith("{package_parent}"), _lib.__file__  # the source tree's package
        assert _lib.library_path() == "{RELEASE_LIBRARY}", _lib.library_path()
        """,
        extra_path=[package_parent],
    )


FAKE_LIBRARY = """
const char* bucketalloc_version(void) { return "%s"; }
"""


def test_a_library_of_another_version_is_refused(monkeypatch, tmp_path):
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        pytest.fail("needs a C compiler (scripts/setup.sh installs build-essential)")
    source = tmp_path / "other.c"
    source.write_text(FAKE_LIBRARY % "9.8.7")
    other = tmp_path / "libbucketalloc.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(other), str(source)], check=True)
    monkeypatch.setenv("BUCKETALLOC_LIBRARY", str(other))
    run_python(
        f"""
        import bucketalloc_torch
        from bucketalloc_torch import _lib
        try:
            _lib.lib()
        except _lib.BucketallocError as e:
            message = str(e)
        else:
            raise AssertionError("a library of another version was loaded")
        version = bucketalloc_torch.__version__
        assert message.startswith(f"{other} is libbucketalloc 9.8.7, but this bucketalloc_torch ("), message
        assert f") is {{version}}; the package and its library are built together." in message, message
        assert "pip install --force-reinstall" in message and "BUCKETALLOC_LIBRARY" in message, message
        """
    )


def test_the_environment_wins(monkeypatch, tmp_path):
    copy = tmp_path / "elsewhere.so"
    shutil.copy(built_library(), copy)
    monkeypatch.setenv("BUCKETALLOC_LIBRARY", str(copy))
    copy_env(monkeypatch)
    run_python(
        f"""
        from bucketalloc_torch import _lib
        assert _lib.library_path() == "{copy}", _lib.library_path()
        """
    )
