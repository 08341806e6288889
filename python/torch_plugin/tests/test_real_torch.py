"""enable() with real PyTorch on a CUDA device; skipped where there is none.

The scenario runs in a fresh process: the allocator must be swapped before CUDA is initialized.
"""

from __future__ import annotations

import importlib.util

import pytest

from helpers import child_env, run, run_python

REASON = "needs torch with a CUDA device"


def _torch_with_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    # In a child: is_available() does not initialize CUDA, but keep this process free of torch.
    probe = run(["-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"], child_env())
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _torch_with_cuda(), reason=REASON)


def test_tensors_are_served_by_bucketalloc():
    run_python(
        """
        import bucketalloc_torch as ba
        ba.enable(patch_torch=True)
        import torch

        torch.cuda.init()
        base = ba.memory_allocated()
        x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        assert ba.memory_allocated() - base == 3 << 20, ba.memory_stats()
        assert torch.cuda.memory_allocated() == ba.memory_allocated()  # patched
        blocks = {b["address"]: b for s in ba.snapshot()["segments"] for b in s["blocks"]}
        assert blocks[x.data_ptr()]["state"] == "active_allocated"
        del x
        torch.cuda.synchronize()
        assert ba.memory_allocated() == base
        torch.cuda.empty_cache()  # the reset hook
        assert ba.memory_reserved() == ba.memory_stats()["reserved_bytes.all.current"]
        if base == 0:
            assert ba.memory_reserved() == 0

        try:
            torch.empty(1 << 45, dtype=torch.uint8, device="cuda")  # 32 TiB
        except RuntimeError as e:
            assert "bucketalloc: out of memory on device" in str(e), e
        else:
            raise AssertionError("a 32 TiB tensor was allocated")
        assert ba.memory_stats()["num_ooms"] == 1
        assert ba.last_oom_report().startswith("bucketalloc: out of memory on device")
        ba.check_invariants()
        """,
        conf="max_split_size_mb:512",
    )
