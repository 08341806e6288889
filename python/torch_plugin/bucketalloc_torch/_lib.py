"""Locates and loads libbucketalloc.so and declares its C ABI (include/bucketalloc/bucketalloc.h).

The library is searched, in order, at:

1. the path in the ``BUCKETALLOC_LIBRARY`` environment variable (when set, nothing else is tried);
2. ``bucketalloc_torch/lib/libbucketalloc.so``, the copy a wheel carries (``pip install .`` from
   the repository root builds it; docs/install.md);
3. ``<repo>/build/release/lib/libbucketalloc.so`` when the package is used from its source tree;
4. ``ctypes.util.find_library("bucketalloc")``, then plain ``libbucketalloc.so`` (the dynamic
   loader's search: ``LD_LIBRARY_PATH``, the ldconfig cache, the system directories).

The library found must be of this package's version (both come from the one ``project(... VERSION``
of CMakeLists.txt); another version is refused with both versions named, not skipped. The library
holds one process-wide allocator, so it is loaded once per process; ``lib()`` returns that handle. The helpers turn the ABI's error returns (-1 or NULL plus a thread-local message)
into :class:`BucketallocError`.

Example::

    from bucketalloc_torch import _lib
    so = _lib.lib()
    p = _lib.check_pointer(so.bucketalloc_malloc(1 << 20, 0, None), "bucketalloc_malloc")
    so.bucketalloc_free(p, 1 << 20, 0, None)
    print(_lib.read_text(so.bucketalloc_stats_json, 0))
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import threading
from typing import Any, Callable, List, Optional, Tuple

# The version and the source-tree test, defined once (_version imports nothing of the package).
from . import _version

LIBRARY_ENV = "BUCKETALLOC_LIBRARY"
LIBRARY_NAME = "libbucketalloc.so"

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
# What a wheel carries inside the package (absent in the source tree): the C ABI library, the
# LD_PRELOAD shim and the harness (bucketalloc_torch._commands runs the last two).
PACKAGE_LIBRARY = _PACKAGE_DIR / "lib" / LIBRARY_NAME
PACKAGE_PRELOAD = _PACKAGE_DIR / "lib" / "libbucketalloc_preload.so"
PACKAGE_BENCH = _PACKAGE_DIR / "bin" / "bucketalloc-bench"
# The source tree's release build, used only when this file lies in a bucketalloc checkout.
SOURCE_TREE_BUILD: Optional[pathlib.Path] = _version.REPO / "build" / "release" if _version.IN_SOURCE_TREE else None
SOURCE_TREE_LIBRARY: Optional[pathlib.Path] = None if SOURCE_TREE_BUILD is None else SOURCE_TREE_BUILD / "lib" / LIBRARY_NAME

_c_char_buffer = ctypes.POINTER(ctypes.c_char)

# name -> (restype, argtypes), in the order of bucketalloc.h. Streams are opaque pointers
# (cudaStream_t); ssize_t is c_ssize_t.
class PoolId(ctypes.Structure):
    """bucketalloc_pool_id: a private pool's id (PyTorch's MempoolId_t), passed by value."""

    _fields_ = [("first", ctypes.c_ulonglong), ("second", ctypes.c_ulonglong)]


_SIGNATURES = {
    # Allocation (PyTorch's CUDAPluggableAllocator signatures).
    "bucketalloc_malloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "bucketalloc_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    # Declared for its address only (PyTorch calls it): never call it from Python, because the C++
    # exception it throws on failure cannot cross ctypes and terminates the process.
    "bucketalloc_malloc_or_throw": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    # 0 (and *out), 1 out of memory, -1 another error; the last error has the message.
    "bucketalloc_try_malloc": (
        ctypes.c_int, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    ),
    # Hooks (CUDAPluggableAllocator.allocator().set_*_fn).
    "bucketalloc_init": (None, [ctypes.c_int]),
    "bucketalloc_empty_cache": (None, []),
    "bucketalloc_set_memory_fraction": (None, [ctypes.c_double, ctypes.c_int]),
    "bucketalloc_record_stream": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "bucketalloc_retire_stream": (ctypes.c_int, [ctypes.c_void_p]),
    "bucketalloc_base_alloc": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    # CUDA graph capture, for C hosts: 0 on success, -1 on error.
    "bucketalloc_capture_begin": (ctypes.c_int, [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_void_p]),
    "bucketalloc_capture_end": (ctypes.c_int, [ctypes.c_int, ctypes.c_ulonglong]),
    "bucketalloc_release_pool": (ctypes.c_int, [ctypes.c_int, ctypes.c_ulonglong]),
    # PyTorch's graph-pool hooks: C++ signatures (a std::pair and a std::function by value), declared
    # for their addresses only; never call them from Python.
    "bucketalloc_torch_begin_allocate_to_pool": (None, None),
    "bucketalloc_torch_end_allocate_to_pool": (None, None),
    "bucketalloc_torch_release_pool": (None, None),
    # The same three with their errors returned (C++ signatures; the native allocator's).
    "bucketalloc_begin_allocate_to_pool": (None, None),
    "bucketalloc_end_allocate_to_pool": (None, None),
    "bucketalloc_release_pool_id": (None, None),
    "bucketalloc_raw_delete": (ctypes.c_int, [ctypes.c_void_p]),
    # Structured inspection and pools (what the native allocator is served from).
    "bucketalloc_get_device_stats": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]),
    "bucketalloc_visit_private_pool_stats": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "bucketalloc_reset_accumulated_stats": (ctypes.c_int, [ctypes.c_int]),
    "bucketalloc_visit_segments": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "bucketalloc_set_trace_hook": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "bucketalloc_cache_info": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)]),
    "bucketalloc_memory_fraction": (ctypes.c_double, [ctypes.c_int]),
    "bucketalloc_prefetch": (
        ctypes.c_int, [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    ),
    "bucketalloc_pool_incref": (ctypes.c_int, [ctypes.c_int, PoolId]),
    "bucketalloc_pool_set_use_on_oom": (ctypes.c_int, [ctypes.c_int, PoolId, ctypes.c_int]),
    "bucketalloc_pool_set_no_split": (ctypes.c_int, [ctypes.c_int, PoolId]),
    "bucketalloc_pool_set_segment_allocator": (
        ctypes.c_int, [ctypes.c_int, PoolId, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    ),
    "bucketalloc_mark_capture": (ctypes.c_int, [ctypes.c_int, ctypes.c_int]),
    "bucketalloc_pool_use_count": (ctypes.c_int, [ctypes.c_int, PoolId]),
    "bucketalloc_pool_empty_cache": (ctypes.c_int, [ctypes.c_int, PoolId]),
    "bucketalloc_last_oom_info": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]),
    "bucketalloc_share_block": (
        ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    ),
    "bucketalloc_open_shared": (ctypes.c_void_p, [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]),
    "bucketalloc_close_shared": (ctypes.c_int, [ctypes.c_void_p]),
    "bucketalloc_allocate_at": (
        ctypes.c_int, [ctypes.c_int, PoolId, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
    ),
    # Inspection: snprintf-like text functions.
    "bucketalloc_stats_json": (ctypes.c_ssize_t, [ctypes.c_int, _c_char_buffer, ctypes.c_size_t]),
    "bucketalloc_fragmentation_json": (ctypes.c_ssize_t, [ctypes.c_int, _c_char_buffer, ctypes.c_size_t]),
    "bucketalloc_summary": (ctypes.c_ssize_t, [ctypes.c_int, _c_char_buffer, ctypes.c_size_t]),
    "bucketalloc_snapshot_json": (ctypes.c_ssize_t, [ctypes.c_int, _c_char_buffer, ctypes.c_size_t]),
    "bucketalloc_last_oom_report": (ctypes.c_ssize_t, [ctypes.c_int, _c_char_buffer, ctypes.c_size_t]),
    "bucketalloc_tenant_stats_json": (ctypes.c_ssize_t, [ctypes.c_int, _c_char_buffer, ctypes.c_size_t]),
    "bucketalloc_thread_tenant": (ctypes.c_ssize_t, [_c_char_buffer, ctypes.c_size_t]),
    "bucketalloc_metrics_text": (ctypes.c_ssize_t, [_c_char_buffer, ctypes.c_size_t]),
    "bucketalloc_metrics_port": (ctypes.c_int, []),
    "bucketalloc_timeline_start": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
    "bucketalloc_timeline_stop": (ctypes.c_int, []),
    "bucketalloc_config_string": (ctypes.c_ssize_t, [_c_char_buffer, ctypes.c_size_t]),
    "bucketalloc_env_config_string": (ctypes.c_ssize_t, [_c_char_buffer, ctypes.c_size_t]),
    # Control: 0 on success, -1 on error.
    "bucketalloc_reset_peak_stats": (ctypes.c_int, [ctypes.c_int]),
    "bucketalloc_configure": (ctypes.c_int, [ctypes.c_char_p]),
    "bucketalloc_record_history": (ctypes.c_int, [ctypes.c_int, ctypes.c_size_t]),
    "bucketalloc_bind_stream": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
    "bucketalloc_set_thread_tenant": (ctypes.c_int, [ctypes.c_char_p]),
    "bucketalloc_set_tenant_cap": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]),
    "bucketalloc_check_invariants": (ctypes.c_int, [ctypes.c_int]),
    "bucketalloc_last_error": (ctypes.c_char_p, []),
    "bucketalloc_is_initialized": (ctypes.c_int, []),
    "bucketalloc_device_count": (ctypes.c_int, []),
    "bucketalloc_version": (ctypes.c_char_p, []),
    "bucketalloc_cuda_driver_version": (ctypes.c_int, []),
    "bucketalloc_cuda_headers_version": (ctypes.c_int, []),
    # Simulated-device controls (backend:sim only).
    "bucketalloc_sim_enqueue_work": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "bucketalloc_sim_complete_work": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "bucketalloc_sim_set_capturing": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]),
}

# Functions of _SIGNATURES added after libraries of this version were built: declared when the
# library has them, and reached through optional_function(name), which names the rebuild when it
# does not. Every other function is required at load.
_ADDED_LATER = frozenset({"bucketalloc_metrics_port"})

# The first buffer size tried by read_text; texts that do not fit are read again at their size.
DEFAULT_TEXT_BUFFER = 64 * 1024

# The ranges of the C integer types of the ABI. ctypes converts a Python int outside them without
# an error, to another value (2**32 as an int is 0; 2**64 as a size_t or a pointer is 0; -1 as a
# size_t is 2**64 - 1), so every int the package passes is checked against them first (checked_int).
C_INT_MIN = -(2 ** (8 * ctypes.sizeof(ctypes.c_int) - 1))
C_INT_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_int) - 1) - 1
C_SIZE_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1
C_UINTPTR_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)) - 1  # a stream (cudaStream_t) as an int


class BucketallocError(RuntimeError):
    """A bucketalloc call failed, or the library or PyTorch cannot be used as asked.

    When the C ABI reported the failure, the message is the library's last error
    (``bucketalloc_last_error()``), which names what failed and what is accepted.
    """


def _candidates() -> List[Tuple[str, str]]:
    """Returns the (origin, path or name) pairs to try, in search order (see the module docstring)."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        path = os.path.abspath(env)
        if not os.path.isfile(path):
            raise BucketallocError(
                f"{LIBRARY_ENV}={env!r}: no such file ({path}); set it to the path of a built "
                f"{LIBRARY_NAME} (e.g. <repo>/build/release/lib/{LIBRARY_NAME}) or unset it to search "
                "the package, the source tree and the dynamic loader's path"
            )
        return [(LIBRARY_ENV, path)]
    candidates = [("the package's lib/ directory", str(PACKAGE_LIBRARY))]
    if SOURCE_TREE_LIBRARY is not None:
        candidates.append(("the source tree's release build", str(SOURCE_TREE_LIBRARY)))
    found = ctypes.util.find_library("bucketalloc")
    if found is not None:
        candidates.append(('ctypes.util.find_library("bucketalloc")', found))
    candidates.append(("the dynamic loader's search (LD_LIBRARY_PATH, ldconfig)", LIBRARY_NAME))
    return candidates


def _load() -> Tuple[ctypes.CDLL, str]:
    """Loads the first library found and declares its functions; returns it and its path or name."""
    tried = []
    for origin, path in _candidates():
        is_file = os.sep in path
        if is_file and not os.path.isfile(path):
            tried.append(f"  {path} ({origin}): not found")
            continue
        try:
            library = ctypes.CDLL(path)
        except OSError as e:
            if origin == LIBRARY_ENV:
                raise BucketallocError(f"{LIBRARY_ENV}={path}: cannot load it: {e}") from e
            tried.append(f"  {path} ({origin}): {e}")
            continue
        _check_version(library, path)
        _declare(library, path)
        return library, path
    raise BucketallocError(
        f"cannot find {LIBRARY_NAME}. Tried:\n" + "\n".join(tried) + "\n"
        "Install the package with its library (pip install . from the repository root, or the wheel "
        "scripts/build_wheel.sh builds), or build it (cmake -S . -B build/release -G Ninja && ninja -C "
        f"build/release) and set {LIBRARY_ENV}=/path/to/{LIBRARY_NAME} or add its directory to LD_LIBRARY_PATH"
    )


def _check_version(library: ctypes.CDLL, path: str) -> None:
    """Refuses a library whose bucketalloc_version() is not this package's version."""
    package = _version.project_version()
    if not hasattr(library, "bucketalloc_version"):
        return  # not a libbucketalloc at all: _declare names what it lacks
    version_fn = library.bucketalloc_version
    version_fn.restype, version_fn.argtypes = ctypes.c_char_p, []
    found = (version_fn() or b"").decode("utf-8", "replace")
    if package == _version.UNKNOWN:
        if os.environ.get(LIBRARY_ENV):
            return  # named on purpose: the user vouches for it
        raise BucketallocError(
            f"this bucketalloc_torch ({_PACKAGE_DIR}) does not know its version (no _build_info.py, and it is not "
            f"in a source checkout), so it cannot check {path} (libbucketalloc {found}); install the package from "
            f"its wheel or with pip install . from the repository root, or set {LIBRARY_ENV} to the library to use"
        )
    if found != package:
        raise BucketallocError(
            f"{path} is libbucketalloc {found}, but this bucketalloc_torch ({_PACKAGE_DIR}) is {package}; the "
            "package and its library are built together. Reinstall the package with its own library (pip install "
            "--force-reinstall the wheel, or pip install . from the checkout of the version you want), or set "
            f"{LIBRARY_ENV} to a libbucketalloc.so built from the same checkout as this package"
        )


def _declare(library: ctypes.CDLL, path: str) -> None:
    """Sets restype and argtypes of every function of the ABI; a missing one is an error."""
    missing = [name for name in _SIGNATURES if name not in _ADDED_LATER and not hasattr(library, name)]
    if missing:
        raise BucketallocError(
            f"{path} does not export {', '.join(missing)}: it is not a libbucketalloc.so matching this "
            "package (rebuild the library, or point BUCKETALLOC_LIBRARY at a current build)"
        )
    for name, (restype, argtypes) in _SIGNATURES.items():
        if name in _ADDED_LATER and not hasattr(library, name):
            continue
        function = getattr(library, name)
        function.restype = restype
        function.argtypes = argtypes


_lock = threading.Lock()
_loaded: Optional[Tuple[ctypes.CDLL, str]] = None


def _loaded_library() -> Tuple[ctypes.CDLL, str]:
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded


def lib() -> ctypes.CDLL:
    """Returns the process-wide libbucketalloc handle, loading it on first use.

    Raises:
        BucketallocError: the library cannot be found or loaded; the message lists every place
            tried and how to fix it.
    """
    return _loaded_library()[0]


def library_path() -> str:
    """Returns the path (or, when found by the dynamic loader, the name) the library was loaded from."""
    return _loaded_library()[1]


def optional_function(name: str) -> Any:
    """Returns the library function `name`, declared; for the functions of _ADDED_LATER, which a
    library built before they were added lacks.

    Raises:
        BucketallocError: the library does not export `name` (the message says to rebuild it).
    """
    library = lib()
    if not hasattr(library, name):
        raise BucketallocError(
            f"{library_path()} does not export {name}: it was built before {name} was added to the C ABI; "
            f"rebuild it (ninja -C build/release) or reinstall the package with its own library, or set "
            f"{LIBRARY_ENV} to a current build"
        )
    return getattr(library, name)


def function_address(name: str) -> int:
    """Returns the address of the library function `name`, as PyTorch's hook setters take it."""
    return ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value


def last_error() -> str:
    """Returns the message of the last failed bucketalloc call on this thread ("" when none).

    The library does not clear it on success: it describes the last failure, not the last call.
    """
    return lib().bucketalloc_last_error().decode("utf-8", "replace")


def _error(function: str) -> BucketallocError:
    # The library's messages name what failed ("bucketalloc: ...", "bucketalloc_configure: ...").
    return BucketallocError(last_error() or f"{function} failed without an error message")


def check(result: int, function: str) -> int:
    """Returns `result`, or raises BucketallocError with the last error when it is -1."""
    if result == -1:
        raise _error(function)
    return result


def check_pointer(pointer: Optional[int], function: str) -> int:
    """Returns `pointer`, or raises BucketallocError with the last error when it is NULL."""
    if not pointer:
        raise _error(function)
    return pointer


def read_text(function: Callable[..., int], *args: object, initial_size: int = DEFAULT_TEXT_BUFFER) -> str:
    """Calls an snprintf-like inspection function with `args` and returns its whole text.

    The function is called with a buffer of `initial_size` bytes and, when its result says the text
    did not fit, once more with a buffer of the reported size.

    Raises:
        BucketallocError: the function returned -1.
    """
    size = max(initial_size, 1)
    while True:
        buffer = ctypes.create_string_buffer(size)
        needed = check(function(*args, buffer, size), function.__name__)
        if needed < size:
            return buffer.raw[:needed].decode("utf-8")
        # Too small: read again at the reported size (in a loop, as the text may grow in between).
        size = needed + 1


# ---------------------------------------------------------------------------------------------
# Arguments, checked before they reach ctypes (which cuts a string at its first NUL and wraps an int
# to its C type without an error). Every function of the package that hands a caller's value to
# the ABI goes through these two.


def checked_int(argument: str, value: Any, low: Optional[int], high: Optional[int],
                accepted: Optional[str] = None, shown: Any = None) -> int:
    """Returns `value` when it is an int (not a bool) from `low` to `high` (None: no bound).

    Args:
        argument: the argument's name, as the caller wrote it (``"cap_bytes"``, ``"stream.cuda_stream"``).
        low, high: the accepted range, at most the C type's (C_INT_MIN/C_INT_MAX, 0/C_SIZE_MAX, ...).
        accepted: what the message says is accepted (default: "an int from LOW to HIGH").
        shown: the value the message shows (default `value`), e.g. the caller's ``"cuda:N"`` for its index.

    Raises:
        TypeError: not an int, or a bool. ValueError: out of the range. Both say
            ``ARGUMENT=VALUE ...; accepted: ...``.
    """
    if accepted is None:
        accepted = f"an int from {low} to {high}"
    shown = value if shown is None else shown
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument}={shown!r} has type {type(shown).__name__}; accepted: {accepted}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{argument}={shown!r} is out of range; accepted: {accepted}")
    return int(value)


def checked_text(argument: str, value: Any, accepted: str = "a str", path: bool = False) -> bytes:
    """Returns `value` as the bytes of a C string: a str in UTF-8, or with `path` a str, bytes or
    os.PathLike as the file system encodes it (os.fsencode).

    Raises:
        TypeError: another type. ValueError: a NUL character (C would end the string there), or a
            str that UTF-8 cannot encode (a lone surrogate). Both name the argument and its value.
    """
    if path:
        accepted = "a str, bytes or os.PathLike path"
        try:
            encoded = os.fsencode(value)
        except TypeError:
            raise TypeError(f"{argument}={value!r} has type {type(value).__name__}; accepted: {accepted}") from None
    elif isinstance(value, str):
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{argument}={value!r} is not valid UTF-8 text ({e.reason} at index {e.start}); "
                             f"accepted: {accepted}") from None
    else:
        raise TypeError(f"{argument}={value!r} has type {type(value).__name__}; accepted: {accepted}")
    nul = encoded.find(b"\0")
    if nul >= 0:
        raise ValueError(f"{argument}={value!r} contains a NUL character (at byte {nul}), where C would end the "
                         f"text; NUL is not accepted; accepted: {accepted} without NUL characters")
    return encoded
