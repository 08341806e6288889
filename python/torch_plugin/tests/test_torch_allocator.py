"""bucketalloc inside the real torch (the PyPI CUDA wheel), on the simulated device, without a driver:
the pluggable path (enable(native=False), the fallback when the native allocator cannot be built;
tests/test_native_allocator.py has the native path).

torch's own CUDAPluggableAllocator object is driven from C++ (tests/torch_probe.cpp, built with
torch.utils.cpp_extension) the way torch's CUDA code drives it: allocations through
CUDAPluggableAllocator::malloc, frees through raw_delete, and CUDAGraph's pool hooks
(beginAllocateToPool, endAllocateToPool, releasePool). torch.cuda.graph itself and tensors on
"cuda" need a driver: scripts/gpu_torch_check.py runs those on a GPU.
"""

from __future__ import annotations

import ctypes
import importlib.util

import pytest

from helpers import run_python

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("accelerate") is None:
    pytest.fail(
        "torch and accelerate are not installed in this environment: scripts/test_python.sh installs them "
        "(the PyPI CUDA wheel, cached under ~/.cache/bucketalloc/wheels)",
        pytrace=False,
    )


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


# Builds (once; cached under TORCH_EXTENSIONS_DIR) and imports the probe in a child process.
PROBE = """
import os, pathlib, torch.utils.cpp_extension as ext
import helpers
probe = ext.load(name="bucketalloc_torch_probe", sources=[str(helpers.TESTS_DIR / "torch_probe.cpp")],
                 extra_include_paths=[os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")],
                 extra_ldflags=["-ltorch_cuda", "-lc10_cuda"], verbose=False)
"""

SIM = "backend:sim,capacity:256MiB,sim_total_memory:1GiB"


@pytest.mark.skipif(_driver_present(), reason="this machine has an NVIDIA driver: the no-driver error cannot be seen")
def test_enable_without_a_driver_says_so_at_once():
    run_python(
        """
        import bucketalloc_torch as ba
        try:
            ba.enable()
        except ba.BucketallocError as e:
            assert "no CUDA driver" in str(e) and "libcuda.so.1" in str(e), e
            assert "insufficient" not in str(e), e
        else:
            raise AssertionError("enable() succeeded without a driver")
        """
    )


def test_oom_is_torch_out_of_memory_error_with_torchs_message_and_accelerate_sees_it():
    run_python(
        PROBE
        + """
import torch, accelerate.utils.memory as acc_memory
import bucketalloc_torch as ba
ba.enable(native=False)
stream = 0x1000
p = probe.malloc(64 << 20, 0, stream)
assert p != 0
try:
    probe.malloc(600 << 20, 0, stream)
except torch.cuda.OutOfMemoryError as e:
    text = str(e)
    assert text.startswith("CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of 1024.00 MiB"), text
    assert "256.00 MiB allowed;" in text, text
    assert "bucketalloc: out of memory on device 0: capacity" in text, text
    assert acc_memory.should_reduce_batch_size(e), "accelerate does not see an OOM"
else:
    raise AssertionError("600 MiB under a 256 MiB cap were allocated")
stats = ba.memory_stats()
assert stats["num_ooms"] == 1 and stats["num_oom_rejections"] >= 1, stats
probe.free(p)
ba.check_invariants()
""",
        conf=SIM,
    )


def test_graphs_sharing_a_pool_through_torchs_allocator_object_in_both_reset_orders():
    run_python(
        PROBE
        + """
import bucketalloc_torch as ba
ba.enable(native=False)
s = 0x1000
sizes = [4096, 300000, 3 << 20, 5 << 20]
def capture(pool):
    probe.begin_allocate_to_pool(0, pool[0], pool[1], s)   # CUDAGraph::capture_begin
    blocks = [probe.malloc(n, 0, s) for n in sizes]
    out = blocks.pop(2)
    for b in blocks:
        probe.free(b)                                        # intermediates, freed inside the capture
    probe.end_allocate_to_pool(0, pool[0], pool[1])          # capture_end
    return out, set(blocks) | {out}
pool = (1, 0)                                                # graph_pool_handle()
for first in (0, 1):
    out1, b1 = capture(pool)
    one = ba.memory_reserved()
    out2, b2 = capture(pool)
    assert ba.memory_reserved() == one, "the second graph reused the first one's blocks"
    outs = [out1, out2]
    probe.release_pool(0, pool[0], pool[1])                  # one graph reset, the other replays
    ba.empty_cache()
    eager = [probe.malloc(n, 0, s) for n in sizes]
    assert not set(eager) & (b1 | b2), "a block of a pool still in use served an eager tensor"
    for e in eager:
        probe.free(e)
    probe.free(outs[first]); probe.free(outs[1 - first])
    probe.release_pool(0, pool[0], pool[1])
    ba.empty_cache()
    assert ba.memory_reserved() == 0, ba.memory_stats()
    ba.check_invariants()
""",
        conf=SIM,
    )


def test_n_captures_sharing_a_pool_cost_about_one_capture():
    run_python(
        PROBE
        + """
import bucketalloc_torch as ba
ba.enable(native=False)
s, pool, n = 0x1000, (2, 0), 16
held = []
for g in range(n):
    probe.begin_allocate_to_pool(0, pool[0], pool[1], s)
    blocks = [probe.malloc(size, 0, s) for size in (8 << 20, 1 << 20, 12 << 20, 65536)]
    for b in blocks:
        probe.free(b)
    probe.end_allocate_to_pool(0, pool[0], pool[1])
    held.append(ba.memory_reserved())
print(f"reserved after 1 capture: {held[0]}; after {n}: {held[-1]}")
assert held[-1] == held[0], held
# torch's per-pool key (memory_stats flattens the pool id (2, 0) as "2_0"): all of it is the pool's.
stats = ba.memory_stats()
assert stats["reserved_bytes_by_private_pools.2_0.all.current"] == held[-1], stats
assert stats["reserved_bytes_by_private_pools.2_0.large_pool.current"] == stats["reserved_bytes.large_pool.current"]
for g in range(n):
    probe.release_pool(0, pool[0], pool[1])
ba.empty_cache()
assert ba.memory_reserved() == 0
assert not any(k.startswith("reserved_bytes_by_private_pools") for k in ba.memory_stats()), "a forgotten pool"
""",
        conf=SIM,
    )


def test_a_failed_capture_then_normal_allocation():
    run_python(
        PROBE
        + """
import bucketalloc_torch as ba
ba.enable(native=False)
s = 0x1000
ba._lib.lib().bucketalloc_sim_set_capturing(0, s, 1)
probe.begin_allocate_to_pool(0, 3, 0, s)
p = probe.malloc(3 << 20, 0, s)
ba._lib.lib().bucketalloc_sim_set_capturing(0, s, 0)        # cudaStreamEndCapture threw: no end hook
probe.release_pool(0, 3, 0)                                  # an older torch's reset(): release only
ba.empty_cache()                                             # not refused: no capture runs
q = probe.malloc(3 << 20, 0, s)
assert q != p, "the abandoned graph's live block was handed out again"
probe.free(p); probe.free(q)
ba.empty_cache()
assert ba.memory_reserved() == 0
ba.check_invariants()
""",
        conf=SIM,
    )


def test_mempool_is_refused_by_torchs_pluggable_path():
    run_python(
        PROBE
        + """
import bucketalloc_torch as ba
ba.enable(native=False)
try:
    probe.create_or_incref_pool(0, 0, 1)                     # what torch.cuda.MemPool() calls first
except RuntimeError as e:
    assert "does not yet support createOrIncrefPool" in str(e), e
else:
    raise AssertionError("torch's pluggable allocator accepted createOrIncrefPool")
""",
        conf=SIM,
    )


def test_memory_summary_is_torchs_own_rendering_then_bucketallocs_rows():
    run_python(
        PROBE
        + """
import torch.cuda.memory as torch_memory
import bucketalloc_torch as ba
ba.enable(native=False)
s = 0x1000
# Sizes that make torch's formatter scale (KiB, MiB, GiB) and counts in the thousands.
blocks = [probe.malloc(n, 0, s) for n in [700] * 2000 + [3 << 20, 900 << 20, 5 << 20]]
probe.free(blocks[-1])
ours_stats = ba.memory_stats(0)
torch_memory.memory_stats = lambda device=None: ours_stats   # torch's own renderer on our stats
for abbreviated in (False, True):
    torchs = torch_memory.memory_summary(0, abbreviated=abbreviated)
    ours = ba.memory_summary(0, abbreviated=abbreviated)
    assert ours.startswith(torchs), (abbreviated, ours[:2000], torchs)
    rest = ours[len(torchs):]
    assert "bucketalloc memory summary, device 0" in rest and "| cached_bytes" in rest, rest
for b in blocks[:-1]:
    probe.free(b)
""",
        conf="backend:sim,capacity:2GiB,sim_total_memory:4GiB",
    )


def test_torchs_memory_viz_reads_a_snapshot_with_stacks_and_the_no_stack_frame(tmp_path):
    out = tmp_path / "snapshot.pickle"
    run_python(
        PROBE
        + f"""
import pickle
import torch.cuda._memory_viz as viz
import bucketalloc_torch as ba
ba.enable(native=False, patch_torch=True)
import torch
s = 0x1000
early = probe.malloc(1 << 20, 0, s)  # before recording: no stack
torch.cuda.memory._record_memory_history("all", max_entries=1000)
kept = [probe.malloc(n, 0, s) for n in (4096, 3 << 20, 30 << 20)]
probe.free(probe.malloc(5 << 20, 0, s))
torch.cuda.memory._dump_snapshot({str(out)!r})
with open({str(out)!r}, "rb") as f:
    snap = pickle.load(f)
marker = "<bucketalloc recorded no stack for this allocation>"
blocks = dict((b["address"], b) for seg in snap["segments"] for b in seg["blocks"])
assert blocks[early]["frames"][0]["name"] == marker, blocks[early]
assert marker in viz._frame_fmt(blocks[early]["frames"][0])
for p in kept:  # recorded: their Python stack (this script's module level)
    outer = blocks[p]["frames"][-1]
    assert (outer["filename"], outer["name"]) == ("<string>", "<module>") and outer["line"] > 0, blocks[p]
    assert "<string>" in viz._frame_fmt(blocks[p]["frames"][-1])
text = viz.segsum(snap)                                   # torch's own readers
assert "segment" in text.lower(), text
trace = viz.trace(snap)
assert "cudaMalloc(" in trace and "del " in trace and "free completed" in trace, trace
for plot in (viz.trace_plot, viz.segment_plot):
    html = plot(snap)
    assert "<html" in html.lower() and len(html) > 1000
for p in kept + [early]:
    probe.free(p)
""",
        conf=SIM,
    )


def test_accelerate_shrinks_the_batch_until_it_fits_under_the_cap():
    run_python(
        PROBE
        + """
from accelerate.utils import find_executable_batch_size
import bucketalloc_torch as ba
ba.enable(native=False)
tried = []

@find_executable_batch_size(starting_batch_size=64)
def step(batch_size):
    tried.append(batch_size)
    p = probe.malloc(batch_size * (16 << 20), 0, 0x1000)   # 16 MiB per sample under a 256 MiB cap
    probe.free(p)
    return batch_size

found = step()
# accelerate shrinks the batch after each torch.cuda.OutOfMemoryError (by 0.9 in this version)
# until one fits: the one before it did not.
assert tried[0] == 64 and tried == sorted(tried, reverse=True) and found == tried[-1], tried
assert found * 16 <= 256 < tried[-2] * 16, tried
assert ba.memory_stats()["num_ooms"] == len(tried) - 1
""",
        conf=SIM,
    )


def test_record_memory_history_with_python_stacks_gives_blocks_their_stacks():
    run_python(
        PROBE
        + """
import torch
import bucketalloc_torch as ba
ba.enable(native=False, patch_torch=True)
s = 0x1000

def allocate_in_a_named_function():
    return probe.malloc(3 << 20, 0, s)

before = probe.malloc(4096, 0, s)                      # before recording: no stack
torch.cuda.memory._record_memory_history("all", stacks="python", max_entries=1000)
p = allocate_in_a_named_function()
snap = torch.cuda.memory._snapshot()
blocks = {b["address"]: b for seg in snap["segments"] for b in seg["blocks"]}
frames = blocks[p]["frames"]
assert frames[0]["name"] == "allocate_in_a_named_function", frames
assert frames[0]["filename"] == "<string>" and frames[0]["line"] > 0, frames
assert blocks[before]["frames"][0]["filename"] == "<bucketalloc>", blocks[before]["frames"]
alloc = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["addr"] == p]
assert alloc and alloc[-1]["frames"] == frames
torch.cuda.memory._record_memory_history(None)
q = probe.malloc(3 << 20, 0, s)                        # recording off: no new stack
probe.free(p); probe.free(q); probe.free(before)
""",
        conf=SIM,
    )
