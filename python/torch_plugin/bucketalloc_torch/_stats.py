"""Stats, in torch.cuda.memory's names and layouts: memory_stats() and the counters read from it,
the readable summary, the fragmentation and out-of-memory reports, the invariant check,
empty_cache() and prefetch()."""

from __future__ import annotations

import collections
import ctypes
import json
from typing import Any, Dict, Union

from . import _lib
from ._config import Device, _device_index


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


def empty_cache() -> None:
    """Releases every cached segment and empty slab of every device (torch.cuda.empty_cache()).

    Waits for the stream events of blocks freed after record_stream first. Not allowed during a
    CUDA stream capture; the library prints a failure on stderr (this hook has no error return).
    """
    _lib.lib().bucketalloc_empty_cache()


def prefetch(spare_target: int, max_create: int = 0, device: Device = None) -> int:
    """Creates physical memory on `device` ahead of need, off any request's path; returns the bytes created.

    Brings the spare pieces of the device's large pool up to `spare_target` bytes, creating at most
    `max_create` bytes (0: no limit) in whole granules; later grows and stitches map spares instead
    of creating (no cuMemCreate on a request's path). Spares count as reserved, never pass the cap
    (it stops there), and empty_cache() gives them back. It holds the device's lock while it creates
    (about 0.2 ms per 2 MiB on an A100): call it where no request waits (start-up, between steps),
    again as requests use the spares.

    Raises:
        BucketallocError: the device's segments are not virtual memory (backend:vmm or
            expandable_segments:true needed), or it had to create and the cap let it create nothing.
    """
    target = _lib.checked_int("spare_target", spare_target, 0, _lib.C_SIZE_MAX)
    limit = _lib.checked_int("max_create", max_create, 0, _lib.C_SIZE_MAX)
    index = _device_index(device)
    created = ctypes.c_size_t(0)
    _lib.check(_lib.lib().bucketalloc_prefetch(index, target, limit, ctypes.byref(created)), "bucketalloc_prefetch")
    return created.value
