"""Builds, caches and loads the code compiled against the installed torch.

``csrc/native_allocator.cc`` is bucketalloc as torch's own CUDA allocator (a
``c10::cuda::CUDACachingAllocator::CUDAAllocator``): ``load_native(torch, library)`` builds it
(against torch's headers and libraries, the CUDA runtime's headers, and bucketalloc's C ABI header)
and makes it current. When it cannot be built, the pluggable path below is the fallback.

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
from typing import Any, Dict, List, Optional, Tuple

_HERE = pathlib.Path(__file__).resolve().parent
SOURCE = _HERE / "csrc" / "torch_alloc.cc"
LIBRARY_NAME = "libbucketalloc_torch_alloc.so"
NATIVE_SOURCE = _HERE / "csrc" / "native_allocator.cc"
NATIVE_LIBRARY_NAME = "libbucketalloc_torch_native.so"
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


def _torch_dirs(torch: Any) -> Tuple[pathlib.Path, pathlib.Path]:
    torch_dir = pathlib.Path(torch.__file__).resolve().parent
    include, lib = torch_dir / "include", torch_dir / "lib"
    if not (include / "c10" / "util" / "Exception.h").is_file():
        raise Unavailable(f"torch's C++ headers are not installed ({include}/c10/util/Exception.h is missing)")
    if not (lib / "libc10.so").is_file():
        raise Unavailable(f"torch's libc10.so is missing ({lib}/libc10.so)")
    return include, lib


def _abi_flag(torch: Any) -> str:
    return f"-D_GLIBCXX_USE_CXX11_ABI={int(bool(getattr(torch._C, '_GLIBCXX_USE_CXX11_ABI', True)))}"


def _command(torch: Any) -> List[str]:
    """The compile command of the alloc function, without its output ("-o path" is appended)."""
    include, lib = _torch_dirs(torch)
    python_include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(python_include, "Python.h")):
        raise Unavailable(f"Python's C headers are not installed ({python_include}/Python.h is missing)")
    return [
        _compiler(), "-std=c++20", "-O2", "-fPIC", "-shared", _abi_flag(torch),
        "-isystem", str(include), "-isystem", python_include, str(SOURCE),
        f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}",
    ]


def _cuda_runtime_headers(torch: Any) -> pathlib.Path:
    """The CUDA runtime's headers: the nvidia wheel's torch was built with (site-packages/nvidia/cu13
    or nvidia/cuda_runtime), else $CUDA_HOME, $CUDA_PATH or /usr/local/cuda. Only the headers: the
    native allocator links no CUDA runtime of its own, its calls resolve through libc10_cuda's, the
    one torch loaded (a toolkit's libcudart of another version would be a second runtime)."""
    site = pathlib.Path(torch.__file__).resolve().parent.parent
    candidates = [site / "nvidia" / "cu13", site / "nvidia" / "cuda_runtime"]
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            candidates.append(pathlib.Path(os.environ[variable]))
    candidates.append(pathlib.Path("/usr/local/cuda"))
    for root in candidates:
        if (root / "include" / "cuda_runtime_api.h").is_file():
            return root / "include"
    raise Unavailable(
        "the CUDA runtime's headers (cuda_runtime_api.h) were not found in "
        + ", ".join(str(c) for c in candidates)
        + " (install torch's nvidia-cuda-runtime wheel, or set CUDA_HOME to a CUDA toolkit)"
    )


def bucketalloc_include() -> pathlib.Path:
    """The directory holding bucketalloc/bucketalloc.h: the wheel's copy, else the source tree's."""
    for root in (_HERE / "include", _HERE.parent.parent.parent / "include"):
        if (root / "bucketalloc" / "bucketalloc.h").is_file():
            return root
    raise Unavailable(f"bucketalloc's C ABI header is missing ({_HERE}/include/bucketalloc/bucketalloc.h)")


def _native_command(torch: Any) -> List[str]:
    """The compile command of the native allocator, without its output."""
    include, lib = _torch_dirs(torch)
    if not (lib / "libtorch_cuda.so").is_file():
        raise Unavailable(f"this torch has no CUDA build ({lib}/libtorch_cuda.so is missing)")
    cuda_include = _cuda_runtime_headers(torch)
    return [
        _compiler(), "-std=c++20", "-O2", "-fPIC", "-shared", _abi_flag(torch), "-DUSE_C10D_NCCL=0",
        "-isystem", str(include), "-isystem", str(cuda_include), "-I", str(bucketalloc_include()),
        str(NATIVE_SOURCE),
        f"-L{lib}", "-ltorch_cuda", "-lc10_cuda", "-lc10", f"-Wl,-rpath,{lib}", "-ldl",
    ]


def _build(torch: Any, command: List[str], sources: List[pathlib.Path], name: str) -> pathlib.Path:
    """Compiles `command` into `name` under the cache, keyed by the sources, torch and the command."""
    key = hashlib.sha256()
    for source in sources:
        key.update(source.read_bytes())
    key.update("\0".join([torch.__version__, *command]).encode())
    output = cache_dir() / "torch_alloc" / key.hexdigest()[:20] / name
    if output.is_file():
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f"{name}.{os.getpid()}.tmp")
    command = command + ["-o", str(temporary)]
    process = subprocess.run(command, capture_output=True, text=True, check=False)
    if process.returncode != 0:
        temporary.unlink(missing_ok=True)
        raise Unavailable(f"compiling {sources[0]} failed:\n  {' '.join(command)}\n{process.stderr[-4000:]}")
    os.replace(temporary, output)  # atomic: a concurrent build of the same key writes the same file
    return output


def build(torch: Any) -> pathlib.Path:
    """Returns the path of the alloc library built for `torch`, compiling it when it is not cached."""
    return _build(torch, _command(torch), [SOURCE], LIBRARY_NAME)


def build_native(torch: Any) -> pathlib.Path:
    """Returns the path of the native allocator built for `torch`, compiling it when not cached."""
    command = _native_command(torch)  # raises Unavailable naming what is missing
    header = bucketalloc_include() / "bucketalloc"
    return _build(torch, command, [NATIVE_SOURCE, header / "bucketalloc.h", header / "stat_list.h"],
                  NATIVE_LIBRARY_NAME)


# The loaded native allocator library (None until load_native installed it).
_native: Optional[ctypes.CDLL] = None


def load_native(torch: Any, library_path: str) -> str:
    """Builds (or finds) the native allocator for `torch` and makes it torch's CUDA allocator over the
    loaded libbucketalloc at `library_path`; returns the built library's path.

    Raises:
        Unavailable: it cannot be built here (the message names what is missing).
        RuntimeError: torch refused the swap (its message: e.g. its allocator is already initialized).
    """
    global _native
    path = build_native(torch)
    try:
        native = ctypes.CDLL(str(path))
    except OSError as e:
        raise Unavailable(f"cannot load {path}: {e}") from e
    native.bucketalloc_torch_native_install.restype = ctypes.c_int
    native.bucketalloc_torch_native_install.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    error = ctypes.create_string_buffer(4096)
    if native.bucketalloc_torch_native_install(os.fsencode(library_path), error, len(error)) != 0:
        raise RuntimeError(error.value.decode(errors="replace"))
    _native = native
    return str(path)


def native_active() -> bool:
    """True when the native allocator was installed in this process."""
    return _native is not None


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
