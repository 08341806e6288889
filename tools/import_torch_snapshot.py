#!/usr/bin/env python3
"""tools/import_torch_snapshot.py — a PyTorch memory snapshot pickle to a bucketalloc-bench trace.

    python3 tools/import_torch_snapshot.py SNAPSHOT.pickle [--device N] -o TRACE.csv

Reads the file written by torch.cuda.memory._dump_snapshot() (or bucketalloc_torch.dump_snapshot())
with a restricted unpickler that builds only plain data (dicts, lists, tuples, strings, numbers) and
refuses every class or function reference, so a hostile file executes nothing. The device's
history (`device_traces[N]`, recorded with _record_memory_history) becomes RMM replay-log CSV:
`alloc` -> allocate, `free_completed` -> free (the moment the block became reusable; a
`free_requested` alone is ignored). A free whose alloc is not in the history (the ring buffer
dropped it) is dropped. Exits 2 with a message naming the problem on bad input.
"""

from __future__ import annotations

import argparse
import pickle
import sys


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused."""

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's hook
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a memory snapshot holds only plain data (dicts, lists, "
            "strings, numbers), so this file is not one, or is hostile"
        )


def load_snapshot(path: str) -> dict:
    with open(path, "rb") as f:
        data = RestrictedUnpickler(f).load()
    if not isinstance(data, dict) or "device_traces" not in data:
        raise ValueError(f"{path}: not a memory snapshot (expected a dict with 'device_traces')")
    return data


# The largest request any replayed allocator accepts (bucketalloc's kMaxRequestBytes, 64 TiB).
MAX_REQUEST_BYTES = 1 << 46


def _integer(entry: dict, key: str, where: str, lo: int, hi: int) -> int:
    """entry[key] (0 when absent) as an int in [lo, hi]; ValueError naming the entry otherwise."""
    value = entry.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{where}: {key} is {value!r}; accepted: an integer from {lo} to {hi}")
    return value


def to_trace(snapshot: dict, device: int | None) -> tuple[int, list[str]]:
    traces = snapshot["device_traces"]
    if device is None:
        device = next((d for d, entries in enumerate(traces) if entries), None)
        if device is None:
            raise ValueError("the snapshot has no history: record it with _record_memory_history first")
    if not 0 <= device < len(traces):
        raise ValueError(f"device {device} is out of range; the snapshot has {len(traces)} device(s)")
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    live: dict[int, int] = {}
    for index, entry in enumerate(traces[device]):
        where = f"device_traces[{device}][{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is a {type(entry).__name__}; accepted: a dict of one trace entry")
        action = entry.get("action")
        addr = _integer(entry, "addr", where, 0, 2**64 - 1)
        size = _integer(entry, "size", where, 0, MAX_REQUEST_BYTES)
        stream = _integer(entry, "stream", where, 0, 2**64 - 1)
        time = entry.get("time_us", 0)
        if isinstance(time, bool) or not isinstance(time, (int, float)):
            raise ValueError(f"{where}: time_us is {time!r}; accepted: a number of microseconds")
        if action == "alloc" and size > 0 and addr == 0:
            raise ValueError(f"{where}: an alloc of {size} bytes at address 0; accepted: an address")
        if action == "alloc" and size > 0:
            live[addr] = size
            lines.append(f"1,{time},allocate,0x{addr:x},{size},0x{stream:x}")
        elif action == "free_completed" and addr in live:
            lines.append(f"1,{time},free,0x{addr:x},{live.pop(addr)},0x{stream:x}")
    return device, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", help="the pickle written by torch.cuda.memory._dump_snapshot()")
    parser.add_argument("--device", type=int, default=None, help="the device (default: the first with history)")
    parser.add_argument("-o", "--output", required=True, help="the trace to write (RMM CSV)")
    args = parser.parse_args(argv)
    try:
        snapshot = load_snapshot(args.snapshot)
        device, lines = to_trace(snapshot, args.device)
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as e:
        print(f"import_torch_snapshot: {e}", file=sys.stderr)
        return 2
    with open(args.output, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{args.output}: device {device}, {len(lines) - 1} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
