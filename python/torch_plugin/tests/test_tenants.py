"""Tenants from Python: `with bucketalloc_torch.tenant(...)`, bind_stream, set_tenant_cap and
tenant_stats over the C ABI, on the simulated device (each test in a fresh process)."""

from __future__ import annotations

import threading

import pytest

import bucketalloc_torch as ba
from bucketalloc_torch import _lib
from helpers import MiB, STREAM_A, STREAM_B, fresh_process

TENANTS = "backend:sim,capacity:1GiB,tenants:[short:64MiB,long:32MiB]"


def _malloc(size: int, stream: int = STREAM_A) -> int:
    return _lib.check_pointer(_lib.lib().bucketalloc_malloc(size, 0, stream), "bucketalloc_malloc")


def _free(pointer: int, size: int, stream: int = STREAM_A) -> None:
    _lib.lib().bucketalloc_free(pointer, size, 0, stream)


def _by_name() -> dict:
    return {t["tenant"]: t for t in ba.tenant_stats(0)}


@fresh_process(TENANTS)
def test_the_context_routes_this_threads_allocations_and_restores_the_tenant_before():
    with ba.tenant("long"):
        a = _malloc(4 * MiB)
        with ba.tenant("short"):
            b = _malloc(4 * MiB)
        c = _malloc(4 * MiB)  # back to "long"
    d = _malloc(4 * MiB)  # back to the default tenant
    seen = []
    thread = threading.Thread(target=lambda: seen.append(_malloc(MiB)))  # another thread: its own tenant
    with ba.tenant("short"):
        thread.start()
        thread.join()
    stats = _by_name()
    assert [t["tenant"] for t in ba.tenant_stats(0)] == ["default", "short", "long"]
    assert (stats["default"]["live_allocations"], stats["short"]["live_allocations"],
            stats["long"]["live_allocations"]) == (2, 1, 2), stats
    assert stats["long"]["cap_bytes"] == 32 * MiB and stats["short"]["cap_bytes"] == 64 * MiB
    assert sum(t["allocated_bytes"] for t in stats.values()) == ba.memory_allocated(0)
    assert sum(t["reserved_bytes"] for t in stats.values()) == ba.memory_reserved(0)
    for p in (a, b, c, d):
        _free(p, 4 * MiB)
    _free(seen[0], MiB)
    ba.check_invariants(0)


@fresh_process(TENANTS)
def test_a_bound_stream_goes_to_its_tenant_and_its_oom_names_the_tenant_and_cap():
    ba.bind_stream(STREAM_B, "long")
    held = []
    while True:
        p = _lib.lib().bucketalloc_malloc(4 * MiB, 0, STREAM_B)
        if p is None:
            break
        held.append(p)
        assert len(held) <= 8, "the long tenant's 32 MiB cap did not hold"
    assert "for tenant 'long' (cap 32.00 MiB)" in _lib.last_error()
    assert "for tenant 'long'" in ba.last_oom_report(0)
    stats = _by_name()
    assert stats["long"]["ooms"] == 1 and stats["short"]["ooms"] == 0 and stats["default"]["ooms"] == 0
    assert stats["long"]["reserved_bytes"] <= 32 * MiB
    # The other tenants are still served; unbinding sends the stream back to the thread's tenant.
    with ba.tenant("short"):
        s = _malloc(16 * MiB)
    ba.bind_stream(STREAM_B, "default")
    d = _malloc(16 * MiB, STREAM_B)
    assert _by_name()["default"]["live_allocations"] == 1
    for p in held:
        _free(p, 4 * MiB, STREAM_B)
    _free(s, 16 * MiB)
    _free(d, 16 * MiB, STREAM_B)
    ba.check_invariants(0)


@fresh_process(TENANTS)
def test_lowering_a_cap_releases_the_tenants_cache_and_keeps_live_memory():
    size = 12 * MiB  # a segment of its own: a freed one is whole cached segments
    with ba.tenant("short"):
        live = [_malloc(size) for _ in range(3)]
        cached = _malloc(size)
        _free(cached, size)
        before = _by_name()["short"]
        assert before["cached_bytes"] == size
        ba.set_tenant_cap("short", 16 * MiB)  # below the 36 MiB it holds live
        after = _by_name()["short"]
        assert after["cap_bytes"] == 16 * MiB
        assert after["allocated_bytes"] == before["allocated_bytes"] == 3 * size
        assert after["cached_bytes"] == 0 and after["reserved_bytes"] == before["reserved_bytes"] - size
        assert _lib.lib().bucketalloc_malloc(size, 0, STREAM_A) is None
        assert "for tenant 'short' (cap 16.00 MiB)" in _lib.last_error()
        for p in live:
            _free(p, size)
        again = _malloc(size)  # from its own cache: no growth
        _free(again, size)
    ba.check_invariants(0)


@fresh_process(TENANTS)
def test_bad_names_and_caps_are_clear_errors_that_change_nothing():
    with pytest.raises(ba.BucketallocError, match="no tenant named 'medium'; accepted: default, short, long"):
        with ba.tenant("medium"):
            pass
    with pytest.raises(TypeError, match="accepted: a tenant's name"):
        with ba.tenant(3):
            pass
    with pytest.raises(ba.BucketallocError, match="accepted: 2MiB to 16TiB"):
        ba.set_tenant_cap("short", MiB)
    with pytest.raises(ba.BucketallocError, match="the default tenant's cap is the device's"):
        ba.set_tenant_cap("default", 64 * MiB)
    with pytest.raises(ValueError, match=r"cap_bytes=-1 is out of range; accepted: an int from 0 to"):
        ba.set_tenant_cap("short", -1)
    with pytest.raises(TypeError, match="stream='stream' has type str; accepted: a torch.cuda.Stream or"):
        ba.bind_stream("stream", "short")
    assert _by_name()["short"]["cap_bytes"] == 64 * MiB
    assert _lib.read_text(_lib.lib().bucketalloc_thread_tenant) == "default"


@fresh_process("backend:sim,capacity:1GiB")
def test_without_tenants_only_default_is_a_tenant_and_the_stats_are_empty():
    assert ba.tenant_stats(0) == []
    with ba.tenant("default"):
        _free(_malloc(MiB), MiB)
    with pytest.raises(ba.BucketallocError, match="set tenants:"):
        with ba.tenant("long"):
            pass


@fresh_process(TENANTS)
def test_what_ctypes_would_cut_or_wrap_is_refused_and_changes_nothing():
    # ctypes would cut "long\0x" to "long", wrap stream 2**64 to 0 (the default stream) and cap
    # 2**64 + 16 MiB to 16 MiB: each call would act on something the caller did not name.
    with pytest.raises(ValueError, match=r"name='long\\x00x' contains a NUL character .*; NUL is not accepted"):
        with ba.tenant("long\0x"):
            _free(_malloc(MiB), MiB)
    assert _lib.read_text(_lib.lib().bucketalloc_thread_tenant) == "default"
    with pytest.raises(ValueError, match=r"stream=18446744073709551616 is out of range; accepted: "):
        ba.bind_stream(2**64, "long")
    with pytest.raises(ValueError, match=r"name='long\\x00' contains a NUL"):
        ba.bind_stream(STREAM_B, "long\0")
    p = _malloc(MiB, stream=0)  # the default stream: still the thread's (default) tenant
    q = _malloc(MiB, stream=STREAM_B)
    assert _by_name()["long"]["live_allocations"] == 0, _by_name()
    assert _by_name()["default"]["live_allocations"] == 2
    with pytest.raises(ValueError, match=r"cap_bytes=18446744073726328832 is out of range"):
        ba.set_tenant_cap("short", 2**64 + 16 * MiB)
    with pytest.raises(ValueError, match=r"name='short\\x00' contains a NUL"):
        ba.set_tenant_cap("short\0", 16 * MiB)
    assert _by_name()["short"]["cap_bytes"] == 64 * MiB
    _free(p, MiB, stream=0)
    _free(q, MiB, stream=STREAM_B)
    ba.check_invariants(0)
