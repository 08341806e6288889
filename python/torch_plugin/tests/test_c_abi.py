"""The C ABI through ctypes on the simulated device: allocation, stats, errors, streams, caps.

Each test runs in a fresh process (see helpers.fresh_process) so that it starts from an empty
allocator with its own configuration.
"""

from __future__ import annotations

import ctypes

import pytest

import bucketalloc_torch as ba
from bucketalloc_torch import _lib
from helpers import GiB, KiB, MiB, STREAM_A, STREAM_B, fresh_process

SIM = "backend:sim,capacity:1GiB"


def malloc(size: int, stream: int = 0) -> int:
    """Allocates through the C ABI on device 0; fails the test on NULL."""
    return _lib.check_pointer(_lib.lib().bucketalloc_malloc(size, 0, stream), "bucketalloc_malloc")


def free(ptr: int, size: int, stream: int = 0) -> None:
    _lib.lib().bucketalloc_free(ptr, size, 0, stream)


def gauges(stats) -> dict:
    """The stats without the counters that an invalid call is expected to bump."""
    return {k: v for k, v in stats.items() if k != "num_invalid_frees"}


@fresh_process(SIM)
def test_size_zero_returns_null_without_error():
    assert _lib.lib().bucketalloc_malloc(0, 0, None) is None
    assert _lib.last_error() == ""
    assert ba.memory_stats(0)["allocation.all.current"] == 0


@fresh_process(SIM)
def test_negative_size_returns_null_with_error():
    assert _lib.lib().bucketalloc_malloc(-5, 0, None) is None
    error = _lib.last_error()
    assert "size -5" in error and "negative" in error, error
    assert ba.memory_stats(0)["allocation.all.current"] == 0
    ba.check_invariants(0)


@fresh_process(SIM)
def test_invalid_device_is_an_error():
    assert _lib.lib().bucketalloc_malloc(1 * MiB, 7, None) is None
    assert "device 7 is invalid" in _lib.last_error()
    with pytest.raises(ba.BucketallocError, match="device 7 is invalid"):
        ba.memory_stats(7)


@fresh_process(SIM)
def test_stats_follow_malloc_and_free():
    large, small = 3 * MiB + 100, 1000  # rounded to 3 MiB + 512 (512-byte steps) and 1 KiB (a class)
    p = malloc(large)
    q = malloc(small)
    s = ba.memory_stats(0)
    assert s["allocated_bytes.large_pool.current"] == 3 * MiB + 512
    assert s["allocated_bytes.small_pool.current"] == 1 * KiB
    assert s["allocated_bytes.all.current"] == 3 * MiB + 512 + 1 * KiB
    assert s["requested_bytes.all.current"] == large + small
    assert s["allocation.all.current"] == 2
    assert s["allocation.large_pool.current"] == s["allocation.small_pool.current"] == 1
    assert s["active_bytes.all.current"] == s["allocated_bytes.all.current"]
    # A large request under 10 MiB takes a 20 MiB segment; a small one a 2 MiB slab.
    assert s["reserved_bytes.large_pool.current"] == 20 * MiB
    assert s["reserved_bytes.small_pool.current"] == 2 * MiB
    assert s["segment.all.current"] == 2
    assert s["num_device_alloc"] == 2

    free(q, small)
    free(p, large)
    s = ba.memory_stats(0)
    assert s["allocated_bytes.all.current"] == 0
    assert s["requested_bytes.all.current"] == 0
    assert s["allocation.all.current"] == 0
    assert s["allocated_bytes.all.peak"] == 3 * MiB + 512 + 1 * KiB
    assert s["allocated_bytes.all.allocated"] == s["allocated_bytes.all.freed"] == 3 * MiB + 512 + 1 * KiB
    assert s["reserved_bytes.all.current"] == 22 * MiB  # freed memory stays cached
    assert ba.memory_allocated(0) == 0
    assert ba.max_memory_allocated(0) == 3 * MiB + 512 + 1 * KiB
    assert ba.memory_reserved(0) == ba.max_memory_reserved(0) == 22 * MiB

    ba.reset_peak_memory_stats(0)
    s = ba.memory_stats(0)
    assert s["allocated_bytes.all.peak"] == 0
    assert s["reserved_bytes.all.peak"] == 22 * MiB  # the current value
    ba.check_invariants(0)


@fresh_process(SIM)
def test_freed_block_is_reused_on_its_stream():
    p = malloc(4 * MiB)
    free(p, 4 * MiB)
    assert malloc(4 * MiB) == p
    assert ba.memory_stats(0)["num_device_alloc"] == 1


@fresh_process(SIM)
def test_invalid_frees_leave_the_allocator_untouched():
    live = malloc(64 * KiB)
    freed = malloc(4 * MiB)
    free(freed, 4 * MiB)
    cases = [
        (freed, 4 * MiB, "double free"),
        (0xDEAD0000, 64, "not allocated by bucketalloc"),
        (live + 512, -1, "a pointer into a block rather than its start"),
        (live, 1000, "size mismatch: allocated with 65536 bytes, freed with 1000 bytes"),
    ]
    for ptr, size, expected in cases:
        before = ba.memory_stats(0)
        free(ptr, size)
        error = _lib.last_error()
        assert expected in error, (hex(ptr), error)
        assert f"invalid free of 0x{ptr:x}" in error, error
        after = ba.memory_stats(0)
        assert gauges(after) == gauges(before), hex(ptr)
        assert after["num_invalid_frees"] == before["num_invalid_frees"] + 1
        ba.check_invariants(0)
    free(live, 64 * KiB)  # still live after the mismatched free: the right size frees it
    assert ba.memory_allocated(0) == 0


@fresh_process(SIM)
def test_record_stream_defers_reuse_until_the_stream_completes():
    so = _lib.lib()
    size = 4 * MiB
    p = malloc(size, STREAM_A)
    so.bucketalloc_record_stream(p, STREAM_B)
    _lib.check(so.bucketalloc_sim_enqueue_work(0, STREAM_B), "bucketalloc_sim_enqueue_work")
    free(p, size, STREAM_A)
    s = ba.memory_stats(0)
    assert s["allocated_bytes.all.current"] == 0
    assert s["active_bytes.all.current"] == size  # pending: freed, awaiting stream B
    states = [b["state"] for seg in ba.snapshot(0)["segments"] for b in seg["blocks"] if b["address"] == p]
    assert states == ["active_pending_free"]

    # Neither a cache hit nor a slow path (which polls pending blocks) may hand it out while B runs.
    while_pending = [malloc(size, STREAM_A) for _ in range(8)]  # 32 MiB: more than one segment
    assert p not in while_pending

    _lib.check(so.bucketalloc_sim_complete_work(0, STREAM_B), "bucketalloc_sim_complete_work")
    after = [malloc(size, STREAM_A) for _ in range(8)]
    assert p in after
    ba.check_invariants(0)


@fresh_process(SIM)
def test_record_stream_of_an_unknown_pointer_is_reported():
    _lib.lib().bucketalloc_record_stream(0xDEAD0000, STREAM_B)
    assert "0xdead0000 is not a live allocation" in _lib.last_error()


@fresh_process(SIM)
def test_base_alloc_returns_the_segment():
    so = _lib.lib()
    p = malloc(3 * MiB)
    q = malloc(3 * MiB)
    size = ctypes.c_size_t()
    assert so.bucketalloc_base_alloc(q, ctypes.byref(size)) == p  # q was split from p's segment
    assert size.value == 20 * MiB
    assert so.bucketalloc_base_alloc(0xDEAD0000, ctypes.byref(size)) is None
    assert "not a live allocation" in _lib.last_error()


@fresh_process(SIM)
def test_empty_cache_releases_everything_not_live():
    p = malloc(30 * MiB)
    q = malloc(1000)
    keep = malloc(50 * MiB)
    free(p, 30 * MiB)
    free(q, 1000)
    assert ba.memory_reserved(0) == 30 * MiB + 2 * MiB + 50 * MiB
    ba.empty_cache()
    s = ba.memory_stats(0)
    assert s["reserved_bytes.all.current"] == 50 * MiB  # only the live allocation's segment
    assert s["segment.all.current"] == 1
    free(keep, 50 * MiB)
    ba.empty_cache()
    s = ba.memory_stats(0)
    assert s["reserved_bytes.all.current"] == 0
    assert s["segment.all.current"] == 0
    assert s["num_device_free"] == 3
    ba.check_invariants(0)


@fresh_process("backend:sim,sim_total_memory:256MiB")
def test_memory_fraction_caps_reserved_memory_and_reports_the_oom():
    so = _lib.lib()
    so.bucketalloc_set_memory_fraction(0.25, 0)
    assert ba.memory_stats(0)["capacity_bytes"] == 64 * MiB
    assert ba.last_oom_report(0) == ""
    kept = malloc(40 * MiB)
    assert so.bucketalloc_malloc(40 * MiB, 0, None) is None
    error = _lib.last_error()
    assert error.startswith("bucketalloc: out of memory on device 0: capacity"), error
    report = ba.last_oom_report(0)
    assert report.startswith("bucketalloc: out of memory on device 0: capacity"), report
    s = ba.memory_stats(0)
    assert s["num_ooms"] == 1
    assert s["num_alloc_retries"] == 1
    assert s["reserved_bytes.all.current"] <= 64 * MiB
    free(kept, 40 * MiB)
    assert malloc(40 * MiB)  # fits once the first is freed
    ba.check_invariants(0)


@fresh_process("backend:sim")
def test_memory_fraction_out_of_range_is_reported():
    for fraction in (0.0, 1.5):
        _lib.lib().bucketalloc_set_memory_fraction(fraction, 0)
        error = _lib.last_error()
        assert f"memory fraction {fraction:g} for device 0 is invalid; accepted: a number in (0, 1]" in error, error
    assert ba.memory_stats(0)["capacity_bytes"] == 16 * GiB  # unchanged: the sim device's memory


@fresh_process(SIM)
def test_stream_capture_allocates_into_the_graphs_private_pool():
    so = _lib.lib()
    warm = malloc(4 * MiB, STREAM_A)
    free(warm, 4 * MiB, STREAM_A)  # a cached segment of the device's own pools on stream A
    _lib.check(so.bucketalloc_capture_begin(0, 9, STREAM_A), "bucketalloc_capture_begin")
    _lib.check(so.bucketalloc_sim_set_capturing(0, STREAM_A, 1), "bucketalloc_sim_set_capturing")
    graph_block = malloc(4 * MiB, STREAM_A)
    assert graph_block != warm  # the graph's pool, not the device's cache
    big = malloc(64 * MiB, STREAM_A)  # a miss grows the pool during the capture
    reserved = ba.memory_reserved(0)
    so.bucketalloc_empty_cache()
    assert "empty_cache on device 0 during CUDA graph capture" in _lib.last_error()
    assert ba.memory_reserved(0) == reserved
    s = ba.memory_stats(0)
    assert s["num_capture_refusals"] == 0
    assert s["num_ooms"] == 0
    free(graph_block, 4 * MiB, STREAM_A)
    free(big, 64 * MiB, STREAM_A)
    _lib.check(so.bucketalloc_sim_set_capturing(0, STREAM_A, 0), "bucketalloc_sim_set_capturing")
    _lib.check(so.bucketalloc_capture_end(0, 9), "bucketalloc_capture_end")
    # The graph's blocks stay in its pool while the graph may replay.
    eager = malloc(4 * MiB, STREAM_A)
    assert eager != graph_block
    assert {segment["segment_pool_id"] for segment in ba.snapshot(0)["segments"]} == {(0, 0), (9, 0)}
    _lib.check(so.bucketalloc_release_pool(0, 9), "bucketalloc_release_pool")
    free(eager, 4 * MiB, STREAM_A)
    ba.empty_cache()
    assert ba.memory_reserved(0) == 0
    ba.check_invariants(0)


@fresh_process("backend:sim")
def test_sim_controls_check_the_device():
    with pytest.raises(ba.BucketallocError, match="device 3 is invalid"):
        _lib.check(_lib.lib().bucketalloc_sim_enqueue_work(3, STREAM_A), "bucketalloc_sim_enqueue_work")


@fresh_process(SIM)
def test_text_functions_follow_snprintf():
    so = _lib.lib()
    malloc(1 * MiB)
    full = _lib.read_text(so.bucketalloc_stats_json, 0)
    assert so.bucketalloc_stats_json(0, None, 0) == len(full)  # length only
    small = ctypes.create_string_buffer(16)
    assert so.bucketalloc_stats_json(0, small, 16) == len(full)  # >= len: too small
    assert small.value == full[:15].encode()  # truncated and NUL-terminated
    assert _lib.read_text(so.bucketalloc_stats_json, 0, initial_size=16) == full  # grow and retry
    assert so.bucketalloc_stats_json(0, None, 8) == -1
    assert "the output buffer is NULL but its length is 8" in _lib.last_error()


@fresh_process("backend:sim,sim_devices:2")
def test_allocator_is_created_on_first_use():
    so = _lib.lib()
    assert so.bucketalloc_version().decode() == ba.__version__
    assert so.bucketalloc_is_initialized() == 0
    assert so.bucketalloc_device_count() == 2  # creates it
    assert so.bucketalloc_is_initialized() == 1
