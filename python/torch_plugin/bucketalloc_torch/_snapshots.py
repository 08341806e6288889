"""Snapshots and history, in the layout of torch.cuda.memory._snapshot(): snapshot(),
dump_snapshot(), record_memory_history(), and the Python stacks attached to the snapshot's blocks."""

from __future__ import annotations

import json
import os
import pickle
from typing import Any, Dict, Union

from . import _lib, _torch_ext
from ._config import Device, _device_index

# The default ring-buffer length of record_memory_history, per device. PyTorch's default
# (sys.maxsize) is not accepted: the library allocates the ring when recording starts.
DEFAULT_HISTORY_ENTRIES = 100_000

_HISTORY_MAX_ENTRIES = 2**24  # the library's kMaxHistoryEntries


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
