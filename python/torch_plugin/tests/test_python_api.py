"""The Python API without torch: configuration, devices, stats, fragmentation, snapshots, history.

Tests of pure argument handling run in this process (they never load the library); the others run
in a fresh process each (helpers.fresh_process) on the simulated device.
"""

from __future__ import annotations

import collections
import json
import pickle
import sys

import pytest

import bucketalloc_torch as ba
from bucketalloc_torch import _config, _lib
from helpers import KiB, MiB, STREAM_A, STREAM_B, fresh_process, run_python

SIM = "backend:sim,capacity:1GiB"

# torch.cuda.memory_stats() keys (PyTorch's DeviceStats), which memory_stats() must also have.
TORCH_POOL_STATS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
TORCH_SCALARS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
                 "max_split_size")
TORCH_SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                      "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
TORCH_BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TORCH_TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}


def malloc(size: int, device: int = 0, stream: int = 0) -> int:
    return _lib.check_pointer(_lib.lib().bucketalloc_malloc(size, device, stream), "bucketalloc_malloc")


def free(ptr: int, size: int, device: int = 0, stream: int = 0) -> None:
    _lib.lib().bucketalloc_free(ptr, size, device, stream)


# ---- configuration --------------------------------------------------------------------------


def test_options_extend_the_conf_in_its_syntax():
    conf = _config._compose_conf("backend:sim", {"capacity": "4GiB", "debug_check_invariants": True,
                                                 "tiers": ["64MiB", "128MiB"], "tier_min_fill": 0.25})
    assert conf == "backend:sim,capacity:4GiB,debug_check_invariants:True,tiers:[64MiB,128MiB],tier_min_fill:0.25"


def test_options_without_conf_extend_the_environment(monkeypatch):
    monkeypatch.setenv("BUCKETALLOC_CONF", "backend:sim,sim_devices:2")
    conf = _config._compose_conf(None, {"capacity": "4GiB"})  # every key of the environment's, then ours
    assert conf.startswith("backend:sim,") and ",sim_devices:2," in conf and conf.endswith(",capacity:4GiB"), conf
    assert _config._compose_conf(None, {}) is None  # nothing to set: the library reads the environment itself
    assert _config._compose_conf("", {}) == ""  # explicit defaults


@pytest.mark.parametrize("value", ["1GiB,sim_devices:2", "[1GiB],x", "1GiB]"])
def test_an_option_value_cannot_set_another_key(value):
    with pytest.raises(ValueError, match=r"option capacity=.* is not one value; accepted"):
        _config._compose_conf("backend:sim", {"capacity": value})


def test_an_option_value_may_be_one_bracketed_list_or_a_python_list():
    conf = _config._compose_conf("", {"roundup_power2_divisions": "[256:1,>:8]"})
    assert conf == "roundup_power2_divisions:[256:1,>:8]"
    assert _config._compose_conf("", {"tiers": ["64MiB", "128MiB"]}) == "tiers:[64MiB,128MiB]"
    with pytest.raises(ValueError, match="not one value"):
        _config._compose_conf("", {"tiers": ["64MiB,sim_devices:2"]})
    with pytest.raises(TypeError, match="has type dict"):
        _config._compose_conf("", {"capacity": {"a": 1}})


def test_conf_must_be_a_string():
    with pytest.raises(TypeError, match="conf must be a string"):
        _config._compose_conf({"backend": "sim"}, {})


@fresh_process("backend:sim")
def test_configure_before_first_use_applies():
    ba.configure("backend:sim,capacity:64MiB", debug_check_invariants=True, tiers=["64MiB", "128MiB"])
    conf = ba.config()
    for expected in ("backend:sim,", ",capacity:64MiB,", ",debug_check_invariants:true", ",tiers:[64MiB,128MiB],"):
        assert expected in conf, (expected, conf)


@fresh_process("backend:sim")
def test_configure_rejects_a_bad_key_or_value_and_applies_nothing():
    with pytest.raises(ba.BucketallocError, match=r"option 'no_such_key' \(value '1'\) is unknown; accepted keys: "):
        ba.configure("capacity:64MiB,no_such_key:1")
    with pytest.raises(ba.BucketallocError, match=r"option 'capacity': bad value 'lots'; accepted: 0 \(the device's memory\) or a size"):
        ba.configure("capacity:lots")
    assert "capacity:0" in ba.config().split(",")  # created from BUCKETALLOC_CONF, unchanged


@fresh_process("backend:sim,capacity:1GiB")
def test_configure_after_creation_accepts_only_the_same_configuration():
    ba.memory_stats(0)  # creates the allocator
    ba.configure("capacity:1GiB,backend:sim")  # the same options, in any order
    with pytest.raises(ba.BucketallocError, match="the allocator already exists"):
        ba.configure("backend:sim,capacity:2GiB")
    assert "capacity:1GiB" in ba.config().split(",")


# ---- devices ----------------------------------------------------------------------------------


class FakeTorchDevice:
    """Has what a torch.device has for _config._device_index: type and index."""

    def __init__(self, kind: str, index):
        self.type = kind
        self.index = index


@pytest.mark.parametrize(
    "device, index",
    [(None, 0), (0, 0), (3, 3), ("cuda", 0), ("cuda:2", 2), (FakeTorchDevice("cuda", 1), 1),
     (FakeTorchDevice("cuda", None), 0)],
)
def test_device_arguments(device, index):
    assert "torch" not in sys.modules  # None and bare "cuda" then mean device 0
    assert _config._device_index(device) == index


@pytest.mark.parametrize(
    "device, error, message",
    [(-1, ValueError, "device=-1 is out of range"), ("cpu", ValueError, "device='cpu' is not a CUDA device"),
     ("cuda:x", ValueError, "not a CUDA"), (FakeTorchDevice("cpu", None), ValueError, "not a CUDA device"),
     (True, TypeError, "device=True has type bool"), (1.0, TypeError, "device=1.0 has type float"),
     (2**32, ValueError, "device=4294967296 is out of range"),
     ("cuda:4294967296", ValueError, "device='cuda:4294967296' is out of range"),
     (FakeTorchDevice("cuda", 2**31), ValueError, "out of range")],
)
def test_bad_device_arguments(device, error, message):
    with pytest.raises(error, match=message) as info:
        _config._device_index(device)
    accepted = "accepted: None, an int from 0 to 2147483647, 'cuda', 'cuda:N' or a torch.device"
    assert accepted in str(info.value)


@fresh_process("backend:sim,sim_devices:2")
def test_stats_are_per_device():
    malloc(3 * MiB, device=1)
    for device in (1, "cuda:1", FakeTorchDevice("cuda", 1)):
        assert ba.memory_allocated(device) == 3 * MiB
    assert ba.memory_allocated() == ba.memory_allocated("cuda:0") == 0
    with pytest.raises(ba.BucketallocError, match="device 2 is invalid; accepted: 0 to 1"):
        ba.memory_stats(2)
    with pytest.raises(ba.BucketallocError, match="device 2 is invalid"):
        ba.check_invariants(2)


# ---- stats ------------------------------------------------------------------------------------


@fresh_process(SIM)
def test_memory_stats_has_torch_keys_sorted():
    malloc(1 * MiB)
    stats = ba.memory_stats()
    assert isinstance(stats, collections.OrderedDict)
    assert list(stats) == sorted(stats)
    assert all(isinstance(v, (int, float)) for v in stats.values())
    for stat in TORCH_POOL_STATS:
        for pool in ("all", "small_pool", "large_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                assert f"{stat}.{pool}.{metric}" in stats
    for key in TORCH_SCALARS:
        assert key in stats
    for metric in ("current", "peak", "allocated", "freed"):
        assert f"oversize_allocations.{metric}" in stats and f"oversize_segments.{metric}" in stats
    assert stats["max_split_size"] == -1  # unlimited, as PyTorch reports it


@fresh_process(SIM)
def test_memory_summary_and_its_abbreviated_form():
    malloc(1000)
    full = ba.memory_summary()
    assert full.startswith("|" + "=" * 75 + "|\n|                  PyTorch CUDA memory summary, device ID 0")
    assert "bucketalloc memory summary, device 0" in full
    assert "|       from small pool" in full and "|   from large pool" in full
    short = ba.memory_summary(abbreviated=True)
    assert "from small pool" not in short and "from large pool" not in short
    assert "| Allocated memory" in short and "| cached_bytes" in short and "| num_ooms" in short
    assert short.splitlines() == [line for line in full.splitlines() if " from " not in line]


# ---- fragmentation ---------------------------------------------------------------------------


@fresh_process(SIM)
def test_fragmentation_histogram_shape_and_totals():
    malloc(3 * MiB + 100)  # 3 MiB + 512 of a 20 MiB segment: one free block of the rest
    report = ba.fragmentation_histogram(0)
    assert set(report) == {"all", "small_pool", "large_pool", "tiers"}
    assert report["tiers"] == []
    for pool in ("all", "small_pool", "large_pool"):
        assert set(report[pool]) == {"reserved", "allocated", "requested", "total_free", "largest_free",
                                     "external_fragmentation", "internal_fragmentation", "histogram"}
        for bin_ in report[pool]["histogram"]:
            assert set(bin_) == {"min_bytes", "max_bytes", "count", "bytes"}
            assert bin_["count"] > 0
            assert bin_["min_bytes"] * bin_["count"] <= bin_["bytes"] <= bin_["max_bytes"] * bin_["count"]
        assert sum(b["bytes"] for b in report[pool]["histogram"]) == report[pool]["total_free"]
    large = report["large_pool"]
    assert large["reserved"] == 20 * MiB
    assert large["allocated"] == 3 * MiB + 512
    assert large["requested"] == 3 * MiB + 100
    assert large["total_free"] == large["reserved"] - large["allocated"]
    assert large["largest_free"] == large["total_free"]
    assert large["external_fragmentation"] == 0.0  # a single free block
    assert large["internal_fragmentation"] == pytest.approx(1 - (3 * MiB + 100) / (3 * MiB + 512))
    assert report["small_pool"]["reserved"] == 0
    assert report["all"]["total_free"] == large["total_free"]


@fresh_process("backend:sim,tiers:[64MiB,128MiB]")
def test_fragmentation_histogram_lists_tiers():
    p = malloc(100 * MiB)  # rounds up to the 128 MiB tier
    q = malloc(60 * MiB)
    free(q, 60 * MiB)
    tiers = ba.fragmentation_histogram(0)["tiers"]
    assert tiers == [{"tier_bytes": 64 * MiB, "in_use": 0, "cached": 1},
                     {"tier_bytes": 128 * MiB, "in_use": 1, "cached": 0}]
    assert ba.memory_allocated(0) == 128 * MiB
    free(p, 100 * MiB)


# ---- snapshots and history -------------------------------------------------------------------


def check_segment_sums(segments):
    for seg in segments:
        blocks = seg["blocks"]
        assert sum(b["size"] for b in blocks) == seg["total_size"]
        assert [b["address"] for b in blocks] == sorted(b["address"] for b in blocks)
        assert blocks[0]["address"] == seg["address"]
        for left, right in zip(blocks, blocks[1:]):
            assert left["address"] + left["size"] == right["address"]  # blocks tile the segment
        assert seg["allocated_size"] == sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        assert seg["active_size"] == sum(b["size"] for b in blocks if b["state"].startswith("active_"))
        assert seg["requested_size"] == sum(b["requested_size"] for b in blocks if b["state"].startswith("active_"))


@fresh_process(SIM)
def test_snapshot_layout_states_and_sums():
    so = _lib.lib()
    large = malloc(3 * MiB + 100, stream=STREAM_A)
    freed = malloc(2 * MiB, stream=STREAM_A)
    pending = malloc(1 * MiB + 512, stream=STREAM_A)
    small = malloc(1000)
    free(freed, 2 * MiB, stream=STREAM_A)
    so.bucketalloc_record_stream(pending, STREAM_B)
    _lib.check(so.bucketalloc_sim_enqueue_work(0, STREAM_B), "bucketalloc_sim_enqueue_work")
    free(pending, 1 * MiB + 512, stream=STREAM_A)

    snap = ba.snapshot()
    json.dumps(snap)  # plain data
    assert {"segments", "device_traces", "allocator_settings"} <= set(snap)
    segments = snap["segments"]
    assert len(segments) == 2
    for seg in segments:
        assert TORCH_SEGMENT_KEYS <= set(seg), set(seg)
        assert seg["device"] == 0
        assert seg["segment_pool_id"] == (0, 0)
        assert seg["is_expandable"] is False
        assert seg["frames"] == []
        for block in seg["blocks"]:
            assert set(block) == TORCH_BLOCK_KEYS
            assert block["state"] in ("active_allocated", "active_pending_free", "inactive")
            if block["state"] == "inactive":
                assert block["requested_size"] == 0
    check_segment_sums(segments)

    by_type = {seg["segment_type"]: seg for seg in segments}
    assert set(by_type) == {"large", "small"}
    assert by_type["large"]["stream"] == STREAM_A
    assert by_type["large"]["total_size"] == 20 * MiB
    states = {b["address"]: (b["state"], b["size"], b["requested_size"]) for b in by_type["large"]["blocks"]}
    assert states[large] == ("active_allocated", 3 * MiB + 512, 3 * MiB + 100)
    assert states[freed][0] == "inactive"  # coalesced with the free rest of the segment
    assert states[pending] == ("active_pending_free", 1 * MiB + 512, 1 * MiB + 512)
    assert by_type["small"]["blocks"][0]["address"] == small
    assert by_type["small"]["blocks"][0]["state"] == "active_allocated"
    assert ba.snapshot(0)["segments"] == segments
    assert ba.snapshot("cuda:0")["segments"] == segments


def record_history_of_two_frees():
    """Records a free on the allocation stream and one deferred by record_stream; returns
    (trace, first pointer, second pointer)."""
    so = _lib.lib()
    ba.record_memory_history("all", max_entries=100)
    p = malloc(4 * MiB)
    free(p, 4 * MiB)
    q = malloc(4 * MiB, stream=STREAM_A)
    so.bucketalloc_record_stream(q, STREAM_B)
    _lib.check(so.bucketalloc_sim_enqueue_work(0, STREAM_B), "bucketalloc_sim_enqueue_work")
    free(q, 4 * MiB, stream=STREAM_A)
    _lib.check(so.bucketalloc_sim_complete_work(0, STREAM_B), "bucketalloc_sim_complete_work")
    ba.empty_cache()
    traces = ba.snapshot()["device_traces"]
    assert len(traces) == 1, traces
    return traces[0], p, q


@fresh_process(SIM)
def test_history_records_every_event_in_order():
    trace, p, q = record_history_of_two_frees()
    for entry in trace:
        assert TORCH_TRACE_KEYS <= set(entry), entry
    actions = [(e["action"], e["addr"]) for e in trace]
    assert actions[:8] == [
        ("segment_alloc", p), ("alloc", p), ("free_requested", p), ("free_completed", p),
        ("segment_alloc", q), ("alloc", q), ("free_requested", q),
        ("free_completed", q),  # once B's event is found complete (at empty_cache, here)
    ], actions
    assert sorted(actions[8:]) == sorted([("segment_free", p), ("segment_free", q)]), actions
    assert [e["size"] for e in trace if e["action"].startswith("segment_")] == [20 * MiB] * 4, trace
    assert [e["stream"] for e in trace[:8]] == [0] * 4 + [STREAM_A] * 4, trace
    assert [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)


@fresh_process(SIM)
def test_history_gives_a_block_the_same_size_in_each_of_its_events():
    # memory_viz and other trace readers pair alloc, free_requested and free_completed of a block
    # by address and add or subtract their sizes; PyTorch records the same size in all three.
    trace, p, q = record_history_of_two_frees()
    sizes = [(e["action"], e["size"]) for e in trace if e["action"] in ("alloc", "free_requested", "free_completed")]
    assert sizes == [("alloc", 4 * MiB), ("free_requested", 4 * MiB), ("free_completed", 4 * MiB)] * 2, sizes


@pytest.mark.parametrize(
    "max_entries, error, message",
    [(2**64, ValueError, "max_entries=18446744073709551616 is out of range; accepted: an int from 1 to 16777216"),
     (2**24 + 1, ValueError, "accepted: an int from 1 to 16777216"), (0, ValueError, "accepted: an int from 1"),
     ("10", TypeError, "max_entries='10' has type str"), (True, TypeError, "has type bool"),
     (10.0, TypeError, "has type float")],
)
def test_history_max_entries_is_checked_before_ctypes(max_entries, error, message):
    with pytest.raises(error, match=message):
        ba.record_memory_history("all", max_entries)


@fresh_process("backend:sim,sim_devices:2")
def test_a_device_beyond_a_c_int_is_refused_not_truncated():
    malloc(3 * MiB, device=0)
    with pytest.raises(ValueError, match="out of range"):
        ba.memory_allocated(2**32)
    assert ba.memory_allocated(0) == 3 * MiB
    with pytest.raises(ba.BucketallocError, match="device 5 is invalid; accepted: 0 to 1"):
        ba.memory_allocated(5)


@fresh_process(SIM)
def test_history_is_a_ring_of_max_entries():
    ba.record_memory_history("all", max_entries=4)
    p = malloc(4 * MiB)
    free(p, 4 * MiB)
    for _ in range(5):
        assert malloc(4 * MiB) == p
        free(p, 4 * MiB)
    trace = ba.snapshot()["device_traces"][0]
    assert [e["action"] for e in trace] == ["free_completed", "alloc", "free_requested", "free_completed"]
    assert {e["addr"] for e in trace} == {p}


@fresh_process(SIM)
def test_history_on_again_or_off_clears_it():
    ba.record_memory_history("state", max_entries=10)
    malloc(1000)
    assert [e["action"] for e in ba.snapshot()["device_traces"][0]] == ["segment_alloc", "alloc"]
    ba.record_memory_history(True, max_entries=10)
    assert ba.snapshot()["device_traces"][0] == []
    malloc(1000)
    assert [e["action"] for e in ba.snapshot()["device_traces"][0]] == ["alloc"]
    ba.record_memory_history(False)  # as PyTorch's _record_memory_history(enabled=None)
    malloc(1000)
    assert ba.snapshot()["device_traces"][0] == []
    with pytest.raises(ValueError, match="enabled='yes'; accepted: 'all', 'state' or True"):
        ba.record_memory_history("yes")
    with pytest.raises(ValueError, match="max_entries=0 is out of range; accepted: an int from 1 to"):
        ba.record_memory_history("all", max_entries=0)


@fresh_process("backend:sim,capacity:64MiB")
def test_history_records_an_oom_with_device_free():
    ba.record_memory_history("all")
    assert _lib.lib().bucketalloc_malloc(100 * MiB, 0, None) is None
    (entry,) = ba.snapshot()["device_traces"][0]
    assert entry["action"] == "oom"
    assert entry["size"] == 100 * MiB
    assert "device_free" in entry and "addr" not in entry
    assert entry["device_free"] > 0


@fresh_process(SIM)
def test_dump_snapshot_writes_the_snapshot_as_a_pickle():
    import os
    import tempfile

    ba.record_memory_history("all")
    malloc(3 * MiB)
    malloc(200 * KiB)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snap.pickle")
        ba.dump_snapshot(path)
        with open(path, "rb") as f:
            loaded = pickle.load(f)
    assert loaded == ba.snapshot()
    assert len(loaded["segments"]) == 2
    assert len(loaded["device_traces"][0]) == 4


def test_keyword_options_extend_pytorchs_variable_as_the_library_reads_it():
    run_python(
        """
import bucketalloc_torch as ba
ba.configure(capacity="96MiB", backend="sim")
config = ba.config()
assert "max_split_size_mb:512" in config and "capacity:96MiB" in config and "backend:sim" in config, config
""",
        PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:512",
        PYTORCH_ALLOC_CONF="max_split_size_mb:1024",
    )


# ---- prefetch ---------------------------------------------------------------------------------


@fresh_process("backend:sim,capacity:64MiB,sim_total_memory:256MiB,expandable_segments:true")
def test_prefetch_creates_spares_a_grow_maps_and_stops_at_the_cap():
    assert ba.prefetch(16 * MiB) == 16 * MiB
    assert ba.memory_reserved() == 16 * MiB
    assert ba.prefetch(16 * MiB) == 0  # the spares are enough
    p = malloc(16 * MiB)
    assert ba.memory_reserved() == 16 * MiB  # the spares, mapped
    assert ba.prefetch(32 * MiB, max_create=4 * MiB, device="cuda:0") == 4 * MiB
    assert ba.prefetch(2**30) == 44 * MiB  # stopped at the cap
    with pytest.raises(ba.BucketallocError, match="prefetch to 50.00 MiB of spare memory on device 0"):
        ba.prefetch(50 * MiB)
    free(p, 16 * MiB)
    ba.empty_cache()
    assert ba.memory_reserved() == 0
    ba.check_invariants()


@fresh_process(SIM)
def test_prefetch_needs_virtual_memory_and_checks_its_arguments():
    with pytest.raises(ba.BucketallocError, match="accepted: backend:vmm"):
        ba.prefetch(8 * MiB)
    with pytest.raises(ValueError, match="spare_target=-1 is out of range"):
        ba.prefetch(-1)
    with pytest.raises(TypeError, match="max_create=1.5 has type float"):
        ba.prefetch(8 * MiB, max_create=1.5)
    assert ba.memory_reserved() == 0
