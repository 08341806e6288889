"""Tenants (tenants:[NAME:SIZE,...] in the configuration): the per-thread tenant block, stream
bindings, caps and per-tenant stats."""

from __future__ import annotations

import contextlib
import json
from typing import Any, ContextManager, Dict, Iterator, List

from . import _lib
from ._config import Device, _device_index


def _tenant_name(name: str) -> bytes:
    return _lib.checked_text("name", name, "a tenant's name (str) or 'default'")


def tenant(name: str) -> ContextManager[None]:
    """Sends this thread's allocations to tenant `name` inside the block, then back to the tenant before.

    ``with bucketalloc_torch.tenant("long"): ...``: every allocation the thread makes there (unless
    its stream is bound to a tenant, see bind_stream) comes from the tenant's own pools, under its cap.
    Per thread: other threads (autograd's backward threads among them) keep their own tenant.

    Raises:
        TypeError, ValueError: `name` is not a str, or holds a NUL (at this call, before the block).
        BucketallocError: a name that is not a tenant (the message lists them), on entering the block.
    """
    return _tenant_block(_tenant_name(name))


@contextlib.contextmanager
def _tenant_block(encoded: bytes) -> Iterator[None]:
    before = _lib.read_text(_lib.lib().bucketalloc_thread_tenant)
    _lib.check(_lib.lib().bucketalloc_set_thread_tenant(encoded), "bucketalloc_set_thread_tenant")
    try:
        yield
    finally:
        _lib.check(_lib.lib().bucketalloc_set_thread_tenant(before.encode()), "bucketalloc_set_thread_tenant")


def bind_stream(stream: Any, name: str) -> None:
    """Binds `stream` (a torch.cuda.Stream or a cudaStream_t as an int) to tenant `name` on every device.

    Allocations on that stream then go to the tenant, from any thread; "default" unbinds it.

    Raises:
        TypeError, ValueError: a stream that is not an int handle from 0 to 2**64 - 1 (or a
            torch.cuda.Stream), a name that is not a str or holds a NUL.
        BucketallocError: a name that is not a tenant.
    """
    argument, handle = ("stream", stream)
    if hasattr(stream, "cuda_stream"):  # a torch.cuda.Stream
        argument, handle = ("stream.cuda_stream", stream.cuda_stream)
    handle = _lib.checked_int(argument, handle, 0, _lib.C_UINTPTR_MAX, "a torch.cuda.Stream or a cudaStream_t "
                              f"handle as an int from 0 to {_lib.C_UINTPTR_MAX}")
    encoded = _tenant_name(name)
    _lib.check(_lib.lib().bucketalloc_bind_stream(handle, encoded), "bucketalloc_bind_stream")


def set_tenant_cap(name: str, cap_bytes: int) -> None:
    """Changes tenant `name`'s cap on reserved memory (2 MiB to 16 TiB) on every device.

    Lowering it below what the tenant holds releases its cache and refuses its growth until it
    fits; live tensors are never freed.

    Raises:
        TypeError, ValueError: a name that is not a str or holds a NUL; a cap that is not an int
            from 0 to 2**64 - 1 (checked here: ctypes would wrap it).
        BucketallocError: a name that is not a tenant, the default tenant, a cap outside 2 MiB to 16 TiB.
    """
    encoded = _tenant_name(name)
    cap = _lib.checked_int("cap_bytes", cap_bytes, 0, _lib.C_SIZE_MAX,
                           f"an int from 0 to {_lib.C_SIZE_MAX} (a size_t; the library accepts 2 MiB to 16 TiB)")
    _lib.check(_lib.lib().bucketalloc_set_tenant_cap(encoded, cap), "bucketalloc_set_tenant_cap")


def tenant_stats(device: Device = None) -> List[Dict[str, Any]]:
    """Each tenant's figures on `device`, the default tenant first (empty without tenants).

    Each dict has tenant, cap_bytes, reserved_bytes, peak_reserved_bytes, allocated_bytes,
    requested_bytes, cached_bytes, live_allocations, ooms and ooms_at_cap (refused by its own cap).
    """
    index = _device_index(device)
    data = json.loads(_lib.read_text(_lib.lib().bucketalloc_tenant_stats_json, index))
    return list(data["tenants"])
