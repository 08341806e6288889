"""bucketalloc for PyTorch: the allocator as a CUDAPluggableAllocator, and its stats and snapshots.

``enable()`` makes libbucketalloc.so PyTorch's CUDA allocator (it must run before the first CUDA
allocation); ``python -m bucketalloc_torch script.py`` does the same for an unchanged program.
Under a pluggable allocator PyTorch's own ``torch.cuda.memory_stats()``, ``memory_summary()``,
``_snapshot()`` and friends raise, so this module provides them with the same names, keys and
layouts, read from the library; ``enable(patch_torch=True)`` installs them in ``torch.cuda``.

The inspection functions load only the library, never torch, so they also serve the simulated
device (``backend:sim``) in processes without PyTorch or a GPU.

Example::

    import bucketalloc_torch
    bucketalloc_torch.enable("max_split_size_mb:512", patch_torch=True)
    import torch
    x = torch.empty(1 << 20, device="cuda")
    print(bucketalloc_torch.memory_allocated())        # == torch.cuda.memory_allocated()
    bucketalloc_torch.dump_snapshot("snapshot.pickle")  # for pytorch.org/memory_viz

``device`` arguments accept None (the current torch device when torch is imported and CUDA is
initialized, else 0), an int, ``"cuda"``, ``"cuda:N"`` or a ``torch.device`` of type cuda.
"""

from __future__ import annotations

# The package's parts, by what each owns (every name below is re-exported here, the same object):
#   _config       device arguments, configure()/config() and the BUCKETALLOC_CONF composition
#   _stats        memory_stats() & co, memory_summary(), the reports, check_invariants(), empty_cache()
#   _tenants      tenant(), bind_stream(), set_tenant_cap(), tenant_stats()
#   _snapshots    snapshot(), dump_snapshot(), record_memory_history() and the recorded stacks
#   _integration  enable(), allocator_path(), the install paths, torch's stand-ins and the patching
#   _metrics      the Prometheus text, the metrics server and the timeline
from . import _lib, _metrics, _torch_ext
from ._config import CONF_ENV, Device, config, configure
from ._integration import allocator_path, enable, unpatch_torch
from ._lib import BucketallocError
from ._metrics import metrics_port, metrics_text, register_metrics, start_timeline, stop_timeline
from ._snapshots import DEFAULT_HISTORY_ENTRIES, dump_snapshot, record_memory_history, snapshot
from ._stats import (
    check_invariants,
    empty_cache,
    fragmentation_histogram,
    last_oom_report,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    prefetch,
    reset_peak_memory_stats,
)
from ._tenants import bind_stream, set_tenant_cap, tenant, tenant_stats
from ._version import project_version as _project_version

# The project's version (CMakeLists.txt; the C ABI reports the same).
__version__ = _project_version()

__all__ = [
    "BucketallocError",
    "bind_stream",
    "DEFAULT_HISTORY_ENTRIES",
    "check_invariants",
    "config",
    "configure",
    "dump_snapshot",
    "empty_cache",
    "enable",
    "fragmentation_histogram",
    "last_oom_report",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "metrics_port",
    "metrics_text",
    "prefetch",
    "record_memory_history",
    "register_metrics",
    "reset_peak_memory_stats",
    "set_tenant_cap",
    "snapshot",
    "start_timeline",
    "stop_timeline",
    "tenant",
    "tenant_stats",
    "unpatch_torch",
    "allocator_path",
]
