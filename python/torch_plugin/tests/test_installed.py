"""The installed wheel, as a GPU server gets it (scripts/test_python.sh, docs/install.md).

scripts/test_python.sh builds the wheel, repairs it with auditwheel, installs it into a fresh venv
outside the source tree (no system site packages, BUCKETALLOC_LIBRARY unset) and runs this suite
from a copy of tests/ in a mount namespace where the system's Abseil is hidden; it sets
BUCKETALLOC_TEST_INSTALLED=1 and names the hidden files in BUCKETALLOC_TEST_HIDDEN. These tests
check that setting: the package, its library, the harness and the LD_PRELOAD launcher all come
from the venv and resolve nothing outside it but the manylinux allowlist. Run elsewhere (the
source tree on PYTHONPATH), they are skipped with that reason.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import bucketalloc_torch
from bucketalloc_torch import _lib
from helpers import MiB, run_python

INSTALLED = os.environ.get("BUCKETALLOC_TEST_INSTALLED") == "1"
pytestmark = pytest.mark.skipif(
    not INSTALLED, reason="tests of the installed wheel: run by scripts/test_python.sh (BUCKETALLOC_TEST_INSTALLED=1)"
)

# The manylinux allowlist (PEP 600: the libraries a manylinux wheel may take from the system), plus
# the loader and the vDSO that every process has.
ALLOWLIST = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1",
    "libstdc++.so.6", "ld-linux-x86-64.so.2", "linux-vdso.so.1",
}
SOURCE_TREE = pathlib.Path(os.environ.get("BUCKETALLOC_SOURCE_TREE", "/nonexistent"))
PACKAGE_DIR = pathlib.Path(bucketalloc_torch.__file__).resolve().parent
BUNDLED_DIR = PACKAGE_DIR.parent / "bucketalloc.libs"  # auditwheel's folder of grafted libraries
VENV_BIN = pathlib.Path(sys.prefix) / "bin"


def _elf_files():
    for root in (PACKAGE_DIR, BUNDLED_DIR):
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.read_bytes()[:4] == b"\x7fELF":
                yield path


def test_the_package_is_the_installed_wheel():
    assert sys.prefix != sys.base_prefix, "not running in a venv"
    assert PACKAGE_DIR.is_relative_to(pathlib.Path(sys.prefix)), PACKAGE_DIR
    assert "BUCKETALLOC_LIBRARY" not in os.environ
    assert not PACKAGE_DIR.is_relative_to(SOURCE_TREE), "the source tree's package is under test"
    # No system site packages: the venv's site-packages only (plus the standard library).
    assert not any("dist-packages" in p for p in sys.path), sys.path
    for name in ("libbucketalloc.so", "libbucketalloc_preload.so"):
        assert (PACKAGE_DIR / "lib" / name).is_file(), name
    assert os.access(PACKAGE_DIR / "bin" / "bucketalloc-bench", os.X_OK)
    assert BUNDLED_DIR.is_dir(), "auditwheel grafted no libraries"


def test_every_installed_binary_resolves_only_the_package_and_the_allowlist():
    checked = abseil = 0
    for path in _elf_files():
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            line = line.strip()
            if line == "statically linked":  # what ldd says of a library that needs none (libabsl_city)
                continue
            name = line.split()[0]
            if "=>" in line:
                target = line.split("=>", 1)[1].strip()
                assert not target.startswith("not found"), f"{path}: {line}"
                resolved = pathlib.Path(target.split(" (")[0]).resolve()
                inside = resolved.is_relative_to(PACKAGE_DIR) or resolved.is_relative_to(BUNDLED_DIR)
                assert inside or name in ALLOWLIST, f"{path} resolves {name} outside the package: {line}"
                if name.startswith("libabsl_"):
                    assert resolved.is_relative_to(BUNDLED_DIR), f"{path}: {line}"
                    abseil += 1
            else:
                assert pathlib.Path(name).name in ALLOWLIST, f"{path}: {line}"
        checked += 1
    assert checked > 3, f"only {checked} ELF files: the 3 products and the grafted Abseil libraries expected"
    assert abseil > 0, "no binary resolved Abseil from bucketalloc.libs/"


def test_the_system_abseil_is_hidden():
    hidden = [p for p in os.environ.get("BUCKETALLOC_TEST_HIDDEN", "").split(":") if p]
    assert len(hidden) >= 30, "scripts/test_python.sh names the hidden Abseil files in BUCKETALLOC_TEST_HIDDEN"
    for path in hidden:
        assert os.path.getsize(path) == 0, f"{path} is not hidden (a bind mount of /dev/null)"


def test_the_library_loads_its_bundled_abseil():
    run_python(
        f"""
        import pathlib
        from bucketalloc_torch import _lib
        assert _lib.library_path() == str(_lib.PACKAGE_LIBRARY), _lib.library_path()
        assert _lib.lib().bucketalloc_device_count() == 1
        maps = pathlib.Path("/proc/self/maps").read_text()
        absl = {{line.split()[-1] for line in maps.splitlines() if "libabsl_" in line}}
        assert absl, "no Abseil mapped"
        assert all(path.startswith("{BUNDLED_DIR}/") for path in absl), absl
        """,
        conf="backend:sim",
    )


def test_version_command():
    process = subprocess.run(
        [sys.executable, "-m", "bucketalloc_torch", "--version"], capture_output=True, text=True, check=False
    )
    assert process.returncode == 0, process.stderr
    lines = process.stdout.splitlines()
    version = bucketalloc_torch.__version__
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", version), version
    assert lines[0] == f"bucketalloc_torch {version} ({PACKAGE_DIR})", lines
    assert lines[1].startswith(f"libbucketalloc {version} ({PACKAGE_DIR}/lib/libbucketalloc.so; built with the CUDA ")
    assert re.fullmatch(r"CUDA driver: ([0-9]+\.[0-9]+|none \(.*libcuda\.so\.1.*\))", lines[2]), lines[2]
    assert lines[3].startswith("CUDA runtime: "), lines[3]
    # torch's own answer, from a child (importing torch here would change what later tests see).
    torch = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.version.cuda, torch.__version__)"],
        capture_output=True, text=True, check=False,
    )
    if torch.returncode == 0:
        cuda, version = torch.stdout.split()
        assert lines[3] == f"CUDA runtime: {cuda} (torch {version})", lines[3]
    else:
        assert "No module named 'torch'" in torch.stderr, torch.stderr


def test_bench_from_the_venv_bin():
    bench = VENV_BIN / "bucketalloc-bench"
    assert bench.is_file(), f"{bench}: the console script is not installed"
    process = subprocess.run([str(bench), "--help"], capture_output=True, text=True, check=False)
    assert process.returncode == 0, process.stderr
    assert "Usage: bucketalloc-bench [OPTIONS] SUBCOMMAND" in process.stdout, process.stdout
    # The harness's own end-to-end check (replay, min-capacity, compare, import-kineto, and generate
    # serving from the vendored request trace and model config), on the installed executable.
    script = SOURCE_TREE / "tests" / "harness" / "check_bench_cli.sh"
    if not script.is_file():
        pytest.fail(f"BUCKETALLOC_SOURCE_TREE must name the repository (no {script})")
    process = subprocess.run(
        ["bash", str(script), str(bench), str(SOURCE_TREE)], capture_output=True, text=True, check=False, timeout=600
    )
    assert process.returncode == 0, process.stdout[-4000:] + process.stderr[-4000:]


def _probe(tmp_path: pathlib.Path) -> pathlib.Path:
    """tests/preload/preload_probe.c, built against the CUDA toolkit's shared libcudart."""
    cuda = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    source = SOURCE_TREE / "tests" / "preload" / "preload_probe.c"
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None or not (cuda / "include" / "cuda_runtime_api.h").is_file() or not source.is_file():
        pytest.fail(f"needs a C compiler, the CUDA toolkit at {cuda} and {source} (scripts/setup.sh installs them)")
    probe = tmp_path / "preload_probe"
    subprocess.run(
        [compiler, "-O1", "-o", str(probe), str(source), f"-I{cuda}/include", f"-L{cuda}/lib64", "-lcudart",
         f"-Wl,-rpath,{cuda}/lib64", "-lpthread"],
        check=True,
    )
    return probe


def test_preload_launcher_from_the_venv_bin(tmp_path):
    probe = _probe(tmp_path)
    launcher = VENV_BIN / "bucketalloc-preload"
    assert launcher.is_file(), f"{launcher}: the console script is not installed"
    stats = tmp_path / "stats.json"
    process = subprocess.run(
        [str(launcher), "--conf", "backend:sim", "--stats-on-exit", str(stats), "--", str(probe)],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    device = json.loads(stats.read_text())["devices"][0]
    # check_preload.sh's counts: 12 allocations served, all freed.
    assert device["stats"]["allocation.all.allocated"] == 12, device["stats"]
    assert device["stats"]["allocation.all.current"] == 0
    assert device["stats"]["allocated_bytes.all.peak"] >= 7 * 5 * MiB
    # The program's arguments pass through, those that look like the launcher's own included.
    process = subprocess.run(
        [str(launcher), "--conf", "backend:sim", str(probe), "--threads"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    assert "preload_probe --threads: 8 threads x 1000 pairs, 0 failed calls" in process.stdout, process.stdout
    # What the program gets: the shim first in LD_PRELOAD, a preload already set kept after it, the
    # options as variables, and its own arguments untouched.
    show = 'echo "$LD_PRELOAD|$BUCKETALLOC_CONF|$BUCKETALLOC_STATS_ON_EXIT|$BUCKETALLOC_VERBOSE|$*"'
    process = subprocess.run(
        [str(launcher), "--conf", "backend:sim", "--stats-on-exit", "stderr", "--verbose", "--",
         "sh", "-c", show, "sh", "--conf", "y", "--", "z"],
        capture_output=True, text=True, check=False, timeout=60, env={**os.environ, "LD_PRELOAD": "libm.so.6"},
    )
    assert process.returncode == 0, process.stderr
    shim = PACKAGE_DIR / "lib" / "libbucketalloc_preload.so"
    assert process.stdout.splitlines()[0] == f"{shim}:libm.so.6|backend:sim|stderr|1|--conf y -- z", process.stdout


def test_preload_launcher_errors(tmp_path):
    launcher = str(VENV_BIN / "bucketalloc-preload")
    process = subprocess.run([launcher], capture_output=True, text=True, check=False)
    assert process.returncode == 2 and "the program to run is missing" in process.stderr, process.stderr
    process = subprocess.run([launcher, "--conf", "backend:sim", str(tmp_path / "absent")], capture_output=True,
                             text=True, check=False)
    assert process.returncode == 127, process.stderr
    assert f"cannot run '{tmp_path}/absent': No such file or directory" in process.stderr, process.stderr
    process = subprocess.run([launcher, "--frobnicate", "x"], capture_output=True, text=True, check=False)
    assert process.returncode == 2 and "--frobnicate" in process.stderr, process.stderr
