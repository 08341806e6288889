"""Test helpers: fresh Python processes with their own allocator configuration.

libbucketalloc holds one process-wide allocator, configured before its first use and never
destroyed, so every scenario that needs a particular configuration or a clean state runs in a
new interpreter: either a test function decorated with @fresh_process(conf), whose body then runs
in the child, or a code string given to run_python().
"""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Callable, Dict, Optional, Sequence

import pytest

import bucketalloc_torch

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

TESTS_DIR = pathlib.Path(__file__).resolve().parent
# The directory holding the bucketalloc_torch package under test; children import the same one.
PACKAGE_PARENT = pathlib.Path(bucketalloc_torch.__file__).resolve().parent.parent

# A stand-in torch package (see its __init__.py); only child processes get it on their path.
FAKE_TORCH = TESTS_DIR / "fake_torch"

# Streams of the simulated device are any distinct pointer values.
STREAM_A = 0x1000
STREAM_B = 0x2000


def child_env(conf: Optional[str] = None, extra_path: Sequence[os.PathLike] = (), **env: str) -> Dict[str, str]:
    """Returns the environment of a child process: BUCKETALLOC_CONF=conf, the package and the tests
    importable (after `extra_path`), plus `env`."""
    result = dict(os.environ)
    result.pop("BUCKETALLOC_CONF", None)
    if conf is not None:
        result["BUCKETALLOC_CONF"] = conf
    paths = [str(p) for p in extra_path] + [str(TESTS_DIR), str(PACKAGE_PARENT)]
    if result.get("PYTHONPATH"):
        paths.append(result["PYTHONPATH"])
    result["PYTHONPATH"] = os.pathsep.join(paths)
    result.update(env)
    return result


def run(args: Sequence[str], env: Dict[str, str], cwd: Optional[os.PathLike] = None) -> subprocess.CompletedProcess:
    """Runs `python args...` and returns the finished process (any exit status)."""
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def expect_success(process: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """Fails the test with the child's output unless it exited 0."""
    if process.returncode != 0:
        pytest.fail(
            f"child process exited {process.returncode}\n--- stdout ---\n{process.stdout}\n"
            f"--- stderr ---\n{process.stderr}",
            pytrace=False,
        )
    return process


def run_python(
    code: str, conf: Optional[str] = None, extra_path: Sequence[os.PathLike] = (), **env: str
) -> subprocess.CompletedProcess:
    """Runs `code` (dedented) in a new interpreter with BUCKETALLOC_CONF=conf and `extra_path` first
    on its PYTHONPATH; fails unless it exits 0."""
    return expect_success(run(["-c", textwrap.dedent(code)], child_env(conf, extra_path, **env)))


def fresh_process(conf: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Runs the decorated test (no arguments, no fixtures) in a new interpreter with BUCKETALLOC_CONF=conf.

    The child imports the test module and calls the undecorated function; an assertion that fails
    there fails the test with the child's traceback.
    """

    def decorate(test: Callable[[], None]) -> Callable[[], None]:
        @functools.wraps(test)
        def run_in_child() -> None:
            run_python(f"import {test.__module__}\n{test.__module__}.{test.__name__}.__wrapped__()\n", conf=conf)

        return run_in_child

    return decorate
