"""bucketalloc's metrics for prometheus_client (the real one, from PyPI): the collector in any
registry and in the default one, a prometheus_client HTTP server showing bucketalloc's series with
no code of ours, enable() registering them, and prometheus_client missing."""

from __future__ import annotations

import importlib.util
import os
import urllib.request

import pytest

from helpers import MiB, child_env, expect_success, fresh_process, run, run_python

SIM = "backend:sim,capacity:256MiB,sim_total_memory:512MiB"

prometheus_client = pytest.importorskip(
    "prometheus_client",
    reason="LOUD SKIP: prometheus_client is not installed; scripts/test_python.sh installs it into the test venv",
)


def _malloc(size: int) -> int:
    from bucketalloc_torch import _lib

    return _lib.check_pointer(_lib.lib().bucketalloc_malloc(size, 0, 0), "bucketalloc_malloc")


@fresh_process(SIM)
def test_metrics_text_is_empty_before_the_allocator_and_never_creates_it():
    import bucketalloc_torch as ba
    from bucketalloc_torch import _lib

    assert ba.metrics_text() == ""
    assert _lib.lib().bucketalloc_is_initialized() == 0
    _malloc(3 * MiB)
    text = ba.metrics_text()
    assert 'bucketalloc_allocated_bytes{device="0",pool="all"} 3145728\n' in text, text


@fresh_process(SIM)
def test_the_collector_reports_the_stats_in_any_registry():
    import prometheus_client
    from prometheus_client.parser import text_string_to_metric_families

    import bucketalloc_torch as ba
    from bucketalloc_torch import _lib

    registry = prometheus_client.CollectorRegistry()
    collector = ba.register_metrics(registry)
    assert ba.register_metrics(registry) is collector, "registered once per registry"
    assert registry.get_sample_value("bucketalloc_allocated_bytes", {"device": "0", "pool": "all"}) is None
    p = _malloc(3 * MiB)
    assert _lib.lib().bucketalloc_malloc(1 << 30, 0, 0) is None  # a capacity OOM
    stats = ba.memory_stats()
    sample = registry.get_sample_value
    assert sample("bucketalloc_allocated_bytes", {"device": "0", "pool": "all"}) == stats["allocated_bytes.all.current"]
    assert sample("bucketalloc_reserved_bytes", {"device": "0", "pool": "large_pool"}) == stats[
        "reserved_bytes.large_pool.current"]
    assert sample("bucketalloc_ooms_total", {"device": "0", "cause": "capacity"}) == 1
    assert sample("bucketalloc_allocations_total", {"device": "0"}) == 1
    assert sample("bucketalloc_free_block_size_bytes_count", {"device": "0", "pool": "all"}) >= 1
    # The registry's own text parses back, with every family of the library's text.
    exposed = prometheus_client.generate_latest(registry).decode()
    names = {f.name for f in text_string_to_metric_families(exposed)}
    assert {f.name for f in text_string_to_metric_families(ba.metrics_text())} <= names
    _lib.lib().bucketalloc_free(p, 3 * MiB, 0, 0)


@fresh_process(SIM)
def test_a_prometheus_client_server_shows_the_series_with_no_code():
    import prometheus_client

    import bucketalloc_torch as ba

    ba.register_metrics()  # the default registry, as enable() does
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1")
    port = server.server_address[1]
    _malloc(5 * MiB)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "# TYPE bucketalloc_reserved_bytes gauge" in body, body[:2000]
    assert 'bucketalloc_allocated_bytes{device="0",pool="all"} 5.24288e+06' in body, body[:2000]
    assert "python_gc_objects_collected_total" in body, "the registry's own series are still there"
    server.shutdown()


def test_enable_registers_the_metrics_in_the_default_registry():
    # Asked without importing torch here: other tests check that this process never imports it.
    if importlib.util.find_spec("torch") is None:
        pytest.fail("the real torch is not installed: scripts/test_python.sh installs it", pytrace=False)
    run_python(
        """
import prometheus_client
import bucketalloc_torch as ba
ba.enable()
ba.enable()
import torch
p = torch._C._cuda_cudaCachingAllocator_raw_alloc(1 << 20, 0x1000)   # through the allocator torch holds
value = prometheus_client.REGISTRY.get_sample_value("bucketalloc_allocated_bytes", {"device": "0", "pool": "all"})
assert value == ba.memory_allocated() == 1 << 20, (value, ba.memory_allocated())
text = prometheus_client.generate_latest().decode()
assert text.count("# TYPE bucketalloc_allocated_bytes gauge") == 1, "registered once"
torch._C._cuda_cudaCachingAllocator_raw_delete(p)
""",
        conf=SIM,
    )


def test_without_prometheus_client_register_says_what_to_install():
    run_python(
        """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "prometheus_client" or name.startswith("prometheus_client."):
            raise ImportError("hidden")
sys.meta_path.insert(0, Hide())
import bucketalloc_torch as ba
from bucketalloc_torch import _metrics
assert _metrics.register_if_available() is False
try:
    ba.register_metrics()
except ba.BucketallocError as e:
    assert "pip install prometheus_client" in str(e), e
else:
    raise AssertionError("registered without prometheus_client")
assert ba.metrics_text() == ""
""",
        conf=SIM,
    )


@fresh_process(SIM)
def test_start_timeline_appends_lines_with_each_oom_once():
    import json
    import os
    import tempfile
    import time

    import bucketalloc_torch as ba
    from bucketalloc_torch import _lib

    for bad in (0, -1, 3_600_001, 2**32 + 20, 1.5, True, "100"):
        with pytest.raises((ValueError, TypeError), match=r"accepted: an int from 1 to 3600000 \(milliseconds\)"):
            ba.start_timeline("t.jsonl", bad)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "timeline.jsonl")
        ba.start_timeline(path, 20)
        p = _malloc(3 * MiB)
        time.sleep(0.06)
        assert _lib.lib().bucketalloc_malloc(1 << 30, 0, 0) is None
        time.sleep(0.06)
        ba.stop_timeline()
        lines = [json.loads(line) for line in open(path) if line.strip()]
    assert len(lines) >= 3, lines
    assert sum(len(line["ooms"]) for line in lines) == 1
    assert lines[-1]["ooms_total"]["capacity"] == 1
    assert lines[-1]["allocated_bytes"] == ba.memory_allocated() == 3 * MiB
    _lib.lib().bucketalloc_free(p, 3 * MiB, 0, 0)


def test_a_real_prometheus_scrapes_the_python_collector(tmp_path):
    """Debian's Prometheus (scripts/setup.sh installs it) scrapes a Python process whose
    prometheus_client server carries bucketalloc's collector; PromQL through its HTTP API returns the
    values the process reported."""
    import json
    import shutil
    import socket
    import subprocess
    import sys
    import time
    import urllib.parse

    from helpers import child_env

    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is not installed: scripts/setup.sh installs the Debian package prometheus",
                    pytrace=False)

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    port, prom_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", f"""
import sys, prometheus_client
import bucketalloc_torch as ba
from bucketalloc_torch import _lib
ba.register_metrics()
prometheus_client.start_http_server({port}, addr="127.0.0.1")
p = _lib.lib().bucketalloc_malloc(7 << 20, 0, 0)
assert _lib.lib().bucketalloc_malloc(1 << 30, 0, 0) is None
print(ba.memory_stats()["allocated_bytes.all.current"], flush=True)
sys.stdin.read()
"""],
        env=child_env(SIM), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: python\n"
                      f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    prom = None
    try:
        allocated = int(server.stdout.readline())
        prom = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def query(q: str):
            url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
            try:
                result = json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]
            except OSError:
                return None
            return result[0]["value"][1] if len(result) == 1 else None

        value = None
        deadline = time.time() + 60
        while value is None and time.time() < deadline:
            value = query('bucketalloc_allocated_bytes{job="python",device="0",pool="all"}')
            time.sleep(0.5)
        assert value is not None, "Prometheus returned no bucketalloc series within 60 s"
        assert float(value) == allocated
        assert float(query('bucketalloc_ooms_total{job="python",cause="capacity"}')) == 1
        assert float(query('up{job="python"}')) == 1
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        server.stdin.close()
        server.wait(timeout=30)


@fresh_process(SIM)
def test_a_timeline_path_with_a_nul_is_refused_not_cut():
    # ctypes would cut "f\0.x" to "f" and write the timeline there.
    import tempfile

    import bucketalloc_torch as ba

    with tempfile.TemporaryDirectory() as d:
        for path in (os.path.join(d, "f\0.x"), os.fsencode(os.path.join(d, "f\0.x"))):
            with pytest.raises(ValueError, match=r"path=.*f\\x00\.x.* contains a NUL character .*; NUL is not acc"):
                ba.start_timeline(path, 10)
        _malloc(MiB)
        ba.stop_timeline()
        assert os.listdir(d) == []


@pytest.mark.parametrize("registry", [object(), "default", prometheus_client.REGISTRY.get_sample_value])
def test_register_metrics_refuses_what_is_not_a_registry(registry):
    import bucketalloc_torch as ba

    with pytest.raises(TypeError, match=r"registry=.* has type \w+; accepted: None \(prometheus_client.REGISTRY\) "
                                        r"or a prometheus_client.CollectorRegistry"):
        ba.register_metrics(registry)


# ---- the BUCKETALLOC_METRICS_ADDR server's port ----------------------------------------------


def _has_metrics_port() -> bool:
    """Whether the library under test exports bucketalloc_metrics_port (asked in a child, so that this
    process never loads the library)."""
    probe = run(["-c", "import sys; from bucketalloc_torch import _lib; "
                       "sys.exit(0 if hasattr(_lib.lib(), 'bucketalloc_metrics_port') else 3)"], child_env(SIM))
    if probe.returncode not in (0, 3):
        expect_success(probe)
    return probe.returncode == 0


def test_metrics_port_is_the_port_chosen_for_port_0_and_serves_the_metrics():
    if not _has_metrics_port():
        pytest.fail("the library does not export bucketalloc_metrics_port: rebuild it", pytrace=False)
    run_python(
        """
import urllib.request
import bucketalloc_torch as ba
from bucketalloc_torch import _lib
try:
    ba.metrics_port()  # the server starts with the allocator, which asking does not create
except ba.BucketallocError as e:
    assert str(e) == _lib.last_error(), e
else:
    raise AssertionError("a port before the allocator exists")
assert _lib.lib().bucketalloc_is_initialized() == 0
p = _lib.check_pointer(_lib.lib().bucketalloc_malloc(3 << 20, 0, 0), "bucketalloc_malloc")
port = ba.metrics_port()
assert isinstance(port, int) and 0 < port < 65536, port
assert ba.metrics_port() == port
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
assert 'bucketalloc_allocated_bytes{device="0",pool="all"} 3145728' in body, body[:2000]
_lib.lib().bucketalloc_free(p, 3 << 20, 0, 0)
""",
        conf=SIM,
        BUCKETALLOC_METRICS_ADDR="127.0.0.1:0",
    )


def test_metrics_port_without_a_server_raises_the_librarys_error():
    if not _has_metrics_port():
        pytest.fail("the library does not export bucketalloc_metrics_port: rebuild it", pytrace=False)
    env = child_env(SIM)
    env.pop("BUCKETALLOC_METRICS_ADDR", None)
    expect_success(run(["-c", """
import bucketalloc_torch as ba
from bucketalloc_torch import _lib
_lib.check_pointer(_lib.lib().bucketalloc_malloc(1 << 20, 0, 0), "bucketalloc_malloc")
try:
    ba.metrics_port()
except RuntimeError as e:
    assert isinstance(e, ba.BucketallocError), type(e)
    assert str(e) and str(e) == _lib.last_error(), (str(e), _lib.last_error())
    assert "BUCKETALLOC_METRICS_ADDR" in str(e), e
else:
    raise AssertionError("metrics_port() returned without a server")
"""], env))


@fresh_process(SIM)
def test_metrics_port_with_a_library_older_than_the_function_says_to_rebuild():
    import re

    import bucketalloc_torch as ba
    from bucketalloc_torch import _lib

    real, path = _lib._loaded_library()

    class Older:
        """The loaded library as one built before bucketalloc_metrics_port existed."""

        def __getattr__(self, name):
            if name == "bucketalloc_metrics_port":
                raise AttributeError(name)
            return getattr(real, name)

    _lib._declare(Older(), path)  # loads: only bucketalloc_metrics_port needs it
    _lib._loaded = (Older(), path)
    with pytest.raises(ba.BucketallocError, match=rf"{re.escape(path)} does not export bucketalloc_metrics_port: it was built "
                                                  r"before bucketalloc_metrics_port was added to the C ABI; rebuild it"):
        ba.metrics_port()
