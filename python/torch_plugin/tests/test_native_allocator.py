"""The native path: bucketalloc as the c10 CUDAAllocator torch holds (csrc/native_allocator.cc),
inside the real torch (the PyPI CUDA wheel), on the simulated device, without a driver.

Each scenario runs in a fresh process. torch's C++ entry points are driven through tests/native_probe.cpp
(built with torch.utils.cpp_extension) and through torch's own Python bindings (torch._C._cuda_*).
torch's Python memory functions stop at `torch.cuda.is_initialized()` without a driver, so the
scenarios that call them declare CUDA initialized (`_torch_initialized()`): torch's own code then runs
unpatched down to the allocator. Tensors on "cuda" need a driver: scripts/gpu_torch_check.py runs
those on a GPU.
"""

from __future__ import annotations

import importlib.util

import pytest

from helpers import child_env, expect_success, run, run_python

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("accelerate") is None:
    pytest.fail(
        "torch and accelerate are not installed in this environment: scripts/test_python.sh installs them "
        "(the PyPI CUDA wheel, cached under ~/.cache/bucketalloc/wheels)",
        pytrace=False,
    )

# Enables bucketalloc (the native path), then builds (once; cached under TORCH_EXTENSIONS_DIR) and
# imports the probe.
PRELUDE = """
import os, torch.utils.cpp_extension as ext
import helpers
import bucketalloc_torch as ba
ba.enable()
assert ba.allocator_path() == "native", ba.allocator_path()
import torch
probe = ext.load(name="bucketalloc_native_probe", sources=[str(helpers.TESTS_DIR / "native_probe.cpp")],
                 extra_include_paths=[os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")],
                 extra_ldflags=["-ltorch_cuda", "-lc10_cuda"], verbose=False)
S = 0x1000  # a stream of the simulated device
MiB = 1 << 20

def refused(call, words, what):
    # `call()` raises a RuntimeError whose message names every one of `words`.
    try:
        call()
    except RuntimeError as e:
        assert all(w in str(e) for w in words), e
    else:
        raise AssertionError(what)

def _torch_initialized():
    # Without a driver torch's Python memory functions return at `is_initialized()`; past it they
    # call the allocator torch holds, which is all these scenarios look at.
    torch.cuda._initialized = True  # what torch.cuda.is_initialized() reads
"""

SIM = "backend:sim,capacity:256MiB,sim_total_memory:1GiB"


def test_torch_holds_bucketalloc_and_allocates_through_it():
    run_python(
        PRELUDE
        + """
assert probe.name() == "bucketalloc"
assert torch._C._cuda_getAllocatorBackend() == "bucketalloc"
assert torch.cuda.memory._get_current_allocator() is not None
p = torch._C._cuda_cudaCachingAllocator_raw_alloc(3 * MiB, S)     # torch.cuda.caching_allocator_alloc
assert ba.memory_allocated() == 3 * MiB
q = probe.allocate(5000)                                           # Allocator::allocate: every tensor's path
assert ba.memory_stats()["allocation.all.current"] == 2
probe.release(q)                                                   # the DataPtr's deleter frees it
torch._C._cuda_cudaCachingAllocator_raw_delete(p)
assert ba.memory_allocated() == 0
try:
    torch._C._cuda_cudaCachingAllocator_raw_delete(p)              # a double free: torch's error, state intact
except RuntimeError as e:
    assert "was not allocated by bucketalloc" in str(e) or "double free" in str(e), e
else:
    raise AssertionError("a double free was accepted")
ba.check_invariants(0)
""",
        conf=SIM,
    )


def test_torchs_own_memory_functions_read_bucketalloc_unpatched(tmp_path):
    out = tmp_path / "snapshot.pickle"
    run_python(
        PRELUDE
        + f"""
import pickle
import torch.cuda._memory_viz as viz
_torch_initialized()
blocks = [probe.malloc(n, S) for n in [700] * 200 + [3 * MiB, 90 * MiB, 5 * MiB]]
probe.free(blocks.pop())
ours = ba.memory_stats(0)
theirs = torch.cuda.memory_stats(0)                                # torch's own function, unpatched
assert theirs, "torch's memory_stats is empty"
for key, value in theirs.items():
    assert ours[key] == value, (key, ours[key], value)
assert torch.cuda.memory_allocated(0) == ba.memory_allocated(0) > 0
assert torch.cuda.memory_reserved(0) == ba.memory_reserved(0)
assert torch.cuda.max_memory_allocated(0) == ba.max_memory_allocated(0)
# memory_summary: torch's rendering of the same stats is the head of bucketalloc's.
for abbreviated in (False, True):
    assert ba.memory_summary(0, abbreviated=abbreviated).startswith(torch.cuda.memory_summary(0, abbreviated=abbreviated))
torch.cuda.reset_peak_memory_stats(0)
assert torch.cuda.max_memory_allocated(0) == torch.cuda.memory_allocated(0)
torch.cuda.reset_accumulated_memory_stats(0)
assert torch.cuda.memory_stats(0)["allocation.all.allocated"] == 0
assert torch.cuda.memory_stats(0)["allocation.all.current"] == len(blocks)
ba.check_invariants(0)                                             # the reset keeps the ledger consistent
segments = torch.cuda.memory_snapshot()
assert {{b["address"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated"}} == set(blocks)
torch.cuda.memory._dump_snapshot({str(out)!r})
with open({str(out)!r}, "rb") as f:
    snap = pickle.load(f)
assert "segment" in viz.segsum(snap).lower()
assert torch.cuda.get_per_process_memory_fraction(0) == 1.0
torch.cuda.set_per_process_memory_fraction(0.5, 0)
assert torch.cuda.get_per_process_memory_fraction(0) == 0.5
assert ba.memory_stats(0)["capacity_bytes"] == 256 * MiB           # min(capacity, 0.5 x 1 GiB)
torch.cuda.set_per_process_memory_fraction(0.125, 0)
assert ba.memory_stats(0)["capacity_bytes"] == 128 * MiB
try:
    torch.cuda.set_per_process_memory_fraction(0.0, 0)            # no cap of 0 bytes: refused, said so
except RuntimeError as e:
    assert "was not applied" in str(e) and "accepted" in str(e), e
else:
    raise AssertionError("a fraction of 0 was taken silently")
assert torch.cuda.get_per_process_memory_fraction(0) == 0.125
for b in blocks:
    probe.free(b)
torch.cuda.empty_cache()
assert torch.cuda.memory_reserved(0) == 0
""",
        conf=SIM,
    )


def test_cache_info_answers_cudnns_workspace_question():
    run_python(
        PRELUDE
        + """
a = probe.malloc(30 * MiB, S)
b = probe.malloc(50 * MiB, S)
probe.free(a)
assert probe.cache_info(0, 1) == 30 * MiB                          # the largest cached block
assert probe.cache_info(0, 0) == 256 * MiB - 80 * MiB              # cuDNN's call (0): also the headroom
probe.free(b)
""",
        conf=SIM,
    )


def test_history_with_torchs_context_recorder_gives_blocks_and_trace_entries_their_stacks(tmp_path):
    out = tmp_path / "snapshot.pickle"
    run_python(
        PRELUDE
        + f"""
import pickle
import torch.cuda._memory_viz as viz
before = probe.malloc(4096, S)                                     # before recording: no stack
probe.record_history(True, "all", 1000)                            # what _record_memory_history installs
assert probe.is_history_enabled()

def allocate_in_a_named_function():
    return probe.malloc(3 * MiB, S)

p = allocate_in_a_named_function()
q = probe.malloc(5 * MiB, S)
probe.free(q)
snap = torch.cuda.memory._snapshot()
blocks = {{b["address"]: b for s in snap["segments"] for b in s["blocks"]}}
names = [f["name"] for f in blocks[p]["frames"]]
assert "allocate_in_a_named_function" in names and "<module>" in names, names
assert blocks[before]["frames"] == [], blocks[before]
trace = snap["device_traces"][0]
actions = [e["action"] for e in trace]
assert "alloc" in actions and "free_requested" in actions and "free_completed" in actions, actions
alloc = [e for e in trace if e["action"] == "alloc" and e["addr"] == p][-1]
assert "allocate_in_a_named_function" in [f["name"] for f in alloc["frames"]]
freed = [e for e in trace if e["action"] == "free_requested" and e["addr"] == q][-1]
assert freed["frames"], freed                                      # "all": the free's own stack
tb = torch._C._cuda_allocationTraceback(p)                         # getContextForPointer
assert tb is not None
torch.cuda.memory._dump_snapshot({str(out)!r})
with open({str(out)!r}, "rb") as f:
    dumped = pickle.load(f)
text = viz.trace(dumped)
assert "cudaMalloc(" in text and "del " in text, text
for plot in (viz.trace_plot, viz.segment_plot):
    assert "<html" in plot(dumped).lower()
# The harness reads torch's own pickle, stacks and all (issue 42: read in place, every layout).
import subprocess
from bucketalloc_torch._commands import bench_path
doctor = subprocess.run([bench_path(), "doctor", {str(out)!r}, "--capacity", "1GiB"], capture_output=True, text=True)
assert doctor.returncode == 0 and "(snapshot, " in doctor.stdout, doctor.stdout + doctor.stderr
assert "time_us" not in doctor.stderr, doctor.stderr                # torch 2.2 on records it
# "state": stacks of live blocks only, none in the trace
probe.record_history(True, "state", 1000)
r = probe.malloc(2 * MiB, S)
snap = torch.cuda.memory._snapshot()
last = snap["device_traces"][0][-1]
assert last["action"] == "alloc" and last["addr"] == r and "frames" not in last, last
blocks = {{b["address"]: b for s in snap["segments"] for b in s["blocks"]}}
assert blocks[r]["frames"], blocks[r]
# Trace entries name their pool, as torch's; record_function annotations are kept.
pool = (0, 21)
probe.create_or_incref_pool(0, *pool)
torch._C._cuda_beginAllocateToPool(0, pool)
x = probe.malloc(2 * MiB, S)
torch._C._cuda_endAllocateToPool(0, pool)
probe.record_annotation("decode_step", "START")
snap = torch.cuda.memory._snapshot()
trace = snap["device_traces"][0]
alloc = [e for e in trace if e["action"] == "alloc" and e["addr"] == x][-1]
assert tuple(alloc["pool_id"]) == pool, alloc
grown = [e for e in trace if e["action"] == "segment_alloc"][-1]
assert tuple(grown["pool_id"]) == pool, grown
assert tuple([e for e in trace if e["addr"] == r][-1]["pool_id"]) == (0, 0)
annotation = snap["external_annotations"][-1]
assert annotation["name"] == "decode_step" and annotation["stage"] == "START", annotation
assert annotation["device"] == 0 and annotation["time_us"] > 0, annotation
probe.free(x)
torch._C._cuda_releasePool(0, pool)
torch._C._cuda_releasePool(0, pool)
probe.record_history(False, "never", 1)
assert not probe.is_history_enabled()
assert torch.cuda.memory._snapshot()["device_traces"][0] == []
for x in (p, r, before):
    probe.free(x)
""",
        conf=SIM,
    )


def test_oom_is_torchs_error_and_reaches_torchs_observers_and_accelerate():
    run_python(
        PRELUDE
        + """
import accelerate.utils.memory as acc_memory
seen = []
probe.attach_oom_observer(lambda *args: seen.append(args))          # torch's attachOutOfMemoryObserver
probe.record_history(True, "alloc", 1000)
p = probe.malloc(64 * MiB, S)
try:
    probe.malloc(600 * MiB, S)
except torch.cuda.OutOfMemoryError as e:
    text = str(e)
    assert text.startswith("CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of 1024.00 MiB"), text
    assert "256.00 MiB allowed;" in text, text
    assert "bucketalloc: out of memory on device 0: capacity" in text, text
    assert acc_memory.should_reduce_batch_size(e), "accelerate does not see an OOM"
else:
    raise AssertionError("600 MiB under a 256 MiB cap were allocated")
assert seen == [(0, 600 * MiB, 256 * MiB, seen[0][3])], seen            # device, needed, allowed, free
stats = torch._C._cuda_memoryStats(0)
assert stats["num_ooms"] == 1, stats
oom = [e for e in torch.cuda.memory._snapshot()["device_traces"][0] if e["action"] == "oom"]
assert len(oom) == 1 and oom[0]["size"] == 600 * MiB and oom[0]["device_free"] > 0, oom
probe.free(p)
ba.check_invariants(0)
""",
        conf=SIM,
    )


def test_graphs_sharing_a_pool_then_an_eager_request_never_gets_a_pool_block():
    run_python(
        PRELUDE
        + """
sizes = [4096, 300000, 3 * MiB, 5 * MiB]
pool = (0, 1)                                                      # graph_pool_handle()
def capture():
    torch._C._cuda_beginAllocateToPool(0, pool)                    # CUDAGraph::capture_begin
    blocks = [probe.malloc(n, S) for n in sizes]
    out = blocks.pop(2)
    for b in blocks:
        probe.free(b)                                              # intermediates freed inside the capture
    torch._C._cuda_endAllocateToPool(0, pool)                      # capture_end
    return out, set(blocks) | {out}
out1, b1 = capture()
one = ba.memory_reserved()
out2, b2 = capture()
assert ba.memory_reserved() == one, "the second graph reused the first one's blocks"
assert probe.pool_use_count(0, *pool) == 2
assert torch._C._cuda_checkPoolLiveAllocations(0, pool, {out1, out2})
assert not torch._C._cuda_checkPoolLiveAllocations(0, pool, {out1})
assert not torch._C._cuda_checkPoolLiveAllocations(0, pool, {out1, out2, 12345})
torch._C._cuda_releasePool(0, pool)                                # one graph reset, the other replays
probe.empty_cache(0, 0)
eager = [probe.malloc(n, S) for n in sizes]
assert not set(eager) & (b1 | b2), "a block of a pool still in use served an eager request"
for e in eager + [out1, out2]:
    probe.free(e)
torch._C._cuda_releasePool(0, pool)
assert probe.pool_use_count(0, *pool) == 0
torch._C._cuda_emptyCache()
assert ba.memory_reserved() == 0, ba.memory_stats()
ba.check_invariants(0)
""",
        conf=SIM,
    )


def test_checkpoint_state_round_trip_as_cudagraph_trees_uses_it():
    run_python(
        PRELUDE
        + """
pool = (0, 4)
torch._C._cuda_beginAllocateToPool(0, pool)
a = probe.malloc(3 * MiB, S)                                       # node 1's outputs (the graph owns them)
b = probe.malloc(1 * MiB, S)
torch._C._cuda_endAllocateToPool(0, pool)
state = torch._C._cuda_getCheckpointState(0, pool)                # after recording node 1
torch._C._cuda_beginAllocateToPool(0, pool)
c_storage, c = probe.make_storage(2 * MiB)                         # a tensor of another path, now stale
torch._C._cuda_endAllocateToPool(0, pool)
assert torch._C._cuda_checkPoolLiveAllocations(0, pool, {a, b, c})
# Back to node 1's state, as cudagraph trees applies it: the stale tensor's storage loses its deleter,
# the live outputs' storages (made without one) get the checkpoint's blocks.
outs = [probe.make_unowned_storage(a, 3 * MiB), probe.make_unowned_storage(b, 1 * MiB)]
torch._C._cuda_setCheckpointPoolState(0, state, [c_storage], outs)
assert torch._C._cuda_checkPoolLiveAllocations(0, pool, {a, b}), "the checkpoint's blocks are not the pool's live ones"
assert all(probe.storage_owns(s) for s in outs) and not probe.storage_owns(c_storage)
probe.drop_storage(c_storage)                                      # its block is already free: nothing happens
probe.drop_storage(outs[1])                                        # the storage now frees b
assert torch._C._cuda_checkPoolLiveAllocations(0, pool, {a})
# A checkpoint block freed since is allocated again at its address (bucketalloc_allocate_at, on its
# segment's stream) and handed to the storage made for it; a is live in both and stays.
outs_b = [probe.make_unowned_storage(b, 1 * MiB)]
torch._C._cuda_setCheckpointPoolState(0, state, [], outs_b)
assert torch._C._cuda_checkPoolLiveAllocations(0, pool, {a, b}), "b is not live again at its address"
assert probe.storage_owns(outs_b[0])
ba.check_invariants(0)
probe.drop_storage(outs_b[0])                                      # the storage frees b again
assert torch._C._cuda_checkPoolLiveAllocations(0, pool, {a})
probe.drop_storage(outs[0])
assert torch._C._cuda_checkPoolLiveAllocations(0, pool, set())
torch._C._cuda_releasePool(0, pool)
torch._C._cuda_releasePool(0, pool)
# A block that cannot be placed (the pool is freeable now) is a clear error naming it; nothing stays.
try:
    torch._C._cuda_setCheckpointPoolState(0, state, [], [])
except RuntimeError as e:
    assert "cannot allocate the checkpoint's block" in str(e) and "freeable" in str(e), e
else:
    raise AssertionError("a checkpoint was restored into a freeable pool")
assert torch._C._cuda_checkPoolLiveAllocations(0, pool, set())
ba.check_invariants(0)
# allocateWithAddress has no Python binding in torch: the C ABI tests cover it
# (tests/c_abi/structured_test.cc, bucketalloc_allocate_at with block size 0 in the device's pools).
""",
        conf=SIM,
    )


def test_allocate_with_address_places_a_block_in_free_cached_memory():
    run_python(
        PRELUDE
        + """
a = probe.malloc(6 * MiB, 0)                                       # the current stream (0 on the simulated device)
b = probe.malloc(2 * MiB, 0)                                       # keeps the segment
probe.free(a)
at = a + 2 * MiB                                                   # inside the free block a left
p = probe.allocate_with_address(1 * MiB, at)
assert p == at
blocks = {x["address"]: x for s in torch.cuda.memory._snapshot()["segments"] for x in s["blocks"]}
assert blocks[at]["state"] == "active_allocated" and blocks[at]["size"] == 1 * MiB, blocks[at]
try:
    probe.allocate_with_address(1 * MiB, b)                        # a live block: refused, nothing changes
except RuntimeError as e:
    assert "0x" in str(e), e
else:
    raise AssertionError("a live block's address was handed out again")
probe.release(p)                                                   # the DataPtr's deleter frees it
probe.free(b)
ba.check_invariants(0)
""",
        conf=SIM,
    )


def test_mempool_with_its_own_allocator_is_cached_and_counted():
    # torch.cuda.MemPool(allocator) (vLLM's sleep mode, NCCL's mem pools): bucketalloc's private pool
    # gets its segments from that allocator and caches, splits, counts and shows them as torch does.
    run_python(
        PRELUDE
        + """
pool = (0, 12)
probe.create_pool_with_host_allocator(0, *pool)                  # MemPool(allocator)
assert probe.pool_use_count(0, *pool) == 1
torch._C._cuda_beginAllocateToPool(0, pool)                      # use_mem_pool(pool)
p = probe.malloc(4 * MiB, S)
q = probe.malloc(4 * MiB, S)                                     # the same segment, split
torch._C._cuda_endAllocateToPool(0, pool)
torch._C._cuda_releasePool(0, pool)
allocs, frees, refs = probe.host_segments()
assert (allocs, frees, refs) == (1, 0, 1), (allocs, frees, refs)
segments = [s for s in torch.cuda.memory._snapshot()["segments"] if tuple(s["segment_pool_id"]) == pool]
assert len(segments) == 1 and len(segments[0]["blocks"]) >= 2, segments
reserved = segments[0]["total_size"]
assert ba.memory_reserved() == reserved
assert ba.memory_stats()[f"reserved_bytes_by_private_pools.0_12.all.current"] == reserved
probe.free(p)
# A tensor freed inside the allocator's raw_alloc (its Python's garbage collection) is freed once
# bucketalloc returns, instead of waiting on the device's lock its own thread holds.
x = probe.malloc(1 * MiB, S)
allocated = ba.memory_allocated()
probe.free_in_next_host_alloc(x)
torch._C._cuda_beginAllocateToPool(0, pool)
y = probe.malloc(30 * MiB, S)                                    # grows: the allocator is asked
torch._C._cuda_endAllocateToPool(0, pool)
torch._C._cuda_releasePool(0, pool)
assert ba.memory_allocated() == allocated - 1 * MiB + 30 * MiB, (ba.memory_allocated(), allocated)
probe.free(y)
assert probe.host_segments()[0] == 2, probe.host_segments()
torch._C._cuda_beginAllocateToPool(0, pool)
assert probe.malloc(4 * MiB, S) == p                             # cached: the allocator is not asked
torch._C._cuda_endAllocateToPool(0, pool)
torch._C._cuda_releasePool(0, pool)
assert probe.host_segments()[0] == 2, probe.host_segments()
probe.free(p)
probe.free(q)
probe.empty_cache(*pool)                                         # in use: kept, as torch keeps it
assert probe.host_segments()[1] == 0, probe.host_segments()
torch._C._cuda_releasePool(0, pool)                              # ~MemPool
probe.empty_cache(*pool)
assert probe.host_segments() == (2, 2, 0), probe.host_segments()  # freed to it; the pool let it go
probe.empty_cache(0, 0)                                          # x's slab, of the device's own pools
assert ba.memory_reserved() == 0, ba.memory_reserved()
ba.check_invariants(0)
""",
        conf=SIM,
    )


def test_no_split_mempool_hands_out_whole_segments():
    # MemPool(no_split=True) (setNoSplit), as NCCL window registration uses it.
    run_python(
        PRELUDE
        + """
pool = (0, 13)
probe.create_or_incref_pool(0, *pool)
probe.set_no_split(0, *pool)
torch._C._cuda_beginAllocateToPool(0, pool)
a = probe.malloc(512, S)
b = probe.malloc(512, S)
torch._C._cuda_endAllocateToPool(0, pool)
segments = [s for s in torch.cuda.memory._snapshot()["segments"] if tuple(s["segment_pool_id"]) == pool]
assert len(segments) == 2 and all(len(s["blocks"]) == 1 for s in segments), segments
probe.free(a)
probe.free(b)
refused(lambda: probe.set_no_split(0, *pool), ["already holds memory"],  # it holds memory now
        "setNoSplit of a pool holding memory was accepted")
torch._C._cuda_releasePool(0, pool)
torch._C._cuda_releasePool(0, pool)
probe.empty_cache(*pool)
assert ba.memory_reserved() == 0, ba.memory_reserved()
""",
        conf=SIM,
    )


def test_mempool_use_count_and_emptying_one_pool():
    run_python(
        PRELUDE
        + """
pool = (0, 5)
probe.create_or_incref_pool(0, *pool)                              # MemPool(): use count 1
assert probe.pool_use_count(0, *pool) == 1
torch._C._cuda_beginAllocateToPool(0, pool)                        # use_mem_pool: + 1
p = probe.malloc(8 * MiB, S)
torch._C._cuda_endAllocateToPool(0, pool)
torch._C._cuda_releasePool(0, pool)                                # leaving use_mem_pool: - 1
assert probe.pool_use_count(0, *pool) == 1
probe.free(p)
held = ba.memory_reserved()
assert held > 0
probe.empty_cache(*pool)                                           # in use: torch keeps it too
assert ba.memory_reserved() == held
assert ba.memory_stats()["reserved_bytes_by_private_pools.0_5.all.current"] == held
torch._C._cuda_releasePool(0, pool)                                # ~MemPool: releasePool, emptyCache(id)
probe.empty_cache(*pool)
assert ba.memory_reserved() == 0, ba.memory_reserved()
# A use_on_oom pool lends its free blocks to the device's own requests before an OOM.
lender = (0, 6)
probe.create_or_incref_pool(0, *lender)
probe.set_use_on_oom(0, *lender, True)
torch._C._cuda_beginAllocateToPool(0, lender)
x = probe.malloc(200 * MiB, S)
torch._C._cuda_endAllocateToPool(0, lender)
probe.free(x)                                                      # 200 MiB cached in the lender
y = probe.malloc(150 * MiB, S)                                     # the default pool cannot grow under the cap
segments = torch.cuda.memory._snapshot()["segments"]
lent = [s for s in segments if any(b["address"] == y and b["state"] == "active_allocated" for b in s["blocks"])]
assert lent and lent[0]["segment_pool_id"] == lender, lent
assert torch._C._cuda_memoryStats(0)["num_ooms"] == 0              # lent, not failed
probe.free(y)
probe.set_use_on_oom(0, *lender, False)
try:
    probe.malloc(150 * MiB, S)
except torch.cuda.OutOfMemoryError:
    pass
else:
    raise AssertionError("a pool no longer use_on_oom still lent its block")
torch._C._cuda_releasePool(0, lender)
ba.check_invariants(0)
""",
        conf=SIM,
    )


def test_trace_trackers_and_ipc_on_the_simulated_device():
    run_python(
        PRELUDE
        + """
probe.attach_trace_tracker()
p = probe.malloc(3 * MiB, S)
probe.free(p)
assert probe.trace_entries() >= 3, probe.trace_entries()           # segment_alloc, alloc, free_*
p = probe.malloc(3 * MiB, S)
base, size = probe.base_allocation(p)
assert base <= p < base + size
refused(lambda: probe.share_ipc_handle(p), ["simulated device", "GPU"], "a simulated segment was exported")
probe.free(p)
# Handles another process sends are checked before anything is opened, each error naming what
# is accepted: torch's expandable-segment layout ('e': a header, one descriptor per page).
import struct
def opened(handle, words):
    refused(lambda: probe.get_ipc_dev_ptr(handle), words, f"{handle!r} was opened")
header = lambda pid, size, n, kind: struct.pack("=i4xQQi4x", pid, size, n, kind)
opened(b"\x03z" + bytes(64), ["type 'c'", "'e'"])
opened(b"\x03e" + header(os.getpid(), 2 * MiB, 1, 2) + struct.pack("i", 5), ["Fabric handles (2)"])
opened(b"\x03e" + header(os.getpid(), 2 * MiB, 3, 1) + struct.pack("i", 5), ["for 3 pages"])
opened(b"\x03e" + header(2**22 + 12345, 2 * MiB, 1, 1) + struct.pack("i", 5), ["process"])
opened(b"\x03e" + header(os.getpid(), 2 * MiB, 1, 1) + struct.pack("i", 0), ["does not share virtual memory"])
opened(b"\x03e" + header(os.getpid(), 2 * MiB, 2**62, 1) + struct.pack("i", 0), ["pages"])  # no overflow
# version 2's header has no handle type (POSIX descriptors): read as such
opened(b"\x02e" + struct.pack("=i4xQQ", os.getpid(), 2 * MiB, 1) + struct.pack("i", 0),
       ["does not share virtual memory"])
ba.check_invariants(0)
""",
        conf=SIM,
    )


def test_expandable_segments_on_the_simulated_device_say_why_they_are_not_shared():
    run_python(
        PRELUDE
        + """
p = probe.malloc(6 * MiB, S)
refused(lambda: probe.share_ipc_handle(p), ["does not share virtual memory", "vmm"],
        "a simulated expandable segment was exported")
probe.free(p)
ba.check_invariants(0)
""",
        conf=SIM + ",expandable_segments:True",
    )


def test_without_a_compiler_enable_falls_back_to_the_pluggable_path_and_says_what_is_missing():
    run_python(
        """
import warnings
import bucketalloc_torch as ba
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ba.enable()
assert ba.allocator_path() == "pluggable", ba.allocator_path()
text = " ".join(str(w.message) for w in caught)
assert "CXX='/nonexistent/c++'" in text and "cudagraph trees" in text and "cacheInfo" in text, text
""",
        conf=SIM,
        CXX="/nonexistent/c++",
        BUCKETALLOC_CACHE_DIR="/nonexistent-cache-for-this-test",
    )
    run_python(
        """
import bucketalloc_torch as ba
try:
    ba.enable(native=True)
except ba.BucketallocError as e:
    assert "the native allocator cannot be built" in str(e) and "CXX=" in str(e), e
else:
    raise AssertionError("native=True without a compiler succeeded")
""",
        conf=SIM,
        CXX="/nonexistent/c++",
        BUCKETALLOC_CACHE_DIR="/nonexistent-cache-for-this-test",
    )


def test_accelerate_shrinks_the_batch_on_the_native_path():
    run_python(
        PRELUDE
        + """
from accelerate.utils import find_executable_batch_size
tried = []

@find_executable_batch_size(starting_batch_size=64)
def step(batch_size):
    tried.append(batch_size)
    probe.free(probe.malloc(batch_size * 16 * MiB, S))             # 16 MiB per sample under a 256 MiB cap
    return batch_size

found = step()
assert tried[0] == 64 and found * 16 <= 256 < tried[-2] * 16, tried
assert torch._C._cuda_memoryStats(0)["num_ooms"] == len(tried) - 1
""",
        conf=SIM,
    )


def test_throw_on_cudamalloc_oom_fails_at_once_and_tells_the_rejection_observers():
    run_python(
        PRELUDE
        + """
probe.attach_oom_rejection_observer()
ooms = []
probe.attach_oom_observer(lambda *args: ooms.append(args))         # not told of a rejection, as in torch
cached = probe.malloc(100 * MiB, S)
probe.free(cached)                                                 # 100 MiB cached
try:
    probe.malloc(200 * MiB, 0x2000)                                # the cap refuses the growth
except torch.cuda.OutOfMemoryError:
    pass
else:
    raise AssertionError("the cap did not refuse")
stats = torch._C._cuda_memoryStats(0)
assert probe.rejections() == 1 and stats["num_oom_rejections"] >= 1 and stats["num_alloc_retries"] == 0, stats
assert ba.memory_reserved(0) == 100 * MiB                          # no release, no retry
assert ooms == [], ooms
""",
        conf=SIM + ",throw_on_cudamalloc_oom:True",
    )


def test_set_allocator_settings_applies_the_fraction_and_names_what_it_cannot_change():
    process = expect_success(
        run(
            [
                "-c",
                PRELUDE
                + """
torch.cuda.memory._set_allocator_settings("per_process_memory_fraction:0.125")
assert ba.memory_stats(0)["capacity_bytes"] == 128 * MiB          # applied at once
torch.cuda.memory._set_allocator_settings("max_split_size_mb:64,expandable_segments:False")
""",
            ],
            child_env(SIM),
        )
    )
    assert process.stderr.count("not applied") == 1, process.stderr  # the fraction was applied: nothing said
    # torch's c10 warning (on stderr): the key whose value differs; expandable_segments:False is bucketalloc's too.
    assert "_set_allocator_settings: max_split_size_mb:64 not applied" in process.stderr, process.stderr
    assert "expandable_segments:False not applied" not in process.stderr, process.stderr
