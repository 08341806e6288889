"""bucketalloc_torch._commands: the console commands' own checks, and the version's origin.

What the installed commands do end to end is tests/test_installed.py; these run anywhere, each in a
child process (the library is loaded once per process).
"""

from __future__ import annotations

import os
import shutil

from helpers import run, child_env, run_python


def test_preload_refuses_a_shim_path_ld_preload_cannot_carry(tmp_path):
    shim = tmp_path / "my envs" / "libbucketalloc_preload.so"
    shim.parent.mkdir()
    shim.write_bytes(b"\x7fELF")  # refused before anything loads it
    process = run(
        ["-c", f"""
import pathlib
from bucketalloc_torch import _commands, _lib
_lib.PACKAGE_PRELOAD = pathlib.Path({str(shim)!r})
_commands.preload_main(["true"])
"""],
        child_env(),
    )
    assert process.returncode == 1, process.stderr
    assert f"the shim's path '{shim}' holds a space or a colon, which LD_PRELOAD cannot carry" in process.stderr


def test_a_missing_shim_or_bench_names_where_it_was_looked_for(tmp_path):
    process = run(
        ["-c", f"""
import pathlib, sys
from bucketalloc_torch import _commands, _lib
_lib.PACKAGE_PRELOAD = pathlib.Path({str(tmp_path / "lib" / "libbucketalloc_preload.so")!r})
_lib.PACKAGE_BENCH = pathlib.Path({str(tmp_path / "bin" / "bucketalloc-bench")!r})
_lib.SOURCE_TREE_BUILD = None
try:
    _commands.bench_main(["--help"])
except SystemExit as e:
    assert e.code == 1
_commands.preload_main(["true"])
"""],
        child_env(),
    )
    assert process.returncode == 1, process.stderr
    for name in ("bucketalloc-bench", "libbucketalloc_preload.so"):
        assert f"{name} is not installed (tried {tmp_path}/" in process.stderr, process.stderr
    assert "pip install . from the repository root" in process.stderr


def test_a_package_that_does_not_know_its_version_loads_only_a_named_library(monkeypatch, tmp_path):
    """A copy of the package outside a checkout and without _build_info.py cannot check a library."""
    import bucketalloc_torch
    from bucketalloc_torch import _lib

    copy = tmp_path / "vendored" / "bucketalloc_torch"
    shutil.copytree(
        bucketalloc_torch.__path__[0], copy, ignore=shutil.ignore_patterns("_build_info.py", "lib", "bin", "__pycache__")
    )
    # The library under test, found as the loader would, without loading it into this process.
    library = os.environ.get("BUCKETALLOC_LIBRARY") or str(
        _lib.PACKAGE_LIBRARY if _lib.PACKAGE_LIBRARY.is_file() else _lib.SOURCE_TREE_LIBRARY
    )
    code = f"""
        import sys
        sys.path.insert(0, {str(copy.parent)!r})
        import bucketalloc_torch
        from bucketalloc_torch import _lib
        assert bucketalloc_torch.__file__.startswith({str(copy)!r}), bucketalloc_torch.__file__
        assert bucketalloc_torch.__version__ == "unknown", bucketalloc_torch.__version__
        _lib.PACKAGE_LIBRARY = __import__("pathlib").Path({library!r})
        try:
            _lib.lib()
        except _lib.BucketallocError as e:
            assert "does not know its version (no _build_info.py, and it is not in a source checkout)" in str(e), e
        else:
            raise AssertionError("an unchecked library was loaded")
        """
    monkeypatch.delenv("BUCKETALLOC_LIBRARY", raising=False)
    run_python(code, conf="backend:sim", LD_LIBRARY_PATH=str(_lib._PACKAGE_DIR.parent / "bucketalloc.libs"))
    # Named on purpose, it loads.
    run_python(
        f"""
        import sys
        sys.path.insert(0, {str(copy.parent)!r})
        from bucketalloc_torch import _lib
        assert _lib.library_path() == {library!r}, _lib.library_path()
        """,
        conf="backend:sim",
        BUCKETALLOC_LIBRARY=library,
        LD_LIBRARY_PATH=str(_lib._PACKAGE_DIR.parent / "bucketalloc.libs"),
    )
