"""The zero-code launcher: runs an unchanged program with bucketalloc as PyTorch's CUDA allocator.

    python -m bucketalloc_torch [--conf CONF] [--pluggable] [--patch-torch] script.py [args ...]
    python -m bucketalloc_torch [--conf CONF] [--pluggable] [--patch-torch] -m module [args ...]
    python -m bucketalloc_torch --version

bucketalloc_torch.enable(CONF, native=..., patch_torch=...) runs first (the native path unless
--pluggable), then the program runs as
``python script.py args`` or ``python -m module args`` would run it: ``__name__ == "__main__"``,
``sys.argv == [script, *args]`` (for -m, argv[0] is the module's file), and ``sys.path[0]`` is the
script's directory (for -m, the current directory). Without --conf, the BUCKETALLOC_CONF
environment variable applies. Only the options before the script (or -m module) are the
launcher's; everything after it belongs to the program. ``--version`` prints the package's, the
library's, the CUDA driver's and the CUDA runtime's versions (exit status 1 when the library cannot
be loaded).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
from typing import List, Optional, Tuple

from . import BucketallocError, enable

_USAGE = (
    "python -m bucketalloc_torch [--conf CONF] [--pluggable] [--patch-torch] (script.py | -m module) [args ...]\n"
    "       python -m bucketalloc_torch --version"
)

# The launcher's own options: those that take a value, and flags.
_VALUE_OPTIONS = ("--conf",)
_FLAG_OPTIONS = ("--pluggable", "--patch-torch", "--version", "-h", "--help")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bucketalloc_torch",
        usage=_USAGE,
        description="Run a Python program with bucketalloc as PyTorch's CUDA allocator "
        "(enable() runs before the program's first line).",
        epilog="script.py | -m module: the program, run as `python script.py args` or "
        "`python -m module args` would run it; every argument after it is the program's.",
    )
    parser.add_argument(
        "--conf",
        help="allocator options, e.g. 'capacity:40GiB,max_split_size_mb:512' "
        "(docs/configuration.md); default: the BUCKETALLOC_CONF environment variable",
    )
    parser.add_argument(
        "--pluggable",
        action="store_true",
        help="install bucketalloc through torch's CUDAPluggableAllocator instead of as torch's own "
        "allocator (the native path, the default; docs/pytorch.md, 'Compatibility')",
    )
    parser.add_argument(
        "--patch-torch",
        action="store_true",
        help="on the pluggable path, make torch.cuda.memory_stats(), memory_summary(), "
        "memory._snapshot() and the other stats functions report bucketalloc's (they raise under a "
        "pluggable allocator; the native path needs no patching)",
    )
    parser.add_argument(
        "--version",
        action="store_true",
        help="print the versions of this package, libbucketalloc, the CUDA driver and the CUDA runtime, and exit",
    )
    return parser


def _print_versions() -> None:
    """--version: the report of _commands.version_lines(); exits 1 when the library cannot be loaded."""
    from ._commands import version_lines

    try:
        lines = version_lines()
    except BucketallocError as e:
        print(f"python -m bucketalloc_torch: error: {e}", file=sys.stderr)
        sys.exit(1)
    print("\n".join(lines))
    sys.exit(0)


def _split(argv: List[str]) -> Tuple[List[str], List[str]]:
    """Splits argv into the launcher's options and the rest (the program and its arguments)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _VALUE_OPTIONS:
            i += 2
        elif arg in _FLAG_OPTIONS or arg.partition("=")[0] in _VALUE_OPTIONS:
            i += 1
        else:
            break
    return argv[:i], argv[i:]


def _target(parser: argparse.ArgumentParser, rest: List[str]) -> Tuple[Optional[str], Optional[str], List[str]]:
    """Returns (script, module, args) from what follows the launcher's options; exits 2 on misuse."""
    if not rest:
        parser.error("the script to run (or -m module) is missing")
    if rest[0] == "-m":
        if len(rest) < 2:
            parser.error("-m needs a module name")
        return None, rest[1], rest[2:]
    if rest[0] == "--":
        rest = rest[1:]
        if not rest:
            parser.error("the script to run is missing after --")
    elif rest[0].startswith("-"):
        parser.error(f"unknown option {rest[0]!r} (the launcher's options come before the script)")
    return rest[0], None, rest[1:]


def _check_target(parser: argparse.ArgumentParser, script: Optional[str], module: Optional[str]) -> None:
    """Exits 2 when the script or the module's top-level package is missing.

    Only the top-level name is looked up: finding `pkg.mod` would import `pkg`, and a package that
    touches CUDA at import time must be imported after enable(). A missing submodule is reported by
    runpy, after enable(), as `python -m` reports it.
    """
    if script is not None and not os.path.isfile(script):
        parser.error(f"can't open file {script!r}: no such file")
    if module is not None and importlib.util.find_spec(module.partition(".")[0]) is None:
        parser.error(f"no module named {module.partition('.')[0]!r}")


def main(argv: Optional[List[str]] = None) -> None:
    """Parses the launcher's options, enables bucketalloc and runs the program."""
    parser = _parser()
    own, rest = _split(sys.argv[1:] if argv is None else argv)
    options = parser.parse_args(own)
    if options.version:
        _print_versions()
    script, module, args = _target(parser, rest)
    _check_target(parser, script, module)
    try:
        enable(options.conf, patch_torch=options.patch_torch, native=False if options.pluggable else None)
    except (BucketallocError, ImportError) as e:
        print(f"python -m bucketalloc_torch: error: {e}", file=sys.stderr)
        sys.exit(1)
    if script is not None:
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")
    else:
        sys.argv = [module, *args]  # run_module replaces argv[0] by the module's file
        runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
