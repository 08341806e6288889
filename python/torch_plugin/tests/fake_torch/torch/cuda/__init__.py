"""torch.cuda of the fake torch: device state from the environment, memory functions from .memory."""

import os

from . import memory
from .memory import (  # noqa: F401  (torch.cuda re-exports these from torch.cuda.memory)
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
)


def is_initialized():
    return os.environ.get("FAKE_TORCH_CUDA_INITIALIZED") == "1"


def current_device():
    return 0


def device_count():
    return 1
