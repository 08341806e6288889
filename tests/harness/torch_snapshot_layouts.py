#!/usr/bin/env python3
"""tests/harness/torch_snapshot_layouts.py — memory snapshots in every layout torch has written.

    python3 torch_snapshot_layouts.py OUT_DIR [--entries N]

Writes OUT_DIR/LAYOUT.pickle for each layout below: the same workload (a serving loop of allocs and
frees on one device, with stacks of 12 to 30 of 1,500 distinct frames, segment_alloc,
free_requested, an `oom` entry and a `snapshot` entry), with the keys each torch release wrote
(docs/harness.md, "Reading a snapshot", which cites the releases' sources):

  torch-2.0      torch.cuda.memory._snapshot() pickled by the user (_dump_snapshot came in 2.1):
                 blocks carry "history"; trace entries have no "time_us", and "cpp_frames"
  torch-2.1      _dump_snapshot: pickle protocol 4; entries without "time_us"; blocks "frames"
  torch-2.2      + "time_us" (int microseconds since the epoch)
  torch-2.3      + top-level "allocator_settings"
  torch-2.5      + top-level "external_annotations"
  torch-2.8      + "compile_context" in each entry
  torch-2.10     + "user_metadata" in each entry
  torch-cpp      torch's C++ pickler (_memory_snapshot_pickled): protocol 2, strings memoized by value,
                 frame lists and frame dicts shared wherever torch shares them

Stacks: each entry's frame list is its own, of frame dicts torch's symbolizer shares (one per distinct
frame), which both picklers write once and reference after; Python's pickle memoizes by identity (the
frames' strings are new objects per frame), the C++ pickler also shares equal strings. Prints "LAYOUT bytes entries allocs frees" per file.
Also writes the hostile pickles of issue 42 with --hostile: string_bomb.pickle (one 1 MiB string
memoized and referenced 20,000 times in a history entry's frames) and shared_entries.pickle (a history
whose one entry dict is referenced 200,000 times, in 100 device lists).
"""

from __future__ import annotations

import argparse
import os
import pickle
import random

MiB = 1 << 20
LAYOUTS = ["torch-2.0", "torch-2.1", "torch-2.2", "torch-2.3", "torch-2.5", "torch-2.8", "torch-2.10", "torch-cpp"]


def fresh(s: str) -> str:
    """A new string object equal to s (Python's pickle shares only the same object)."""
    return (s + "\0")[:-1]


def make_frames(rng: random.Random, shared_strings: bool, count: int) -> list[dict]:
    """The frames the run's stacks are made of, one dict each (torch's symbolizer makes one Python dict
    per distinct frame and reuses it in every stack that holds the frame)."""
    files = [f"/opt/venv/lib/python3.11/site-packages/{pkg}/{mod}.py" for pkg in ("torch", "vllm", "transformers")
             for mod in ("module", "linear", "attention", "model_runner", "sampler", "cache_engine", "activation")]
    names = ["forward", "_call_impl", "__call__", "execute_model", "_prepare_inputs", "allocate", "empty",
             "matmul", "softmax", "_wrapped_call_impl", "decode", "prefill", "run", "step"]
    frames = []
    for _ in range(count):
        f, n = rng.choice(files), rng.choice(names)
        frames.append({"filename": f if shared_strings else fresh(f), "line": rng.randint(1, 3000),
                       "name": n if shared_strings else fresh(n)})
    return frames


def make_stack(rng: random.Random, frames: list[dict]) -> list[dict]:
    """A new list per entry (each allocation captures its own traceback), of shared frame dicts."""
    start = rng.randrange(max(1, len(frames) - 30))
    return frames[start:start + rng.randint(12, 30)]


def build(layout: str, entries: int, seed: int = 42, frames: int = 1500) -> tuple[dict, int, int]:
    rng = random.Random(seed)
    major_minor = (2, 99) if layout == "torch-cpp" else tuple(int(x) for x in layout.split("-")[1].split("."))
    cpp = layout == "torch-cpp"
    frames = make_frames(rng, shared_strings=cpp, count=frames)
    t0 = 1_733_500_000_000_000

    def entry(action: str, addr: int, size: int, t: int, key: str = "addr") -> dict:
        e = {"action": action, key: addr, "size": size, "stream": 0}
        if major_minor >= (2, 2):
            e["time_us"] = t0 + t
        if major_minor >= (2, 8):
            e["compile_context"] = ""
        if major_minor >= (2, 10):
            e["user_metadata"] = ""
        e["frames"] = make_stack(rng, frames)
        if major_minor == (2, 0):
            e["cpp_frames"] = []
        return e

    history, live, t = [], [], 0
    base, allocs, frees = 0x7F0000000000, 0, 0
    # One segment that holds every allocation at its own address (no address is used twice).
    total = (entries * 20 * MiB) // (1 << 30) * (1 << 30) + (1 << 30)
    history.append(entry("segment_alloc", base, total, t))
    next_addr = base
    for i in range(entries):
        t += rng.randint(5, 400)
        if live and (len(live) > 64 or rng.random() < 0.45):
            addr, size = live.pop(rng.randrange(len(live)))
            history.append(entry("free_requested", addr, size, t))
            history.append(entry("free_completed", addr, size, t + 3))
            frees += 1
        else:
            size = rng.choice([512, 4096, 1 * MiB, 2 * MiB, 6 * MiB, 20 * MiB])
            addr = next_addr
            next_addr += size
            live.append((addr, size))
            history.append(entry("alloc", addr, size, t))
            allocs += 1
        if i == entries // 2:
            history.append(entry("oom", 1 << 30, 40 * MiB, t, key="device_free"))  # no "addr"
            history.append(entry("snapshot", 0, sum(s for _, s in live), t))
    blocks = []
    for addr, size in live:
        b = {"size": size, "requested_size": size, "state": "active_allocated"}
        if major_minor >= (2, 1):
            b["address"] = addr
            b["frames"] = make_stack(rng, frames)
        else:
            b["history"] = [{"addr": addr, "real_size": size, "frames": make_stack(rng, frames)}]
        blocks.append(b)
    used = next_addr - base
    blocks.append({"size": total - used, "requested_size": 0, "state": "inactive",
                   **({"address": next_addr, "frames": []} if major_minor >= (2, 1) else {})})
    segment = {"device": 0, "address": base, "total_size": total,
               "allocated_size": sum(s for _, s in live), "active_size": sum(s for _, s in live),
               "requested_size": sum(s for _, s in live), "stream": 0, "segment_type": "large",
               "blocks": blocks}
    if major_minor >= (2, 1):
        segment.update({"segment_pool_id": (0, 0), "is_expandable": False, "frames": []})
    snapshot = {"segments": [segment], "device_traces": [history]}
    if major_minor >= (2, 3):
        snapshot["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                          "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                          "roundup_power2_divisions": {"1": 0, "2": 0}}
    if major_minor >= (2, 5):
        snapshot["external_annotations"] = [{"name": "step", "stage": "START", "device": 0, "time_us": t0}]
    return snapshot, allocs, frees


def write_hostile(out: str) -> None:
    big = "x" * MiB
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1, "frames": [big] * 20000}
    with open(os.path.join(out, "string_bomb.pickle"), "wb") as f:
        pickle.dump({"segments": [], "device_traces": [[entry]]}, f, protocol=4)
    one = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1}
    shared = [one] * 200000
    with open(os.path.join(out, "shared_entries.pickle"), "wb") as f:
        pickle.dump({"segments": [], "device_traces": [shared] * 100}, f, protocol=4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--entries", type=int, default=3000)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--hostile", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for layout in args.layouts.split(","):
        snapshot, allocs, frees = build(layout, args.entries)
        path = os.path.join(args.out, layout + ".pickle")
        with open(path, "wb") as f:
            pickle.dump(snapshot, f, protocol=2 if layout == "torch-cpp" else 4)
        print(layout, os.path.getsize(path), len(snapshot["device_traces"][0]), allocs, frees)
    if args.hostile:
        write_hostile(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
