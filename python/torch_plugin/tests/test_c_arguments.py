"""Every argument the Python API hands to the C ABI is checked before the call (issue 27, item 13).

ctypes cuts a string at its first NUL (``tenant("a\\0x")`` would act on tenant ``a``) and wraps an
integer to the width of its C type (``bind_stream(2**64, ...)`` would bind stream 0, the default
stream; ``set_tenant_cap(name, 2**64 + n)`` would set ``n``). Each public function refuses such a
value with a ValueError (NUL, out of range) or a TypeError (not a str / not an int, a bool for an
int) that names the argument, its value and what is accepted, *before the library is loaded*:
these tests run in the pytest process with ``_lib.lib`` replaced by a function that fails the test,
so a value that reaches ctypes is a failure whatever the library would do with it.

The behaviour on the real library (nothing changes after a refusal) is tested in test_tenants.py
and test_metrics.py; register_metrics's registry check in test_metrics.py (it needs prometheus_client).
"""

from __future__ import annotations

import inspect
import pathlib

import pytest

import bucketalloc_torch as ba
from bucketalloc_torch import _config, _lib
from helpers import MiB, STREAM_A

U64 = 2**64 - 1  # uintptr_t and size_t on the platforms bucketalloc supports (x86-64, aarch64)
NUL = r"contains a NUL character .*; NUL is not accepted"


@pytest.fixture(autouse=True)
def no_library(monkeypatch):
    """Fails the test if a function reaches the library (a checked argument must not)."""

    def reached(*args, **kwargs):
        raise AssertionError("the call reached the library: the argument was not checked before ctypes")

    monkeypatch.setattr(_lib, "lib", reached)
    monkeypatch.setattr(_lib, "library_path", reached)


class FakeStream:
    """Has what a torch.cuda.Stream has for bind_stream: cuda_stream."""

    def __init__(self, handle):
        self.cuda_stream = handle


# (function, args, kwargs, exception, message regex). Every public function that passes an argument
# to the C ABI has rows here (test_every_public_function_with_c_arguments_is_swept checks it).
CASES = [
    # Text: a NUL would end the C string early.
    (ba.configure, ("backend:sim\0,capacity:1GiB",), {}, ValueError, r"conf='backend:sim\\x00,capacity:1GiB' " + NUL),
    (ba.configure, ("backend:sim",), {"capacity": "1GiB\0"}, ValueError, r"option capacity='1GiB\\x00' " + NUL),
    (ba.configure, ("backend:sim",), {"tiers": ["64MiB\0"]}, ValueError, r"option tiers='64MiB\\x00' " + NUL),
    (ba.configure, ("backend:sim",), {"capa\0city": 1}, ValueError, r"option name='capa\\x00city' " + NUL),
    (ba.enable, ("backend:sim\0",), {}, ValueError, r"conf='backend:sim\\x00' " + NUL),
    (ba.enable, (), {"capacity": "1GiB\0"}, ValueError, r"option capacity='1GiB\\x00' " + NUL),
    (ba.tenant, ("long\0x",), {}, ValueError, r"name='long\\x00x' " + NUL),
    (ba.tenant, (3,), {}, TypeError, r"name=3 has type int; accepted: a tenant's name \(str\)"),
    (ba.tenant, (b"long",), {}, TypeError, r"name=b'long' has type bytes; accepted: a tenant's name \(str\)"),
    (ba.tenant, ("long\udcff",), {}, ValueError, r"name='long\\udcff' is not valid UTF-8"),
    (ba.bind_stream, (STREAM_A, "long\0"), {}, ValueError, r"name='long\\x00' " + NUL),
    (ba.set_tenant_cap, ("short\0", 64 * MiB), {}, ValueError, r"name='short\\x00' " + NUL),
    (ba.start_timeline, ("f\0.x",), {}, ValueError, r"path='f\\x00.x' " + NUL),
    (ba.start_timeline, (b"f\0.x",), {}, ValueError, r"path=b'f\\x00.x' " + NUL),
    (ba.start_timeline, (pathlib.PurePosixPath("d/f\0.x"),), {}, ValueError,
     r"path=PurePosixPath\('d/f\\x00.x'\) " + NUL),
    (ba.start_timeline, (3,), {}, TypeError, r"path=3 has type int; accepted: a str, bytes or os.PathLike"),
    # Stream handles: a uintptr_t (cudaStream_t).
    (ba.bind_stream, (2**64, "long"), {}, ValueError,
     rf"stream=18446744073709551616 is out of range; accepted: .*an int from 0 to {U64}"),
    (ba.bind_stream, (2**64 + STREAM_A, "long"), {}, ValueError, r"stream=18446744073709555712 is out of range"),
    (ba.bind_stream, (-1, "long"), {}, ValueError, r"stream=-1 is out of range"),
    (ba.bind_stream, (FakeStream(2**64), "long"), {}, ValueError,
     r"stream.cuda_stream=18446744073709551616 is out of range"),
    (ba.bind_stream, (True, "long"), {}, TypeError, r"stream=True has type bool; accepted: a torch.cuda.Stream or"),
    (ba.bind_stream, ("stream", "long"), {}, TypeError, r"stream='stream' has type str"),
    (ba.bind_stream, (float(STREAM_A), "long"), {}, TypeError, r"stream=4096.0 has type float"),
    # Sizes: a size_t.
    (ba.set_tenant_cap, ("short", 2**64 + 16 * MiB), {}, ValueError,
     rf"cap_bytes=18446744073726328832 is out of range; accepted: an int from 0 to {U64}"),
    (ba.set_tenant_cap, ("short", -1), {}, ValueError, r"cap_bytes=-1 is out of range"),
    (ba.set_tenant_cap, ("short", True), {}, TypeError, r"cap_bytes=True has type bool"),
    (ba.set_tenant_cap, ("short", 64.0 * MiB), {}, TypeError, r"cap_bytes=67108864.0 has type float"),
    (ba.prefetch, (2**64,), {}, ValueError,
     rf"spare_target=18446744073709551616 is out of range; accepted: an int from 0 to {U64}"),
    (ba.prefetch, (-1,), {}, ValueError, r"spare_target=-1 is out of range"),
    (ba.prefetch, (8 * MiB, 2**64), {}, ValueError, r"max_create=18446744073709551616 is out of range"),
    (ba.prefetch, (8 * MiB, True), {}, TypeError, r"max_create=True has type bool"),
    (ba.prefetch, (8.0 * MiB,), {}, TypeError, r"spare_target=8388608.0 has type float"),
    (ba.prefetch, (8 * MiB, 0, 2**31), {}, ValueError, r"device=2147483648 is out of range"),
    (ba.record_memory_history, ("all", 2**64), {}, ValueError,
     r"max_entries=18446744073709551616 is out of range; accepted: an int from 1 to 16777216"),
    (ba.record_memory_history, ("all", 0), {}, ValueError, r"max_entries=0 is out of range"),
    (ba.record_memory_history, ("all", True), {}, TypeError, r"max_entries=True has type bool"),
    (ba.record_memory_history, (None, "10"), {}, TypeError, r"max_entries='10' has type str"),
    # Intervals: an int.
    (ba.start_timeline, ("t.jsonl", 2**32 + 20), {}, ValueError,
     r"interval_ms=4294967316 is out of range; accepted: an int from 1 to 3600000 \(milliseconds\)"),
    (ba.start_timeline, ("t.jsonl", 0), {}, ValueError, r"interval_ms=0 is out of range"),
    (ba.start_timeline, ("t.jsonl", 3_600_001), {}, ValueError, r"interval_ms=3600001 is out of range"),
    (ba.start_timeline, ("t.jsonl", True), {}, TypeError, r"interval_ms=True has type bool"),
    (ba.start_timeline, ("t.jsonl", 1.5), {}, TypeError, r"interval_ms=1.5 has type float"),
    (ba.start_timeline, ("t.jsonl", "100"), {}, TypeError, r"interval_ms='100' has type str"),
]

# Devices: an int (and -1, all devices, only where the function means it).
DEVICE_FUNCTIONS = [ba.memory_stats, ba.memory_allocated, ba.max_memory_allocated, ba.memory_reserved,
                    ba.max_memory_reserved, ba.reset_peak_memory_stats, ba.memory_summary,
                    ba.fragmentation_histogram, ba.last_oom_report, ba.check_invariants, ba.tenant_stats,
                    ba.snapshot]
for function in DEVICE_FUNCTIONS:
    CASES += [
        (function, (2**32,), {}, ValueError,
         r"device=4294967296 is out of range; accepted: None, an int from 0 to 2147483647"),
        (function, ("cuda:4294967296",), {}, ValueError, r"device='cuda:4294967296' is out of range"),
        (function, (-1,), {}, ValueError, r"device=-1 is out of range"),
        (function, (True,), {}, TypeError, r"device=True has type bool"),
        (function, (1.0,), {}, TypeError, r"device=1.0 has type float"),
    ]

# Public functions whose arguments never reach the C ABI, and why.
NOT_TO_C = {
    "dump_snapshot": "filename goes to Python's open(), which refuses a NUL itself; device is snapshot()'s",
    "register_metrics": "registry is prometheus_client's (test_metrics.py checks its type)",
}


def _case_id(case) -> str:
    function, args, kwargs, error, _ = case
    shown = ", ".join([repr(a)[:30] for a in args] + [f"{k}={v!r}"[:30] for k, v in kwargs.items()])
    return f"{function.__name__}({shown})-{error.__name__}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_a_value_ctypes_would_cut_or_wrap_is_refused_before_the_call(case):
    function, args, kwargs, error, message = case
    with pytest.raises(error, match=message):
        function(*args, **kwargs)


def test_a_refused_call_names_what_is_accepted():
    for function, args, kwargs, error, _ in CASES:
        with pytest.raises(error) as info:
            function(*args, **kwargs)
        text = str(info.value)
        assert "accepted" in text, (function.__name__, args, kwargs, text)


def test_every_public_function_with_c_arguments_is_swept():
    swept = {case[0].__name__ for case in CASES}
    for name in ba.__all__:
        value = getattr(ba, name)
        if not inspect.isfunction(value) or not inspect.signature(value).parameters:
            continue
        assert name in swept or name in NOT_TO_C, f"{name} takes arguments but has no row in CASES"


def test_values_at_the_ends_of_the_c_ranges_pass_the_checks():
    # The checks refuse only what ctypes would change: the library is reached with the ends of each range.
    assert _config._device_index(2**31 - 1) == 2**31 - 1
    assert _config._device_index("cuda:2147483647") == 2**31 - 1
    assert _lib.checked_int("stream", U64, 0, U64) == U64
    assert _lib.checked_text("name", "tenant-\u00e9") == "tenant-\u00e9".encode()
    assert _lib.checked_text("path", pathlib.PurePosixPath("a/b"), path=True) == b"a/b"
    for function, args in ((ba.bind_stream, (U64, "long")), (ba.set_tenant_cap, ("short", U64)),
                           (ba.start_timeline, ("t.jsonl", 3_600_000)), (ba.tenant, ("long",)),
                           (ba.record_memory_history, ("all", 2**24)), (ba.record_memory_history, (None, 2**64))):
        with pytest.raises(AssertionError, match="reached the library"):
            with_context = function(*args)
            if function is ba.tenant:
                with with_context:
                    pass
