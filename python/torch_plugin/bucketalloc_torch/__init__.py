"""bucketalloc for PyTorch: the allocator as a CUDAPluggableAllocator, and its stats and snapshots.

``enable()`` makes libbucketalloc.so PyTorch's CUDA allocator (it must run before the first CUDA
allocation); ``python -m bucketalloc_torch script.py`` does the same for an unchanged program.
Under a pluggable allocator PyTorch's own ``torch.cuda.memory_stats()``, ``memory_summary()``,
``_snapshot()`` and friends raise, so this module provides them with the same names, keys and
layouts, read from the library; ``enable(patch_torch=True)`` installs them in ``torch.cuda``.

The inspection functions load only the library, never torch, so they also serve the simulated
device (``backend:sim``) in processes without PyTorch or a GPU.

Example::

    import bucketalloc_torch
    bucketalloc_torch.enable("max_split_size_mb:512", patch_torch=True)
    import torch
    x = torch.empty(1 << 20, device="cuda")
    print(bucketalloc_torch.memory_allocated())        # == torch.cuda.memory_allocated()
    bucketalloc_torch.dump_snapshot("snapshot.pickle")  # for pytorch.org/memory_viz

``device`` arguments accept None (the current torch device when torch is imported and CUDA is
initialized, else 0), an int, ``"cuda"``, ``"cuda:N"`` or a ``torch.device`` of type cuda.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import sys
import threading
import warnings
from typing import Any, ContextManager, Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

from . import _lib, _metrics, _torch_ext
from ._lib import BucketallocError
from ._metrics import metrics_port, metrics_text, register_metrics, start_timeline, stop_timeline

from ._version import project_version as _project_version

# The project's version (CMakeLists.txt; the C ABI reports the same).
__version__ = _project_version()

__all__ = [
    "BucketallocError",
    "bind_stream",
    "DEFAULT_HISTORY_ENTRIES",
    "check_invariants",
    "config",
    "configure",
    "dump_snapshot",
    "empty_cache",
    "enable",
    "fragmentation_histogram",
    "last_oom_report",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "metrics_port",
    "metrics_text",
    "record_memory_history",
    "register_metrics",
    "reset_peak_memory_stats",
    "set_tenant_cap",
    "snapshot",
    "start_timeline",
    "stop_timeline",
    "tenant",
    "tenant_stats",
    "unpatch_torch",
    "allocator_path",
]

CONF_ENV = "BUCKETALLOC_CONF"

# The default ring-buffer length of record_memory_history, per device. PyTorch's default
# (sys.maxsize) is not accepted: the library allocates the ring when recording starts.
DEFAULT_HISTORY_ENTRIES = 100_000

Device = Any  # None, an int, "cuda", "cuda:N" or a torch.device

# ---------------------------------------------------------------------------------------------
# Devices and configuration.


def _current_device() -> int:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


_DEVICE_ACCEPTED = f"None, an int from 0 to {_lib.C_INT_MAX}, 'cuda', 'cuda:N' or a torch.device of type cuda"


def _device_index(device: Device) -> int:
    """Turns a device argument into an index (see the module docstring for what is accepted); an
    index beyond a C int (which ctypes would wrap to another device: 2**32 to 0) is refused. Callers
    take the index before _lib.lib(), so that a refused device never loads the library."""
    if device is None:
        return _current_device()
    index: Any = device  # an int, else what checked_int refuses by its type
    if isinstance(device, str):
        kind, _, number = device.partition(":")
        if kind != "cuda" or (number and not number.isdigit()):
            raise ValueError(f"device={device!r} is not a CUDA device; accepted: {_DEVICE_ACCEPTED}")
        index = int(number) if number else None
    elif not isinstance(device, int) and hasattr(device, "type") and hasattr(device, "index"):  # a torch.device
        if device.type != "cuda":
            raise ValueError(f"device={device!r} is not a CUDA device; accepted: {_DEVICE_ACCEPTED}")
        index = device.index
    if index is None:
        return _current_device()
    return _lib.checked_int("device", index, 0, _lib.C_INT_MAX, _DEVICE_ACCEPTED, shown=device)


_HISTORY_MAX_ENTRIES = 2**24  # the library's kMaxHistoryEntries


def _format_option(key: str, value: Any, in_list: bool = False) -> str:
    """Formats one option value in BUCKETALLOC_CONF syntax (bools True/False, lists [a,b]).

    A value is one value: text with a ',' outside one bracketed list would set other keys
    (capacity="1GiB,sim_devices:2"), so it is refused; "[256:1,>:8]" is one list value.
    """
    _lib.checked_text("option name", key, "a keyword naming an option")
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)) and not in_list:
        return "[" + ",".join(_format_option(key, v, True) for v in value) + "]"
    if not isinstance(value, (str, int, float)):
        raise TypeError(f"option {key}={value!r} has type {type(value).__name__}; accepted: a str, int, float, "
                        "bool, or a list of str, int or float")
    text = str(value)
    _lib.checked_text(f"option {key}", text, "a str, int, float, bool, or a list of str, int or float")
    whole_list = not in_list and text.startswith("[") and text.endswith("]") and not any(c in text[1:-1] for c in "[]")
    if not whole_list and any(c in text for c in ",[]"):
        raise ValueError(f"option {key}={value!r} is not one value; accepted: a value without ',', '[' or ']', "
                         "or one bracketed list (each key is its own keyword)")
    return text


def _compose_conf(conf: Optional[str], options: Dict[str, Any]) -> Optional[str]:
    """Returns `conf` (BUCKETALLOC_CONF when None) extended by `options`, or None for neither."""
    if conf is not None and not isinstance(conf, str):
        raise TypeError(f"conf must be a string like 'backend:sim,capacity:4GiB' or None, not {type(conf).__name__}")
    if conf is not None:
        _lib.checked_text("conf", conf, "a string like 'backend:sim,capacity:4GiB' or None")
    if conf is None and not options:
        return None
    extra = [f"{key}:{_format_option(key, value)}" for key, value in options.items()]  # checked before ctypes
    # Without `conf`, the options extend what the environment gives, as the library reads it
    # (BUCKETALLOC_CONF, else PyTorch's variables).
    base = conf if conf is not None else _lib.read_text(_lib.lib().bucketalloc_env_config_string)
    return ",".join(([base] if base else []) + extra)

def _apply_conf(conf: Optional[str]) -> None:
    if conf is not None:
        encoded = _lib.checked_text("conf", conf)
        _lib.check(_lib.lib().bucketalloc_configure(encoded), "bucketalloc_configure")


def configure(conf: Optional[str] = None, **options: Any) -> None:
    """Sets the configuration of the process-wide allocator, without importing torch.

    Args:
        conf: options in BUCKETALLOC_CONF syntax, e.g. ``"backend:sim,capacity:4GiB"``
            (docs/configuration.md lists them); None: the environment (BUCKETALLOC_CONF, else PyTorch's
            PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF, as the library reads them).
        **options: more options, appended to `conf` and winning over it: ``capacity="4GiB"``,
            ``debug_check_invariants=True``, ``tiers=["64MiB", "128MiB"]``.
        With neither, nothing is set: the allocator is created from BUCKETALLOC_CONF, else defaults.

    Raises:
        BucketallocError: a bad key or value (the message names it and what is accepted), or the
            allocator already exists with a different configuration (it is created on first use
            and its configuration cannot change afterwards). Setting the configuration it already
            has is accepted.
        TypeError, ValueError: `conf`, an option's name or value holds a NUL (checked before
            ctypes, which would end the text there), or an option is not one value.
    """
    _apply_conf(_compose_conf(conf, options))


def config() -> str:
    """Returns the allocator's effective configuration in BUCKETALLOC_CONF syntax (every key)."""
    return _lib.read_text(_lib.lib().bucketalloc_config_string)


# ---------------------------------------------------------------------------------------------
# Stats, in torch.cuda.memory's names and layouts.


def memory_stats(device: Device = None) -> "collections.OrderedDict[str, Union[int, float]]":
    """Returns the statistics of `device`, keyed as torch.cuda.memory_stats() keys them.

    Keys are ``"<stat>.<pool>.<metric>"`` with pool all|small_pool|large_pool and metric
    current|peak|allocated|freed (e.g. ``"allocated_bytes.all.current"``), plus counters such as
    ``"num_alloc_retries"`` and ``"num_ooms"`` and bucketalloc's own (``"cached_bytes.*"``,
    ``"num_cache_hits"``, ``"capacity_bytes"``, ...), sorted by key like PyTorch's.
    """
    index = _device_index(device)
    text = _lib.read_text(_lib.lib().bucketalloc_stats_json, index)
    return collections.OrderedDict(sorted(json.loads(text).items()))


def _stat(device: Device, key: str) -> int:
    return memory_stats(device)[key]


def memory_allocated(device: Device = None) -> int:
    """Returns the bytes of live allocations of `device` (block sizes, after rounding)."""
    return _stat(device, "allocated_bytes.all.current")


def max_memory_allocated(device: Device = None) -> int:
    """Returns the peak of memory_allocated() since the start or the last reset_peak_memory_stats()."""
    return _stat(device, "allocated_bytes.all.peak")


def memory_reserved(device: Device = None) -> int:
    """Returns the bytes that bucketalloc holds from the device (segments and slabs)."""
    return _stat(device, "reserved_bytes.all.current")


def max_memory_reserved(device: Device = None) -> int:
    """Returns the peak of memory_reserved() since the start or the last reset_peak_memory_stats()."""
    return _stat(device, "reserved_bytes.all.peak")


def reset_peak_memory_stats(device: Device = None) -> None:
    """Resets every ``*.peak`` stat of `device` to its current value."""
    index = _device_index(device)
    _lib.check(_lib.lib().bucketalloc_reset_peak_stats(index), "bucketalloc_reset_peak_stats")


# The rows of the per-pool breakdown in the summary tables (torch's, then bucketalloc's), left out
# by abbreviated=True.
_POOL_ROW_PREFIXES = ("|       from large pool", "|       from small pool", "|   from large pool", "|   from small pool")


def memory_summary(device: Device = None, abbreviated: bool = False) -> str:
    """Returns the readable summary of `device`: torch.cuda.memory_summary()'s table, rendered
    exactly as torch renders it, then bucketalloc's rows (cap, cached bytes, every counter) and the
    fragmentation table (histograms, tiers).

    Args:
        device: the device.
        abbreviated: leave out the per-pool rows (large/small pool), as
            torch.cuda.memory_summary(abbreviated=True) does.
    """
    index = _device_index(device)
    text = _lib.read_text(_lib.lib().bucketalloc_summary, index)
    if not abbreviated:
        return text
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(_POOL_ROW_PREFIXES))


def fragmentation_histogram(device: Device = None) -> Dict[str, Any]:
    """Returns the fragmentation report of `device`.

    The dict has ``"all"``, ``"small_pool"`` and ``"large_pool"``, each with reserved, allocated,
    requested, total_free and largest_free bytes, external_fragmentation (1 - largest_free /
    total_free), internal_fragmentation (1 - requested / allocated) and ``"histogram"``: the free
    blocks in power-of-two bins, ``[{"min_bytes", "max_bytes", "count", "bytes"}, ...]``; and
    ``"tiers"``: ``[{"tier_bytes", "in_use", "cached"}, ...]``.
    """
    index = _device_index(device)
    return json.loads(_lib.read_text(_lib.lib().bucketalloc_fragmentation_json, index))


def last_oom_report(device: Device = None) -> str:
    """Returns the report of the last out-of-memory failure of `device` ("" when there was none).

    Its first line names the cause: capacity, fragmentation, cache held or device exhausted.
    """
    index = _device_index(device)
    return _lib.read_text(_lib.lib().bucketalloc_last_oom_report, index)


def check_invariants(device: Device = None) -> None:
    """Checks every internal invariant of `device`; raises BucketallocError naming a broken one."""
    index = _device_index(device)
    _lib.check(_lib.lib().bucketalloc_check_invariants(index), "bucketalloc_check_invariants")


# ---------------------------------------------------------------------------------------------
# Tenants (tenants:[NAME:SIZE,...] in the configuration).


def _tenant_name(name: str) -> bytes:
    return _lib.checked_text("name", name, "a tenant's name (str) or 'default'")


def tenant(name: str) -> ContextManager[None]:
    """Sends this thread's allocations to tenant `name` inside the block, then back to the tenant before.

    ``with bucketalloc_torch.tenant("long"): ...``: every allocation the thread makes there (unless
    its stream is bound to a tenant, see bind_stream) comes from the tenant's own pools, under its cap.
    Per thread: other threads (autograd's backward threads among them) keep their own tenant.

    Raises:
        TypeError, ValueError: `name` is not a str, or holds a NUL (at this call, before the block).
        BucketallocError: a name that is not a tenant (the message lists them), on entering the block.
    """
    return _tenant_block(_tenant_name(name))


@contextlib.contextmanager
def _tenant_block(encoded: bytes) -> Iterator[None]:
    before = _lib.read_text(_lib.lib().bucketalloc_thread_tenant)
    _lib.check(_lib.lib().bucketalloc_set_thread_tenant(encoded), "bucketalloc_set_thread_tenant")
    try:
        yield
    finally:
        _lib.check(_lib.lib().bucketalloc_set_thread_tenant(before.encode()), "bucketalloc_set_thread_tenant")


def bind_stream(stream: Any, name: str) -> None:
    """Binds `stream` (a torch.cuda.Stream or a cudaStream_t as an int) to tenant `name` on every device.

    Allocations on that stream then go to the tenant, from any thread; "default" unbinds it.

    Raises:
        TypeError, ValueError: a stream that is not an int handle from 0 to 2**64 - 1 (or a
            torch.cuda.Stream), a name that is not a str or holds a NUL.
        BucketallocError: a name that is not a tenant.
    """
    argument, handle = ("stream", stream)
    if hasattr(stream, "cuda_stream"):  # a torch.cuda.Stream
        argument, handle = ("stream.cuda_stream", stream.cuda_stream)
    handle = _lib.checked_int(argument, handle, 0, _lib.C_UINTPTR_MAX, "a torch.cuda.Stream or a cudaStream_t "
                              f"handle as an int from 0 to {_lib.C_UINTPTR_MAX}")
    encoded = _tenant_name(name)
    _lib.check(_lib.lib().bucketalloc_bind_stream(handle, encoded), "bucketalloc_bind_stream")


def set_tenant_cap(name: str, cap_bytes: int) -> None:
    """Changes tenant `name`'s cap on reserved memory (2 MiB to 16 TiB) on every device.

    Lowering it below what the tenant holds releases its cache and refuses its growth until it
    fits; live tensors are never freed.

    Raises:
        TypeError, ValueError: a name that is not a str or holds a NUL; a cap that is not an int
            from 0 to 2**64 - 1 (checked here: ctypes would wrap it).
        BucketallocError: a name that is not a tenant, the default tenant, a cap outside 2 MiB to 16 TiB.
    """
    encoded = _tenant_name(name)
    cap = _lib.checked_int("cap_bytes", cap_bytes, 0, _lib.C_SIZE_MAX,
                           f"an int from 0 to {_lib.C_SIZE_MAX} (a size_t; the library accepts 2 MiB to 16 TiB)")
    _lib.check(_lib.lib().bucketalloc_set_tenant_cap(encoded, cap), "bucketalloc_set_tenant_cap")


def tenant_stats(device: Device = None) -> List[Dict[str, Any]]:
    """Each tenant's figures on `device`, the default tenant first (empty without tenants).

    Each dict has tenant, cap_bytes, reserved_bytes, peak_reserved_bytes, allocated_bytes,
    requested_bytes, cached_bytes, live_allocations, ooms and ooms_at_cap (refused by its own cap).
    """
    index = _device_index(device)
    data = json.loads(_lib.read_text(_lib.lib().bucketalloc_tenant_stats_json, index))
    return list(data["tenants"])


def empty_cache() -> None:
    """Releases every cached segment and empty slab of every device (torch.cuda.empty_cache()).

    Waits for the stream events of blocks freed after record_stream first. Not allowed during a
    CUDA stream capture; the library prints a failure on stderr (this hook has no error return).
    """
    _lib.lib().bucketalloc_empty_cache()


# ---------------------------------------------------------------------------------------------
# Snapshots and history, in the layout of torch.cuda.memory._snapshot().


def snapshot(device: Device = None) -> Dict[str, Any]:
    """Returns the memory snapshot in the layout of torch.cuda.memory._snapshot().

    ``"segments"``: every segment (large pool) and slab (small pool) with its ``"blocks"`` and their
    states (active_allocated, active_pending_free, inactive); ``"device_traces"``: per device, the
    recorded history (see record_memory_history()); ``"allocator_settings"``. bucketalloc records
    no stacks: an active block or trace entry has one frame that says so, a free block none.

    Args:
        device: None for every device (as PyTorch's _snapshot()), else only that device's segments.
    """
    index = -1 if device is None else _device_index(device)
    data = json.loads(_lib.read_text(_lib.lib().bucketalloc_snapshot_json, index))
    for segment in data["segments"]:
        segment["segment_pool_id"] = tuple(segment["segment_pool_id"])
    for trace in data["device_traces"]:
        for entry in trace:
            entry["pool_id"] = tuple(entry["pool_id"])  # as torch's snapshot gives it
    _attach_stacks(data)
    return data


def _attach_stacks(data: Dict[str, Any]) -> None:
    """Gives active blocks, and the latest alloc entry of each address, the Python stack recorded
    for that address (record_memory_history(stacks="python") under enable())."""
    table = _torch_ext.stacks()
    if not table:
        return
    for segment in data["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "inactive" and block["address"] in table:
                block["frames"] = table[block["address"]]
    for trace in data["device_traces"]:
        latest = {e["addr"]: i for i, e in enumerate(trace) if e["action"] == "alloc"}
        for address, i in latest.items():
            if address in table:
                trace[i]["frames"] = table[address]


def dump_snapshot(filename: Union[str, "os.PathLike[str]"] = "dump_snapshot.pickle",
                  augment_with_fx_traces: bool = False) -> None:
    """Writes snapshot() as a pickle, as torch.cuda.memory._dump_snapshot() does.

    The file opens in https://pytorch.org/memory_viz and in ``python torch/cuda/_memory_viz.py``.
    `augment_with_fx_traces` is accepted for torch's signature; bucketalloc records no FX traces.
    """
    del augment_with_fx_traces
    data = snapshot()
    with open(filename, "wb") as f:
        pickle.dump(data, f)


def record_memory_history(enabled: Union[None, bool, str] = "all", max_entries: int = DEFAULT_HISTORY_ENTRIES) -> None:
    """Turns the allocation history (snapshot()["device_traces"]) on or off for every device.

    Args:
        enabled: ``"all"`` or ``"state"`` (or True) turns recording on; None (or False) turns it
            off. Either clears the history, as PyTorch does: take the snapshot before turning it off.
        max_entries: the number of entries kept per device, the newest ones (a ring buffer);
            1 to 2**24.
    """
    if enabled is None or enabled is False:
        on = False
    elif enabled is True or enabled in ("all", "state"):
        on = True
    else:
        raise ValueError(f"enabled={enabled!r}; accepted: 'all', 'state' or True (on), None or False (off)")
    # ctypes would wrap 2**64 to 0; turning recording off ignores the length (any int is accepted).
    accepted = f"an int from 1 to {_HISTORY_MAX_ENTRIES}"
    if on:
        max_entries = _lib.checked_int("max_entries", max_entries, 1, _HISTORY_MAX_ENTRIES, accepted)
    else:
        max_entries = max(0, min(_lib.checked_int("max_entries", max_entries, None, None, accepted),
                                 _HISTORY_MAX_ENTRIES))
    _lib.check(_lib.lib().bucketalloc_record_history(int(on), max_entries), "bucketalloc_record_history")
    if not on:
        _torch_ext.record_stacks(False)


# ---------------------------------------------------------------------------------------------
# PyTorch integration.

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
            _record_memory_history (which raise under a pluggable allocator) by this module's;
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


# Stand-ins for torch functions whose signatures differ from this module's.


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
