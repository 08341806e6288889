"""bucketalloc's metrics in prometheus_client: a collector of the library's Prometheus text.

The library renders every metric once (``bucketalloc_metrics_text``, docs/operations.md); this
collector hands that text to prometheus_client's own parser and yields the families, so a server
that already exposes ``/metrics`` with prometheus_client (vLLM, TGI, any FastAPI app with
``make_asgi_app``) shows bucketalloc's series next to its own. ``enable()`` registers it in
prometheus_client's default registry when prometheus_client is installed; ``register_metrics()``
does it explicitly, for any registry.

prometheus_client is optional: nothing here imports it until a collector is registered.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterator, List, Optional

from . import _lib
from ._lib import BucketallocError


def metrics_text() -> str:
    """Returns every device's metrics in Prometheus's text format (empty before the allocator exists;
    asking does not create it)."""
    return _lib.read_text(_lib.lib().bucketalloc_metrics_text)


def metrics_port() -> int:
    """Returns the TCP port the ``BUCKETALLOC_METRICS_ADDR`` server listens on: the one the system
    chose when the address asked for port 0 (``127.0.0.1:0``). The server starts with the allocator
    (at its first use), when that variable is set.

    Raises:
        BucketallocError: no server is running, with the library's message saying why (the variable
            is unset or was malformed, its address could not be bound, the allocator does not exist
            yet, a host name is still being resolved, or this process is a child of fork); or the
            library predates ``bucketalloc_metrics_port`` (the message says to rebuild it).
    """
    return _lib.check(_lib.optional_function("bucketalloc_metrics_port")(), "bucketalloc_metrics_port")


_MAX_INTERVAL_MS = 3_600_000  # the library's bound on the timeline's interval (an hour)


def start_timeline(path: "str | os.PathLike[str]", interval_ms: int = 1000) -> None:
    """Appends the memory timeline to `path`: one JSON line per device every `interval_ms` (1 to
    3,600,000) with the memory figures and the OOMs since the device's previous line, and a last
    line at stop_timeline() or exit (docs/operations.md; BUCKETALLOC_TIMELINE does the same from
    the environment). Replaces a timeline already running.

    Raises:
        TypeError, ValueError: a path that is not a str, bytes or os.PathLike, or holds a NUL; an
            interval that is not an int from 1 to 3600000 (checked before ctypes).
        BucketallocError: a file that cannot be opened.
    """
    encoded = _lib.checked_text("path", path, path=True)
    interval = _lib.checked_int("interval_ms", interval_ms, 1, _MAX_INTERVAL_MS,
                                f"an int from 1 to {_MAX_INTERVAL_MS} (milliseconds)")
    _lib.check(_lib.lib().bucketalloc_timeline_start(encoded, interval), "bucketalloc_timeline_start")


def stop_timeline() -> None:
    """Stops the timeline after its last line (nothing when none runs)."""
    _lib.check(_lib.lib().bucketalloc_timeline_stop(), "bucketalloc_timeline_stop")


class Collector:
    """A prometheus_client collector of bucketalloc's metrics (a custom collector: ``collect()``
    yields metric families, read from the library at each scrape)."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.parser import text_string_to_metric_families

        text = metrics_text()
        if text:
            yield from text_string_to_metric_families(text)

    def describe(self) -> List[Any]:
        # Nothing up front: the families exist once the allocator has served (and a registry with
        # auto_describe would otherwise scrape at registration).
        return []


_lock = threading.Lock()
_registered: List[Any] = []  # the registries holding a collector (one each)


def register_metrics(registry: Optional[Any] = None) -> Collector:
    """Registers bucketalloc's collector in `registry` (default: prometheus_client's REGISTRY, which
    ``prometheus_client.start_http_server`` and ``make_asgi_app`` serve); once per registry.

    Returns:
        The collector (the one registered before, for a registry that has it).

    Raises:
        BucketallocError: prometheus_client is not installed (``pip install prometheus_client``).
        TypeError: `registry` is not None or a ``prometheus_client.CollectorRegistry``.
    """
    try:
        import prometheus_client
    except ImportError as e:
        raise BucketallocError(
            "bucketalloc: register_metrics needs prometheus_client (pip install prometheus_client); "
            "without it, metrics_text() returns the same metrics as text"
        ) from e
    if registry is not None and not isinstance(registry, prometheus_client.CollectorRegistry):
        raise TypeError(f"registry={registry!r} has type {type(registry).__name__}; accepted: None "
                        "(prometheus_client.REGISTRY) or a prometheus_client.CollectorRegistry")
    target = prometheus_client.REGISTRY if registry is None else registry
    with _lock:
        for held, collector in _registered:
            if held is target:
                return collector
        collector = Collector()
        target.register(collector)
        _registered.append((target, collector))
        return collector


def register_if_available() -> bool:
    """Registers the collector in prometheus_client's default registry when prometheus_client can be
    imported (enable() calls it); False when it cannot."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    register_metrics()
    return True
