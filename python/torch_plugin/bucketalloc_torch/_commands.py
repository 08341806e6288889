"""The console commands a wheel installs (pyproject.toml, ``[project.scripts]``), and the version report.

    bucketalloc-bench ARGS...
        The benchmark harness (docs/harness.md): the package's ``bin/bucketalloc-bench``, run in
        place of this process (its exit status and output are the harness's).

    bucketalloc-preload [--conf CONF] [--stats-on-exit DEST] [--verbose] [--] PROGRAM [ARGS...]
        Runs an unmodified, dynamically linked CUDA program with the package's LD_PRELOAD shim
        (docs/preload.md): ``LD_PRELOAD`` gets ``lib/libbucketalloc_preload.so`` first (a preload
        already set is kept after it), ``--conf`` sets ``BUCKETALLOC_CONF``, ``--stats-on-exit``
        ``BUCKETALLOC_STATS_ON_EXIT`` and ``--verbose`` ``BUCKETALLOC_VERBOSE=1``; then PROGRAM
        replaces this process, found on ``PATH`` as a shell would.

    python -m bucketalloc_torch --version
        ``version_lines()``: the package's, the library's, the CUDA driver's and the CUDA runtime's
        versions; exit status 1 when the library cannot be loaded.

From a source tree (no wheel), the commands use the release build (``build/release``).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import pathlib
import sys
from typing import List, Optional

from . import _lib
from ._lib import BucketallocError
from ._version import project_version


def _version_text(version: int) -> str:
    """CUDA's encoding (1000 * major + 10 * minor) as "major.minor": 13000 -> "13.0"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _product(packaged: pathlib.Path, in_build: str, what: str) -> str:
    """The path of a product the wheel carries (`packaged`), else of the source tree's build."""
    if packaged.is_file():
        return str(packaged)
    if _lib.SOURCE_TREE_BUILD is not None and (_lib.SOURCE_TREE_BUILD / in_build).is_file():
        return str(_lib.SOURCE_TREE_BUILD / in_build)
    tried = [str(packaged)]
    if _lib.SOURCE_TREE_BUILD is not None:
        tried.append(str(_lib.SOURCE_TREE_BUILD / in_build))
    raise BucketallocError(
        f"{what} is not installed (tried {', '.join(tried)}): install the package from its wheel or with "
        "pip install . from the repository root, which build it (docs/install.md)"
    )


def bench_path() -> str:
    """The harness executable: the package's ``bin/bucketalloc-bench``."""
    return _product(_lib.PACKAGE_BENCH, "tools/bucketalloc-bench", "bucketalloc-bench")


def preload_path() -> str:
    """The LD_PRELOAD shim: the package's ``lib/libbucketalloc_preload.so``."""
    return _product(_lib.PACKAGE_PRELOAD, "lib/libbucketalloc_preload.so", "libbucketalloc_preload.so")


def bench_main(argv: Optional[List[str]] = None) -> None:
    """``bucketalloc-bench``: runs the harness with `argv` (default: this process's arguments)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        path = bench_path()
    except BucketallocError as e:
        print(f"bucketalloc-bench: error: {e}", file=sys.stderr)
        sys.exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, ["bucketalloc-bench", *args])


def _preload_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bucketalloc-preload",
        usage="bucketalloc-preload [--conf CONF] [--stats-on-exit DEST] [--verbose] [--] PROGRAM [ARGS ...]",
        description="Run a dynamically linked CUDA program with bucketalloc serving its cudaMalloc, cudaFree, "
        "cudaMallocAsync, cudaFreeAsync and cudaMemGetInfo (LD_PRELOAD; docs/preload.md).",
        epilog="PROGRAM and every argument after it are the program's. Check that the program links the shared "
        "runtime: ldd PROGRAM | grep libcudart.",
    )
    parser.add_argument(
        "--conf",
        help="allocator options, e.g. 'capacity:70GiB,max_split_size_mb:512' (docs/configuration.md); "
        "default: the BUCKETALLOC_CONF environment variable",
    )
    parser.add_argument(
        "--stats-on-exit",
        metavar="DEST",
        help="at exit, print the summary table and the fragmentation histogram: 'stderr', or a file "
        "(JSON when it ends in .json); sets BUCKETALLOC_STATS_ON_EXIT",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print every error an interposed call returns (BUCKETALLOC_VERBOSE=1)"
    )
    parser.add_argument("program", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def preload_main(argv: Optional[List[str]] = None) -> None:
    """``bucketalloc-preload``: runs a program with the shim preloaded (see the module docstring)."""
    parser = _preload_parser()
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    program = options.program
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        parser.error("the program to run is missing")
    if program[0].startswith("-"):
        parser.error(f"unknown option {program[0]!r} (the launcher's options come before the program)")
    try:
        shim = preload_path()
    except BucketallocError as e:
        parser.exit(1, f"bucketalloc-preload: error: {e}\n")
    if any(c in shim for c in " :\t"):
        # ld.so splits LD_PRELOAD at spaces and colons, then only warns that the pieces "cannot be
        # preloaded" and runs the program without the shim: refuse rather than run it unserved.
        parser.exit(
            1,
            f"bucketalloc-preload: error: the shim's path {shim!r} holds a space or a colon, which LD_PRELOAD "
            "cannot carry; install the package into an environment whose path has neither\n",
        )
    env = dict(os.environ)
    env["LD_PRELOAD"] = shim + (f":{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else "")
    if options.conf is not None:
        env["BUCKETALLOC_CONF"] = options.conf
    if options.stats_on_exit is not None:
        env["BUCKETALLOC_STATS_ON_EXIT"] = options.stats_on_exit
    if options.verbose:
        env["BUCKETALLOC_VERBOSE"] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(program[0], program, env)
    except OSError as e:
        parser.exit(127, f"bucketalloc-preload: error: cannot run {program[0]!r}: {e.strerror}\n")


def _runtime_line() -> str:
    """The CUDA runtime a PyTorch process would use (torch's), else one the dynamic loader finds."""
    if importlib.util.find_spec("torch") is not None:
        try:
            import torch
        except Exception as e:  # noqa: BLE001 - a broken torch install is reported, not raised
            return f"CUDA runtime: torch is installed but does not import ({type(e).__name__}: {e})"
        if torch.version.cuda is None:
            return f"CUDA runtime: none (torch {torch.__version__} is a CPU build)"
        return f"CUDA runtime: {torch.version.cuda} (torch {torch.__version__})"
    for name in ("libcudart.so.13", "libcudart.so.12"):
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        if cudart.cudaRuntimeGetVersion(ctypes.byref(version)) == 0:
            return f"CUDA runtime: {_version_text(version.value)} ({name}, found by the dynamic loader; no torch)"
    return "CUDA runtime: none found (no torch, no libcudart.so.13 or .12 on the loader's path; bucketalloc needs none)"


def version_lines() -> List[str]:
    """The version report; raises BucketallocError (after nothing is printed) when the library cannot load."""
    package_dir = pathlib.Path(__file__).resolve().parent
    lines = [f"bucketalloc_torch {project_version()} ({package_dir})"]
    so = _lib.lib()  # refuses a library of another version, naming both
    headers = _version_text(so.bucketalloc_cuda_headers_version())
    lines.append(
        f"libbucketalloc {so.bucketalloc_version().decode()} ({_lib.library_path()}; built with the CUDA "
        f"{headers} headers, loads the driver at run time)"
    )
    driver = so.bucketalloc_cuda_driver_version()
    lines.append(f"CUDA driver: {_version_text(driver)}" if driver >= 0 else f"CUDA driver: none ({_lib.last_error()})")
    lines.append(_runtime_line())
    return lines
