"""A stand-in for PyTorch with only what bucketalloc_torch touches; it records every call.

Used by the launcher and enable() tests, which put tests/fake_torch on the PYTHONPATH of a child
process only. torch._fake.log lists the calls in order. Environment knobs:
  FAKE_TORCH_CUDA_INITIALIZED=1   CUDA is initialized: change_current_allocator raises as PyTorch does
  FAKE_TORCH_NATIVE_RESERVED=N    the native allocator holds N bytes (with CUDA initialized)
  FAKE_TORCH_MISSING_SETTERS=a,b  hook setters this "torch version" lacks
"""

from . import _fake, cuda  # noqa: F401
