"""torch.cuda.memory of the fake torch: CUDAPluggableAllocator, change_current_allocator, and stats
functions that answer for the native allocator and raise, as PyTorch's do, under a pluggable one."""

import ctypes
import functools
import os

from torch._fake import log

_SETTERS = (
    "set_init_fn",
    "set_reset_fn",
    "set_memory_fraction_fn",
    "set_record_stream_fn",
    "set_base_alloc_fn",
    "set_begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn",
    "set_release_pool",
)
_current = "native"


class _PluggableAllocatorHooks:
    """torch._C._CUDAPluggableAllocator: the hook setters this version has, each logging its pointer."""

    def __init__(self):
        missing = os.environ.get("FAKE_TORCH_MISSING_SETTERS", "").split(",")
        for name in _SETTERS:
            if name not in missing:
                setattr(self, name, functools.partial(self._set, name))

    @staticmethod
    def _set(name, pointer):
        if not isinstance(pointer, int):
            raise TypeError(f"{name}: expected a function pointer as an int, got {pointer!r}")
        log.append([name, pointer])


class CUDAPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        library = ctypes.CDLL(path_to_so_file)  # PyTorch dlopens the path and looks both names up
        getattr(library, alloc_fn_name)
        getattr(library, free_fn_name)
        log.append(["CUDAPluggableAllocator", path_to_so_file, alloc_fn_name, free_fn_name])
        self._allocator = _PluggableAllocatorHooks()

    def allocator(self):
        return self._allocator


def change_current_allocator(allocator):
    global _current
    if os.environ.get("FAKE_TORCH_CUDA_INITIALIZED") == "1":
        raise RuntimeError("Can't swap an already initialized allocator")
    _current = allocator
    log.append(["change_current_allocator"])


def _native_only(unsupported, native_result):
    def function(*args, **kwargs):
        if _current != "native":
            raise RuntimeError(f"CUDAPluggableAllocator does not yet support {unsupported}")
        return native_result()

    return function


def _native_reserved():
    return int(os.environ.get("FAKE_TORCH_NATIVE_RESERVED", "0"))


memory_stats = _native_only("getDeviceStats", dict)
memory_allocated = _native_only("getDeviceStats", int)
max_memory_allocated = _native_only("getDeviceStats", int)
memory_reserved = _native_only("getDeviceStats", _native_reserved)
max_memory_reserved = _native_only("getDeviceStats", _native_reserved)
reset_peak_memory_stats = _native_only("resetPeakStats", lambda: None)
memory_summary = _native_only("getDeviceStats", str)
memory_snapshot = _native_only("snapshot", list)
_snapshot = _native_only("snapshot", dict)
_dump_snapshot = _native_only("snapshot", lambda: None)
_record_memory_history = _native_only("recordHistory", lambda: None)
