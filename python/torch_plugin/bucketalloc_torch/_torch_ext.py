"""Builds, caches and loads the alloc function compiled against the installed torch.

``csrc/torch_alloc.cc`` throws PyTorch's own ``c10::OutOfMemoryError`` when bucketalloc runs out of
memory, so Python code sees ``torch.cuda.OutOfMemoryError`` (and C++ code that catches the C++
type, such as cuDNN's algorithm search, sees an OOM). It must be compiled against the torch in use
(its headers and ``libc10.so``): ``load(torch)`` compiles it once per torch installation and
source version with the C++ compiler (``$CXX``, else ``c++`` or ``g++``) into the cache directory
(``$BUCKETALLOC_CACHE_DIR``, else ``$XDG_CACHE_HOME/bucketalloc``, else ``~/.cache/bucketalloc``)
and reuses it afterwards. Without a compiler or torch's headers it raises :class:`Unavailable`,
naming what is missing.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import sysconfig
from typing import Any, Dict, List, Optional

SOURCE = pathlib.Path(__file__).resolve().parent / "csrc" / "torch_alloc.cc"
LIBRARY_NAME = "libbucketalloc_torch_alloc.so"
MALLOC = "bucketalloc_torch_malloc"
FREE = "bucketalloc_torch_free"
CACHE_ENV = "BUCKETALLOC_CACHE_DIR"


class Unavailable(RuntimeError):
    """The alloc function cannot be built here; the message says what is missing."""


def cache_dir() -> pathlib.Path:
    """The directory the built library is cached under (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV])
    if os.environ.get("XDG_CACHE_HOME"):
        return pathlib.Path(os.environ["XDG_CACHE_HOME"]) / "bucketalloc"
    return pathlib.Path.home() / ".cache" / "bucketalloc"


def _compiler() -> str:
    cxx = os.environ.get("CXX")
    if cxx:
        if shutil.which(cxx) is None:
            raise Unavailable(f"CXX={cxx!r} is not an executable on PATH")
        return cxx
    for name in ("c++", "g++"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise Unavailable("no C++ compiler found (set CXX, or install g++: apt-get install g++)")


def _command(torch: Any) -> List[str]:
    """The compile command, without its output ("-o path" is appended)."""
    torch_dir = pathlib.Path(torch.__file__).resolve().parent
    include, lib = torch_dir / "include", torch_dir / "lib"
    if not (include / "c10" / "util" / "Exception.h").is_file():
        raise Unavailable(f"torch's C++ headers are not installed ({include}/c10/util/Exception.h is missing)")
    if not (lib / "libc10.so").is_file():
        raise Unavailable(f"torch's libc10.so is missing ({lib}/libc10.so)")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    python_include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(python_include, "Python.h")):
        raise Unavailable(f"Python's C headers are not installed ({python_include}/Python.h is missing)")
    return [
        _compiler(), "-std=c++20", "-O2", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-isystem", str(include), "-isystem", python_include, str(SOURCE),
        f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}",
    ]


def build(torch: Any) -> pathlib.Path:
    """Returns the path of the library built for `torch`, compiling it when it is not cached."""
    command = _command(torch)  # raises Unavailable naming what is missing
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update("\0".join([torch.__version__, *command]).encode())
    output = cache_dir() / "torch_alloc" / key.hexdigest()[:20] / LIBRARY_NAME
    if output.is_file():
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f"{LIBRARY_NAME}.{os.getpid()}.tmp")
    command += ["-o", str(temporary)]
    process = subprocess.run(command, capture_output=True, text=True, check=False)
    if process.returncode != 0:
        temporary.unlink(missing_ok=True)
        raise Unavailable(f"compiling {SOURCE} failed:\n  {' '.join(command)}\n{process.stderr[-4000:]}")
    os.replace(temporary, output)  # atomic: a concurrent build of the same key writes the same file
    return output


# The loaded alloc library, through ctypes.PyDLL (its Python-facing functions keep the GIL).
_loaded: Optional[ctypes.PyDLL] = None


def record_stacks(on: bool) -> bool:
    """Turns Python stack recording on or off; False when the alloc library is not loaded."""
    if _loaded is None:
        return False
    _loaded.bucketalloc_torch_record_stacks(int(on))
    return True


def stacks() -> Dict[int, List[Dict[str, Any]]]:
    """The recorded Python stacks by address ({} when the alloc library is not loaded)."""
    return {} if _loaded is None else _loaded.bucketalloc_torch_stacks()


def load(torch: Any, library: ctypes.CDLL) -> str:
    """Builds (or finds) the alloc library for `torch`, points it at `library` (libbucketalloc)
    and returns its path, for ``CUDAPluggableAllocator(path, MALLOC, FREE)``."""
    path = build(torch)
    try:
        extension = ctypes.CDLL(str(path))  # the handle torch's CUDAPluggableAllocator opens again
    except OSError as e:
        raise Unavailable(f"cannot load {path}: {e}") from e
    extension.bucketalloc_torch_init.restype = None
    extension.bucketalloc_torch_init.argtypes = [ctypes.c_void_p] * 3
    address = lambda name: ctypes.cast(getattr(library, name), ctypes.c_void_p).value  # noqa: E731
    extension.bucketalloc_torch_init(
        address("bucketalloc_try_malloc"), address("bucketalloc_free"), address("bucketalloc_last_error")
    )
    global _loaded
    _loaded = ctypes.PyDLL(str(path))
    _loaded.bucketalloc_torch_record_stacks.restype = None
    _loaded.bucketalloc_torch_record_stacks.argtypes = [ctypes.c_int]
    _loaded.bucketalloc_torch_stacks.restype = ctypes.py_object
    _loaded.bucketalloc_torch_stacks.argtypes = []
    return str(path)
