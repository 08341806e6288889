"""PyTorch integration: enable() and allocator_path(), the two ways of installing bucketalloc as
torch's CUDA allocator (the native CUDAAllocator, or CUDAPluggableAllocator with its hooks), and the
stand-ins that enable(patch_torch=True) puts in torch.cuda (unpatch_torch() restores torch's).

The record of what enable() installed and the registry of patched torch functions live here only."""

from __future__ import annotations

import threading
import warnings
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

from . import _lib, _metrics, _torch_ext
from ._config import Device, _apply_conf, _compose_conf
from ._lib import BucketallocError
from ._snapshots import DEFAULT_HISTORY_ENTRIES, dump_snapshot, record_memory_history, snapshot
from ._stats import (
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
)

# Hook setters of CUDAPluggableAllocator.allocator() and the library functions they get. A setter
# that this torch version lacks is skipped.
_HOOKS = (
    ("set_init_fn", "bucketalloc_init"),
    ("set_reset_fn", "bucketalloc_empty_cache"),
    ("set_memory_fraction_fn", "bucketalloc_set_memory_fraction"),
    ("set_record_stream_fn", "bucketalloc_record_stream"),
    ("set_base_alloc_fn", "bucketalloc_base_alloc"),
    # CUDA graphs: CUDAGraph.capture_begin / capture_end / reset announce captures and graph pools
    # (C++ functions: the begin hook takes a std::function; see bucketalloc.h).
    ("set_begin_allocate_to_pool", "bucketalloc_torch_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "bucketalloc_torch_end_allocate_to_pool"),
    ("set_release_pool", "bucketalloc_torch_release_pool"),
)


class _Enabled(NamedTuple):
    raise_on_oom: bool
    allocator: Any  # torch's allocator object: the native one's _CUDAAllocator, or the CUDAPluggableAllocator
    path: str  # "native" or "pluggable"


_enable_lock = threading.Lock()
_enabled: Optional[_Enabled] = None


def _too_late(detail: str) -> BucketallocError:
    return BucketallocError(
        f"cannot make bucketalloc PyTorch's CUDA allocator: {detail}. PyTorch can swap its allocator only "
        "before the first CUDA allocation (in practice, before CUDA is initialized). Call "
        "bucketalloc_torch.enable() before anything touches CUDA, or run the program unchanged with "
        "`python -m bucketalloc_torch [--conf CONF] script.py [args...]`"
    )


def _refuse_if_native_allocator_used(torch: Any) -> None:
    if not torch.cuda.is_initialized():
        return
    try:
        reserved = sum(torch.cuda.memory_reserved(d) for d in range(torch.cuda.device_count()))
    except RuntimeError:
        return  # another pluggable allocator is current; change_current_allocator decides
    if reserved:
        raise _too_late(f"PyTorch's native allocator already holds {reserved} bytes of CUDA memory")


def _alloc_functions(torch: Any, raise_on_oom: bool) -> Tuple[str, str, str]:
    """The library path and the alloc and free function names torch is given.

    raise_on_oom: the alloc function compiled against this torch (``_torch_ext``), which raises
    torch.cuda.OutOfMemoryError; when it cannot be built, bucketalloc_malloc_or_throw (a RuntimeError)
    with a warning that names what is missing. Otherwise bucketalloc_malloc (NULL on failure).
    """
    if not raise_on_oom:
        return _lib.library_path(), "bucketalloc_malloc", "bucketalloc_free"
    try:
        return _torch_ext.load(torch, _lib.lib()), _torch_ext.MALLOC, _torch_ext.FREE
    except _torch_ext.Unavailable as e:
        warnings.warn(
            "bucketalloc: an out-of-memory failure will raise RuntimeError, not torch.cuda.OutOfMemoryError, "
            f"because the alloc function compiled against this torch cannot be built: {e}",
            RuntimeWarning,
            stacklevel=3,
        )
        return _lib.library_path(), "bucketalloc_malloc_or_throw", "bucketalloc_free"


def _check_device() -> None:
    """Creates the allocator now, so that a missing or too old driver is reported by enable()."""
    if _lib.lib().bucketalloc_device_count() < 0:
        raise BucketallocError(_lib.last_error() or "bucketalloc: the allocator cannot be created")


# What the pluggable fallback does not serve, for the warning that names it.
_PLUGGABLE_LIMITS = (
    "torch's own memory_stats/memory_summary/_snapshot/_record_memory_history (use patch_torch=True or "
    "bucketalloc_torch's functions), cacheInfo (cudnn.benchmark), torch.compile(mode='reduce-overhead') "
    "(cudagraph trees), CUDA IPC (torch.multiprocessing), MemPool use counts and OOM observers"
)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            f"bucketalloc_torch.enable() needs PyTorch ({e}); the stats and snapshot functions work without it"
        ) from e
    return torch


def _install_native(torch: Any) -> Any:
    """Makes the native allocator (``csrc/native_allocator.cc``) torch's CUDA allocator; returns torch's
    object for it. Raises _torch_ext.Unavailable when it cannot be built here."""
    _refuse_if_native_allocator_used(torch)
    try:
        _torch_ext.load_native(torch, _lib.library_path())
    except RuntimeError as e:
        if isinstance(e, _torch_ext.Unavailable):
            raise
        if "already initialized" in str(e):
            raise _too_late(f"PyTorch says: {e}") from e
        raise BucketallocError(f"bucketalloc: torch refused the native allocator: {e}") from e
    return torch.cuda.memory._get_current_allocator()


def _install(raise_on_oom: bool, torch: Any) -> Any:
    """Creates the CUDAPluggableAllocator with every hook this torch has and makes it current."""
    _refuse_if_native_allocator_used(torch)
    path, malloc_name, free_name = _alloc_functions(torch, raise_on_oom)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, malloc_name, free_name)
    hooks = allocator.allocator()
    for setter, function in _HOOKS:
        if hasattr(hooks, setter):
            getattr(hooks, setter)(_lib.function_address(function))
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        if "already initialized" in str(e):
            raise _too_late(f"PyTorch says: {e}") from e
        raise
    return allocator


def enable(
    conf: Optional[str] = None,
    *,
    patch_torch: bool = False,
    raise_on_oom: bool = True,
    native: Optional[bool] = None,
    **options: Any,
) -> Any:
    """Makes bucketalloc PyTorch's CUDA allocator; call it before the first CUDA allocation.

    Configures the library (see configure()), then installs bucketalloc by one of two paths
    (``allocator_path()`` says which is active):

    - native (the default when it can be built): a ``c10::cuda::CUDACachingAllocator::CUDAAllocator``
      compiled against the installed torch (``csrc/native_allocator.cc``, cached per torch build)
      becomes the allocator torch holds, as its own ``change_current_allocator`` makes one current.
      torch's own memory functions, cuDNN's benchmark, torch.compile's cudagraph trees, MemPool,
      CUDA IPC and OOM observers then work unpatched (docs/pytorch.md, "Compatibility").
    - pluggable (the fallback): ``torch.cuda.memory.CUDAPluggableAllocator(libbucketalloc.so, malloc,
      "bucketalloc_free")`` with the hooks this torch version has; torch treats it as a guest. Used
      when the native allocator cannot be built (no C++ compiler, no torch or CUDA runtime headers:
      a warning names what is missing and what then does not work), with ``native=False``, or with
      ``raise_on_oom=False``.

    A second call with the same path and raise_on_oom swaps nothing again: it applies
    `patch_torch`, and a configuration only as configure() would (the same one is accepted;
    another one only while the allocator has not been created yet).

    Args:
        conf: options in BUCKETALLOC_CONF syntax; None: the environment (see configure()).
        patch_torch: also replace torch.cuda's memory_stats, memory_allocated,
            max_memory_allocated, memory_reserved, max_memory_reserved, reset_peak_memory_stats,
            memory_summary, memory_snapshot and torch.cuda.memory's _snapshot, _dump_snapshot and
            _record_memory_history (which raise under a pluggable allocator) by bucketalloc_torch's;
            unpatch_torch() restores them.
        raise_on_oom: a failed allocation raises ``torch.cuda.OutOfMemoryError`` (PyTorch's
            c10::OutOfMemoryError, thrown by an alloc function compiled against the installed torch
            on first use and cached; see _torch_ext), whose message begins as PyTorch's ("CUDA out
            of memory. Tried to allocate ...") and continues with bucketalloc's report. Without a
            C++ compiler or torch's headers it is a RuntimeError carrying the report, with a
            warning saying what is missing. False uses ``bucketalloc_malloc``, which returns NULL,
            and PyTorch does not check that pointer: keep the default.
        native: True: the native path or an error saying why it cannot be built; False: the
            pluggable path; None (default): native when it can be built, else pluggable with a warning.
        **options: more options, appended to `conf` (e.g. ``capacity="40GiB"``).

    When prometheus_client is installed, bucketalloc's metrics are registered in its default
    registry (register_metrics()), so a server that exposes /metrics with it shows them.

    The defaults are PyTorch's policy. Which options remove a workload's fragmentation (tiers,
    stitching, max_split_size_mb, ...) depends on it: ``bucketalloc-bench tune`` on a recording of
    the service (a ``torch.cuda.memory._dump_snapshot`` pickle, a profiler trace) recommends a
    ``conf`` checked on a part of the recording it did not tune on (docs/harness.md, "Tune").

    Returns:
        torch's object for the allocator: ``torch.cuda.memory._get_current_allocator()`` on the native
        path, the ``torch.cuda.memory.CUDAPluggableAllocator`` on the pluggable one.

    Raises:
        BucketallocError: a bad option, no usable device (the message says which case: no NVIDIA
            driver, or a driver too old for the library, with the versions), a configuration that
            differs from the one the allocator was already created with, a second call with another raise_on_oom, or CUDA already in use
            by PyTorch's native allocator (the swap is too late; the message says what to do).
        ImportError: torch cannot be imported.
    """
    global _enabled
    requested = _compose_conf(conf, options)
    if native is not None and not isinstance(native, bool):
        raise TypeError(f"native={native!r}; accepted: None, True or False")
    if native and not raise_on_oom:
        raise BucketallocError("native=True and raise_on_oom=False: the native allocator always raises "
                               "torch.cuda.OutOfMemoryError; raise_on_oom=False needs native=False or None")
    with _enable_lock:
        if _enabled is not None and _enabled.raise_on_oom != raise_on_oom:
            raise BucketallocError(
                f"bucketalloc is already PyTorch's allocator with raise_on_oom={not raise_on_oom}; "
                "PyTorch cannot swap an allocator in use, so it cannot change"
            )
        if _enabled is not None and native is not None and (_enabled.path == "native") != native:
            raise BucketallocError(
                f"bucketalloc is already PyTorch's allocator through the {_enabled.path} path; PyTorch cannot swap "
                "an allocator in use, so it cannot change"
            )
        _apply_conf(requested)  # the library accepts the configuration it already has
        if _enabled is None:
            _check_device()
            torch = _import_torch()
            allocator, path = None, "pluggable"
            if native is not False and raise_on_oom:
                try:
                    allocator, path = _install_native(torch), "native"
                except _torch_ext.Unavailable as e:
                    if native:
                        raise BucketallocError(f"bucketalloc: the native allocator cannot be built: {e}") from e
                    warnings.warn(
                        f"bucketalloc: PyTorch's allocator interface is served through CUDAPluggableAllocator, "
                        f"because the native allocator cannot be built: {e}. Then these do not work: "
                        f"{_PLUGGABLE_LIMITS}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            if allocator is None:
                allocator = _install(raise_on_oom, torch)
            _enabled = _Enabled(raise_on_oom, allocator, path)
            _metrics.register_if_available()
        if patch_torch and _enabled.path == "pluggable":
            _patch_torch()  # torch's own functions serve the native path unpatched
        return _enabled.allocator


def allocator_path() -> Optional[str]:
    """The path enable() installed bucketalloc by: "native" (the allocator torch holds is
    bucketalloc's own CUDAAllocator), "pluggable" (CUDAPluggableAllocator), or None before enable()."""
    return None if _enabled is None else _enabled.path


# Stand-ins for torch functions whose signatures differ from bucketalloc_torch's.


def _memory_snapshot_as_torch(mempool_id: Any = None) -> List[Dict[str, Any]]:
    """Stands in for torch.cuda.memory_snapshot(): the segments of every device."""
    if mempool_id is not None:
        raise BucketallocError(f"memory_snapshot(mempool_id={mempool_id!r}): bucketalloc has no memory pools")
    return snapshot()["segments"]


def _record_memory_history_as_torch(
    enabled: Union[None, bool, str] = "all",
    context: Optional[str] = "all",
    stacks: str = "all",
    max_entries: int = DEFAULT_HISTORY_ENTRIES,
    device: Device = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: Optional[List[str]] = None,
) -> None:
    """Stands in for torch.cuda.memory._record_memory_history (same parameters, same order).

    With `context` not None and `stacks` "python" or "all", every allocation records the Python
    stack of the calling thread (under enable()'s compiled alloc function; C++ frames are not
    recorded), which snapshot() gives the active blocks and the latest alloc entry of each
    address. `compile_context` and `global_record_annotations` change nothing; every device is
    recorded (`device` is not used); turning recording on always clears the history
    (`clear_history` is implied); every action is recorded (`skip_actions` must be empty).
    """
    del device, clear_history, compile_context, global_record_annotations
    if skip_actions:
        raise BucketallocError(f"skip_actions={skip_actions!r}: bucketalloc records every action; accepted: None or []")
    record_memory_history(enabled, max_entries)
    if enabled is None or enabled is False:
        return
    want = context is not None and stacks in ("python", "all")
    if not _torch_ext.record_stacks(want) and want:
        warnings.warn(
            "bucketalloc: Python stacks are recorded only by the alloc function bucketalloc_torch.enable() compiles "
            "against torch (it is not in use); the snapshot's blocks carry a frame saying no stack was recorded",
            RuntimeWarning,
            stacklevel=2,
        )


def _snapshot_as_torch(device: Device = None, augment_with_fx_traces: bool = False) -> Dict[str, Any]:
    """Stands in for torch.cuda.memory._snapshot (bucketalloc records no FX traces)."""
    del augment_with_fx_traces
    return snapshot(device)


# torch name -> stand-in, installed on torch.cuda and torch.cuda.memory where the name exists.
_TORCH_STAND_INS = {
    "memory_stats": memory_stats,
    "memory_allocated": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "memory_reserved": memory_reserved,
    "max_memory_reserved": max_memory_reserved,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "memory_summary": memory_summary,
    "memory_snapshot": _memory_snapshot_as_torch,
    "_snapshot": _snapshot_as_torch,
    "_dump_snapshot": dump_snapshot,
    "_record_memory_history": _record_memory_history_as_torch,
}

# (module, name) -> the torch function replaced, while patched.
_originals: Dict[Tuple[Any, str], Any] = {}


def _patch_torch() -> None:
    import torch

    for module in (torch.cuda, torch.cuda.memory):
        for name, stand_in in _TORCH_STAND_INS.items():
            if hasattr(module, name):
                _originals.setdefault((module, name), getattr(module, name))
                setattr(module, name, stand_in)


def unpatch_torch() -> None:
    """Restores the torch.cuda functions that enable(patch_torch=True) replaced (no-op otherwise)."""
    with _enable_lock:
        for (module, name), original in _originals.items():
            setattr(module, name, original)
        _originals.clear()
