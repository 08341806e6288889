#!/usr/bin/env python3
"""scripts/gpu_torch_check.py — the PyTorch section of scripts/gpu_check.sh (needs torch and a GPU).

Runs two fresh processes ("children") one after the other and compares them:
  * bucketalloc: bucketalloc_torch.enable() with no patch_torch; allocator_path() must be "native"
    (bucketalloc is the c10 CUDAAllocator torch holds, torch.cuda.get_allocator_backend() names it
    "bucketalloc"), so every torch function below is torch's own, unpatched;
  * native: PyTorch's own caching allocator ("torch" in the report).

Side by side: the same calls in both children, each with its peak reserved bytes
(torch.cuda.max_memory_reserved() after empty_cache() and reset_peak_memory_stats()) and wall time:
  - memory_stats_and_snapshot: torch.cuda.memory_stats() has torch's keys and follows a 6 MiB tensor
    (memory_allocated/memory_reserved agree, reset_peak_memory_stats works); memory_summary() renders;
    torch.cuda.memory._snapshot() lists the tensor's block as active_allocated, every segment with a
    segment_pool_id; _record_memory_history(max_entries=1000) then an allocation in a named function:
    the block's frames and an "alloc" trace entry name that function (C++ frames are counted and
    reported); _record_memory_history(None) turns it off (isHistoryEnabled false, a new block has no
    frames);
  - mempool_use_mem_pool: torch.cuda.MemPool(); use_count() 1, 2 inside `with use_mem_pool(pool)`,
    1 after; the tensors allocated inside sit in segments whose segment_pool_id is pool.id (a tensor
    allocated outside does not), pool.snapshot() lists only that pool's segments; after deleting the
    tensors and the pool, empty_cache() gives the pool's segments back (memory_reserved drops by them);
  - cudnn_benchmark: a conv net (3->64->128->128 channels, 3x3, ReLU, on 8x3x224x224) forward twice
    with torch.backends.cudnn.benchmark = True (cuDNN's search asks the allocator's cacheInfo), equal
    to the same net with benchmark False (TF32 off) within 1e-3 relative;
  - ipc_share_expandable_segment (bucketalloc only): the same from a process whose bucketalloc uses
    expandable segments (torch's 'e' handles: POSIX descriptors read with pidfd_getfd).
  - ipc_share_tensor: a CUDA tensor sent to a child process by torch.multiprocessing (spawn context;
    in the bucketalloc run the child enables bucketalloc first and must be on the native path too):
    the child sees the parent's values, modifies the tensor in place, answers through a pipe, and
    the parent sees the change (CUDA IPC: shareIpcHandle / getIpcDevPtr);
  - compile_reduce_overhead: torch.compile(mode="reduce-overhead") of a small transformer block
    (nn.TransformerEncoderLayer d_model=256, nhead=4, batch 8, seq 128, eval, no_grad) followed by a
    graph break and a head; compile, record, then 8 replays with fresh inputs, each equal to eager
    within 1e-3; then the other branch after the break, recorded while the first graph's outputs are
    live (cudagraph trees: checkpoint state, checkPoolLiveAllocations); no cudagraph skips. SKIP,
    loudly, when triton/inductor cannot run here (triton missing, no C compiler or Python headers).
    The inductor cache (TORCHINDUCTOR_CACHE_DIR, one fresh directory per run) is shared, so the first
    child compiles cold and the second warm: the table's "replays only" row compares the allocators.

bucketalloc only (after the side-by-side checks, in the bucketalloc child):
  - a variable-length workload (a seeded list of sequence lengths; embedding-like matmuls and a
    softmax per step) whose results must equal a CPU reference within float tolerance;
  - stats follow a tensor: bucketalloc_torch.memory_allocated() grows by its size and returns after
    `del`; torch's own memory_stats() agrees with bucketalloc_torch's; bucketalloc_torch.snapshot()
    lists it as active_allocated;
  - record_stream: a block used on a busy side stream is pending (snapshot state) and not handed out
    again while that stream runs, and is free once it has finished;
  - empty_cache: torch.cuda.empty_cache() leaves no segment or slab with nothing active;
  - CUDA graphs: warm up on a side stream, capture on it (CUDAGraph.capture_begin/capture_end),
    replay, compare, reset;
  - torch.cuda.graph with one graph_pool_handle() shared by two graphs: both replay correctly, the
    second costs no new memory, and resetting the first leaves the second correct;
  - torch.cuda.make_graphed_callables on a small MLP, forward and backward against eager;
  - torch/cuda/_memory_viz.py reads the pickle of torch's own _dump_snapshot() (stats and trace);
  - an impossible request raises torch.cuda.OutOfMemoryError whose message begins as torch's and
    carries bucketalloc's report, and an observer attached with
    torch._C._cuda_attach_out_of_memory_observer is called;
  - accelerate.find_executable_batch_size shrinks the batch until it fits under a cap set with
    torch.cuda.set_per_process_memory_fraction (SKIP when accelerate is not installed);
  - bucketalloc_torch.check_invariants().
Both children then run the latency loop: `torch.empty(n, dtype=uint8, device="cuda")` then `del` (a
cache hit after the first), for n in 4 KiB, 256 KiB, 2 MiB and 64 MiB, best of 5 repetitions of
20000 pairs each, in nanoseconds per pair. Target (issue 3): bucketalloc within 1.1x of native.

Prints one line per check ("check <name>: PASS|FAIL|SKIP <detail>"; a side-by-side check's line
gives both children's details and fails when either side fails), the latency table, the
side-by-side table (check | bucketalloc peak reserved | torch peak reserved | bucketalloc time |
torch time), and exits non-zero when a check failed. The latency target is reported, not enforced.

Each child prints a "CHECK <json>" line as each check ends and a "RESULT <json>" line at the end, so a
child that crashes or runs out of time still reports what it finished. The driver runs both children
within GPU_TORCH_CHECK_BUDGET_S seconds (default 225, under the step's 240 s in gpu_check.sh) and
sets TORCH_SYMBOLIZE_MODE=dladdr for them unless it is set (C++ frames symbolized without addr2line,
which can take minutes on libtorch).

Usage: python3 scripts/gpu_torch_check.py            (the driver: runs both processes)
       python3 scripts/gpu_torch_check.py --child bucketalloc|native   (one process; prints JSON lines)
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

SIZES = [4 << 10, 256 << 10, 2 << 20, 64 << 20]
PAIRS = 20000
REPEATS = 5

DEFAULT_BUDGET_S = 225.0  # both children together; gpu_check.sh gives the step 240 s
NATIVE_RESERVE_S = 60.0  # kept for torch's child while the bucketalloc child runs
IPC_TIMEOUT_S = 90.0  # a spawned consumer imports torch (and builds nothing: the cache is warm)
IPC_ELEMENTS = 1 << 20  # float32: 4 MiB
COMPILE_REPLAYS = 8

MODES = ("bucketalloc", "native")
LABEL = {"bucketalloc": "bucketalloc", "native": "torch"}

# torch.cuda.memory_stats() keys the check requires (torch's own names).
STATS_KEYS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "requested_bytes.all.current",
    "allocation.all.current",
    "segment.all.current",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
)

# Messages that say torch.compile cannot run on this machine (not an allocator failure).
COMPILE_ENVIRONMENT_PROBLEMS = (
    "Python.h",
    "Failed to find C compiler",
    "Cannot find a working triton installation",
    "No module named 'triton'",
    "TritonMissing",
    "triton is not installed",
    "GPUTooOldForTriton",
)


# ---- small helpers (no torch needed) --------------------------------------------------------------


class Skip(Exception):
    """A check that cannot run here; the reason is reported."""


class Ctx(NamedTuple):
    mode: str  # "bucketalloc" or "native"
    device: str = "cuda"  # "cpu" only when exercising the checks without a GPU


def first_line(e: BaseException, limit: int = 240) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {(text[0] if text else '')[:limit]}"


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def fmt_bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    return f"{n / (1 << 20):.1f} MiB"


def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "-"
    return f"{s:.3f} s" if s < 10 else f"{s:.1f} s"


def environment_problem(text: str) -> Optional[str]:
    """The pattern of COMPILE_ENVIRONMENT_PROBLEMS that `text` shows, unless it is an allocator's failure."""
    if "bucketalloc" in text or "out of memory" in text:
        return None
    return next((p for p in COMPILE_ENVIRONMENT_PROBLEMS if p in text), None)


def segment_of(snapshot: Dict[str, Any], ptr: int) -> Optional[Dict[str, Any]]:
    for seg in snapshot["segments"]:
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return seg
    return None


def block_at(snapshot: Dict[str, Any], ptr: int) -> Optional[Dict[str, Any]]:
    """The block that starts at `ptr` (blocks without "address" are placed one after the other)."""
    seg = segment_of(snapshot, ptr)
    if seg is None:
        return None
    address = seg["address"]
    for block in seg["blocks"]:
        start = block.get("address", address)
        if start == ptr:
            return block
        address = start + block["size"]
    return None


def pool_of(snapshot: Dict[str, Any], ptr: int) -> Optional[Tuple[int, int]]:
    seg = segment_of(snapshot, ptr)
    return None if seg is None else tuple(seg["segment_pool_id"])


def frame_names(frames: Optional[List[Dict[str, Any]]]) -> List[str]:
    return [f.get("name", "") for f in frames or []]


def is_cpp_frame(frame: Dict[str, Any]) -> bool:
    return not str(frame.get("filename", "")).endswith(".py")


# ---- the latency loop ---------------------------------------------------------------------------


def latency_ns(torch) -> dict:
    """Best-of-REPEATS ns per torch.empty/del pair, per size (warmed: the first pair is a miss)."""
    out = {}
    for n in SIZES:
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        del x
        best = float("inf")
        for _ in range(REPEATS):
            t0 = time.perf_counter_ns()
            for _ in range(PAIRS):
                x = torch.empty(n, dtype=torch.uint8, device="cuda")
                del x
            best = min(best, (time.perf_counter_ns() - t0) / PAIRS)
        out[str(n)] = best
    return out


# ---- side-by-side checks: the same calls in both children ----------------------------------------


def _sync(torch, ctx: Ctx) -> None:
    if ctx.device == "cuda":
        torch.cuda.synchronize()


def _relative_error(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def _allocate_for_history_check(torch, device: str):
    """The named function whose allocation must show up in the snapshot's frames."""
    return torch.empty(5 << 20, dtype=torch.uint8, device=device)


def check_memory_stats_and_snapshot(torch, ctx: Ctx) -> Tuple[bool, str]:
    if ctx.device != "cuda":
        raise Skip("needs CUDA")
    problems = []
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    missing = [k for k in STATS_KEYS if k not in stats]
    if missing:
        problems.append(f"memory_stats() lacks {missing}")
    base = stats.get("allocated_bytes.all.current", 0)
    t = torch.empty(6 << 20, dtype=torch.uint8, device="cuda")
    after = torch.cuda.memory_stats()
    grew = after.get("allocated_bytes.all.current", 0) - base
    if grew != 6 << 20:
        problems.append(f"allocated_bytes.all.current grew by {grew} B, not {6 << 20}")
    if torch.cuda.memory_allocated() != after.get("allocated_bytes.all.current"):
        problems.append("memory_allocated() disagrees with memory_stats()")
    if torch.cuda.memory_reserved() != after.get("reserved_bytes.all.current") or \
            after.get("reserved_bytes.all.current", 0) < after.get("allocated_bytes.all.current", 0):
        problems.append("reserved bytes inconsistent (memory_reserved() vs memory_stats(), or below allocated)")
    snap = torch.cuda.memory._snapshot()
    block = block_at(snap, t.data_ptr())
    state = block["state"] if block else "absent"
    if state != "active_allocated":
        problems.append(f"the tensor's block is {state} in _snapshot()")
    if not all("segment_pool_id" in seg for seg in snap["segments"]):
        problems.append("a segment without segment_pool_id")
    if "PyTorch CUDA memory summary" not in torch.cuda.memory_summary():
        problems.append("memory_summary() has no summary header")
    del t
    back = torch.cuda.memory_allocated() == base
    if not back:
        problems.append(f"memory_allocated() {torch.cuda.memory_allocated()} after del, not {base}")
    torch.cuda.reset_peak_memory_stats()
    reset = torch.cuda.memory_stats()
    if reset.get("allocated_bytes.all.peak") != reset.get("allocated_bytes.all.current"):
        problems.append("reset_peak_memory_stats() left allocated peak above current")

    # torch's own history recorder: the allocation's frames name the function that made it.
    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        on = torch._C._cuda_isHistoryEnabled()
        u = _allocate_for_history_check(torch, "cuda")
        ptr = u.data_ptr()
        snap = torch.cuda.memory._snapshot()
        block = block_at(snap, ptr) or {}
        frames = block.get("frames") or []
        named = _allocate_for_history_check.__name__ in frame_names(frames)
        cpp = sum(is_cpp_frame(f) for f in frames)
        traced = any(e.get("action") == "alloc" and e.get("addr") == ptr
                     and _allocate_for_history_check.__name__ in frame_names(e.get("frames"))
                     for trace in snap.get("device_traces", []) for e in trace)
        del u
    finally:
        torch.cuda.memory._record_memory_history(None)
    off = not torch._C._cuda_isHistoryEnabled()
    v = _allocate_for_history_check(torch, "cuda")
    off_block = block_at(torch.cuda.memory._snapshot(), v.data_ptr())
    off_frames = len(off_block.get("frames") or []) if off_block else -1
    del v
    if not on:
        problems.append("_cuda_isHistoryEnabled() false while recording")
    if not named:
        problems.append(f"the block's {len(frames)} frame(s) do not name {_allocate_for_history_check.__name__}")
    if not traced:
        problems.append("no alloc trace entry at the tensor's address naming the function")
    if not off:
        problems.append("_record_memory_history(None) left history on")
    if off_frames != 0:
        problems.append(f"a block allocated after recording stopped has {off_frames} frame(s) (-1: no block)")
    detail = (f"{len(stats)} keys, grew {grew} B, state {state}; history: {len(frames)} frame(s) "
              f"({cpp} C++), function named {named}, alloc traced {traced}, off {off}")
    return not problems, detail + ("" if not problems else "; PROBLEMS: " + "; ".join(problems))


def check_mempool_use_mem_pool(torch, ctx: Ctx) -> Tuple[bool, str]:
    if ctx.device != "cuda":
        raise Skip("needs CUDA")
    problems = []
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    pool = torch.cuda.MemPool()
    pool_id = tuple(pool.id)
    uses = [pool.use_count()]
    sizes = (4 << 10, 1 << 20, 8 << 20, 64 << 20)
    with torch.cuda.use_mem_pool(pool):
        uses.append(pool.use_count())
        tensors = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
    uses.append(pool.use_count())
    outside = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    [x.fill_(1) for x in tensors]
    snap = torch.cuda.memory._snapshot()
    in_pool = [pool_of(snap, x.data_ptr()) == pool_id for x in tensors]
    outside_pool = pool_of(snap, outside.data_ptr())
    pool_segments = [seg for seg in snap["segments"] if tuple(seg["segment_pool_id"]) == pool_id]
    pool_bytes = sum(seg["total_size"] for seg in pool_segments)
    own = pool.snapshot()
    only_pool = len(own) == len(pool_segments) and all(tuple(seg["segment_pool_id"]) == pool_id for seg in own)
    during = torch.cuda.memory_reserved()
    del tensors, outside
    del pool
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    left = [seg for seg in torch.cuda.memory._snapshot()["segments"] if tuple(seg["segment_pool_id"]) == pool_id]
    if uses != [1, 2, 1]:
        problems.append(f"use_count() {uses}, not [1, 2, 1] (before, inside, after use_mem_pool)")
    if not all(in_pool):
        problems.append(f"tensors in the pool's segments: {in_pool}")
    if outside_pool == pool_id:
        problems.append("a tensor allocated outside use_mem_pool is in the pool")
    if pool_bytes < sum(sizes):
        problems.append(f"the pool's segments hold {pool_bytes} B < {sum(sizes)} B allocated in it")
    if not only_pool:
        problems.append(f"pool.snapshot() has {len(own)} segment(s), the pool {len(pool_segments)}")
    if left:
        problems.append(f"{len(left)} segment(s) of the deleted pool survived empty_cache()")
    if after > during - pool_bytes:
        problems.append(f"memory_reserved() {during} -> {after} B did not drop by the pool's {pool_bytes} B")
    detail = (f"pool {pool_id}, use_count {uses}, {len(pool_segments)} segment(s) {pool_bytes} B; "
              f"reserved {during} -> {after} B after del + empty_cache")
    return not problems, detail + ("" if not problems else "; PROBLEMS: " + "; ".join(problems))


def check_cudnn_benchmark(torch, ctx: Ctx) -> Tuple[bool, str]:
    if ctx.device == "cuda" and not torch.backends.cudnn.is_available():
        raise Skip("cuDNN is not available to this torch")
    nn = torch.nn
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU()).to(ctx.device).eval()
    x = torch.randn(8, 3, 224, 224, device=ctx.device)
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cudnn.allow_tf32 = False
        with torch.no_grad():
            torch.backends.cudnn.benchmark = False
            ref = net(x)
            torch.backends.cudnn.benchmark = True
            t0 = time.perf_counter()
            first = net(x)
            _sync(torch, ctx)
            t1 = time.perf_counter()
            second = net(x)
            _sync(torch, ctx)
            t2 = time.perf_counter()
        err = max(_relative_error(first, ref), _relative_error(second, ref))
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved
    return err < 1e-3, (f"max relative error vs benchmark=False {err:.1e}; forward with autotuning "
                        f"{t1 - t0:.2f} s, second {t2 - t1:.4f} s")


def _ipc_consumer(use_bucketalloc: bool, conn, done) -> None:
    """The spawned process of check_ipc_share_tensor: reads the shared tensor, changes it in place."""
    info: Dict[str, Any] = {"ok": False}
    try:
        if use_bucketalloc:  # before the tensor arrives: opening its handle initializes CUDA
            import bucketalloc_torch as ba
            ba.enable()
            info["path"] = ba.allocator_path()
        import torch
        if not conn.poll(IPC_TIMEOUT_S):
            raise TimeoutError(f"no tensor from the producer within {IPC_TIMEOUT_S:.0f} s")
        t = conn.recv()
        if t.is_cuda:
            info["backend"] = torch.cuda.get_allocator_backend()
        expected = torch.arange(t.numel(), dtype=t.dtype, device=t.device)
        info["saw_producer_values"] = bool(torch.equal(t, expected))
        t.mul_(2).add_(1)
        if t.is_cuda:
            torch.cuda.synchronize()
        del t, expected
        info["ok"] = True
    except BaseException as e:  # noqa: BLE001 — reported to the parent
        info["error"] = first_line(e)
    conn.send(info)
    done.wait(IPC_TIMEOUT_S)  # the producer keeps its tensor alive until the consumer is done


def check_ipc_share_tensor(torch, ctx: Ctx) -> Tuple[bool, str]:
    import torch.multiprocessing as torch_mp
    mp = torch_mp.get_context("spawn")
    # A Pipe, not a Queue: Connection.send pickles in this thread (torch's reductions call
    # shareIpcHandle), so a failure to share raises here instead of in a Queue's feeder thread.
    conn, child_conn = mp.Pipe()
    done = mp.Event()
    t = torch.arange(IPC_ELEMENTS, dtype=torch.float32, device=ctx.device)
    _sync(torch, ctx)
    proc = mp.Process(target=_ipc_consumer, args=(ctx.mode == "bucketalloc", child_conn, done), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    info: Dict[str, Any] = {}
    try:
        conn.send(t)
        deadline = t0 + IPC_TIMEOUT_S
        while not conn.poll(0.5) and proc.is_alive() and time.perf_counter() < deadline:
            pass
        if conn.poll(0):
            info = conn.recv()
        else:
            info = {"ok": False, "error": f"no answer within {IPC_TIMEOUT_S:.0f} s" if proc.is_alive()
                    else f"the consumer exited (code {proc.exitcode}) without answering"}
        answered = time.perf_counter() - t0
        _sync(torch, ctx)
        seen = bool(torch.equal(t, torch.arange(IPC_ELEMENTS, dtype=torch.float32, device=ctx.device) * 2 + 1))
    finally:
        done.set()
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    del t
    if ctx.device == "cuda":
        torch.cuda.ipc_collect()
    problems = []
    if not info.get("ok"):
        problems.append(f"consumer failed: {info.get('error')}")
    if info.get("ok") and not info.get("saw_producer_values"):
        problems.append("the consumer did not see the producer's values")
    if not seen:
        problems.append("the producer does not see the consumer's in-place change")
    if ctx.mode == "bucketalloc" and info.get("path") != "native":
        problems.append(f"the consumer's allocator_path() is {info.get('path')!r}, not 'native'")
    if proc.exitcode != 0:
        problems.append(f"consumer exit code {proc.exitcode}")
    detail = (f"consumer: path {info.get('path', '-')}, allocator {info.get('backend', '-')}, saw values "
              f"{info.get('saw_producer_values')}; producer sees the change {seen}; answered after {answered:.1f} s")
    return not problems, detail + ("" if not problems else "; PROBLEMS: " + "; ".join(problems))


def compile_unavailable(torch, ctx: Ctx) -> Optional[str]:
    """Why torch.compile's inductor cannot generate GPU kernels here, or None."""
    if ctx.device != "cuda":
        return None  # inductor's C++ backend, for exercising the check without a GPU
    try:
        importlib.import_module("triton")
    except ImportError as e:
        return f"triton is not installed ({e})"
    try:
        from torch.utils._triton import has_triton
    except ImportError as e:
        return f"torch.utils._triton is missing ({e})"
    if not has_triton():
        return "triton is installed but torch says it cannot use it on this GPU (torch.utils._triton.has_triton())"
    # triton builds its CUDA launcher with a C compiler against Python.h (triton/runtime/build.py);
    # without them the first kernel fails with a bare CalledProcessError.
    if not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")):
        return "no C compiler (gcc, clang or $CC), which triton needs to build its CUDA launcher"
    get_scheme = getattr(sysconfig, "get_default_scheme", None)
    scheme = get_scheme() if get_scheme else "posix_prefix"
    include = sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python.h in {include} (the Python headers, e.g. python3-dev), which triton builds against"
    return None


def check_compile_reduce_overhead(torch, ctx: Ctx) -> Tuple[bool, str, Dict[str, Any]]:
    reason = compile_unavailable(torch, ctx)
    if reason:
        raise Skip(f"torch.compile cannot run here: {reason}")
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, dropout=0.0)
    layer = layer.to(ctx.device).eval()

    def block_then_head(x, double: bool):
        y = layer(x)
        torch._dynamo.graph_break()  # two graphs: the second is a child of the first in the cudagraph tree
        return y * 2.0 if double else y + 1.0

    compiled = torch.compile(block_then_head, mode="reduce-overhead")
    counters.clear()
    errors: List[float] = []
    timings: List[float] = []

    def call(double: bool) -> None:
        x = torch.randn(128, 8, 256, device=ctx.device)  # (seq, batch, d_model): batch_first=False
        torch.compiler.cudagraph_mark_step_begin()
        t0 = time.perf_counter()
        y = compiled(x, double)
        _sync(torch, ctx)
        timings.append(time.perf_counter() - t0)
        ref = layer(x)
        ref = ref * 2.0 if double else ref + 1.0
        errors.append((y - ref).abs().max().item())  # before the next replay overwrites y

    recordings = checkpoints = "n/a"
    try:
        with torch.no_grad():
            try:
                call(True)  # compiles, warms up
            except Exception as e:  # noqa: BLE001
                problem = environment_problem(f"{type(e).__name__}: {e}")
                if problem:
                    raise Skip(f"torch.compile cannot run here ({problem}): {first_line(e)}") from e
                raise
            call(True)  # records the graphs
            for _ in range(COMPILE_REPLAYS):
                call(True)
            for _ in range(3):  # the other branch after the break: warm-up, record, replay
                call(False)
        if ctx.device == "cuda":
            from torch._inductor import cudagraph_trees
            manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
            if manager is not None:
                recordings = manager.debug_fail_counter
                checkpoints = manager.debug_checkpointing_counter
        skips = counters["inductor"]["cudagraph_skips"]
    finally:
        compiled = None  # drops the compiled function (a cell of call()) before the reset
        torch._dynamo.reset()  # also resets the cudagraph trees: their pool is given back
        gc.collect()
    err = max(errors)
    replay_s = sum(timings[2:2 + COMPILE_REPLAYS])
    ok = err < 1e-3 and skips == 0
    detail = (f"{len(errors)} calls, max abs error vs eager {err:.1e}; cudagraph skips {skips}, recordings "
              f"{recordings}, allocator checkpoints {checkpoints}; compile + warm-up {timings[0]:.1f} s, "
              f"{COMPILE_REPLAYS} replays {replay_s * 1e3:.2f} ms")
    return ok, detail, {"replay_s": replay_s}


SIDE_BY_SIDE: List[Tuple[str, Callable[..., Any]]] = [
    ("memory_stats_and_snapshot", check_memory_stats_and_snapshot),
    ("mempool_use_mem_pool", check_mempool_use_mem_pool),
    ("cudnn_benchmark", check_cudnn_benchmark),
    ("ipc_share_tensor", check_ipc_share_tensor),
    ("compile_reduce_overhead", check_compile_reduce_overhead),  # last: compiling leaves the most behind
]


def run_side_check(torch, ctx: Ctx, name: str, fn: Callable[..., Any]) -> Dict[str, Any]:
    """Runs one side-by-side check with its peak reserved bytes and wall time."""
    entry: Dict[str, Any] = {"group": "side", "name": name, "ok": False, "skipped": False, "detail": "",
                             "peak_reserved": None, "seconds": None, "extra": {}}
    cuda = ctx.device == "cuda"
    gc.collect()
    try:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    except Exception as e:  # noqa: BLE001
        entry["detail"] = f"could not reset the peak stats: {first_line(e)}"
        return entry
    t0 = time.perf_counter()
    try:
        out = fn(torch, ctx)
        entry["ok"], entry["detail"] = bool(out[0]), out[1]
        if len(out) > 2:
            entry["extra"] = out[2]
    except Skip as e:
        entry["ok"], entry["skipped"], entry["detail"] = True, True, str(e)
    except Exception as e:  # noqa: BLE001 — a failure of the check, reported
        entry["detail"] = first_line(e)
    try:
        if cuda:
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        entry["ok"] = False
        entry["detail"] += f"; synchronize after the check: {first_line(e)}"
    entry["seconds"] = time.perf_counter() - t0
    try:
        if cuda:
            entry["peak_reserved"] = int(torch.cuda.max_memory_reserved())
    except Exception:  # noqa: BLE001 — reported as "-"
        pass
    entry["detail"] = one_line(entry["detail"])
    return entry


# ---- bucketalloc-only checks (the bucketalloc child) ---------------------------------------------


def check_variable_length_workload(torch, ba) -> Tuple[bool, str]:
    gen = torch.Generator().manual_seed(1234)
    weight = torch.randn(256, 256, generator=gen)
    weight_gpu = weight.cuda()
    lengths = [int(v) for v in torch.randint(1, 2048, (40,), generator=gen)]
    worst = 0.0
    for length in lengths:
        x = torch.randn(length, 256, generator=gen)
        ref = torch.softmax(x @ weight, dim=-1)
        got = torch.softmax(x.cuda() @ weight_gpu, dim=-1).cpu()
        worst = max(worst, (got - ref).abs().max().item())
    return worst < 1e-3, f"{len(lengths)} steps, max abs error {worst:.2e}"


def check_stats_follow_a_tensor(torch, ba) -> Tuple[bool, str]:
    torch.cuda.synchronize()
    base = ba.memory_allocated()
    t = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    grew = ba.memory_allocated() - base
    agrees = torch.cuda.memory_stats()["allocated_bytes.all.current"] == ba.memory_allocated()
    states = {b["address"]: b["state"] for s in ba.snapshot()["segments"] for b in s["blocks"]}
    state = states.get(t.data_ptr())
    del t
    back = ba.memory_allocated() == base
    return (grew == 3 << 20 and agrees and back and state == "active_allocated",
            f"grew {grew} B, torch's own memory_stats {'agrees' if agrees else 'DISAGREES'}, back to base {back}, "
            f"snapshot state {state}")


def check_record_stream_defers_reuse(torch, ba) -> Tuple[bool, str]:
    def state_of(ptr):
        for seg in ba.snapshot()["segments"]:
            for b in seg["blocks"]:
                if b["address"] == ptr:
                    return b["state"]
        return "released"

    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    x = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    ptr = x.data_ptr()
    torch.cuda.current_stream().synchronize()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work = big
        for _ in range(50):  # keep the side stream busy for a while
            work = work @ big
            work = work / work.norm()
        x.add_(1)
    x.record_stream(side)
    del x
    busy = not side.query()
    pending = state_of(ptr)
    y = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    reused_while_busy = y.data_ptr() == ptr
    del y  # a free polls the pending blocks
    side.synchronize()
    z = torch.empty(1024, device="cuda")
    del z  # polls again: the side stream is done now
    after = state_of(ptr)
    del big, work
    torch.cuda.synchronize()
    return (busy and pending == "active_pending_free" and not reused_while_busy and after in ("inactive", "released"),
            f"side stream busy at free: {busy}, state while busy: {pending}, reused while busy: {reused_while_busy}, "
            f"state after: {after}")


def check_empty_cache_releases_the_cache(torch, ba) -> Tuple[bool, str]:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    # Live tensors keep their segments and slabs (a 256 KiB tensor keeps its 2 MiB slab, cuBLAS
    # its workspaces), so reserved == active is not the condition: no segment or slab may be left
    # with nothing active in it.
    stats = ba.memory_stats()
    held = stats["reserved_bytes.all.current"] - stats["active_bytes.all.current"]
    idle = [seg for seg in ba.snapshot()["segments"]
            if all(block["state"] not in ("active_allocated", "active_pending_free") for block in seg["blocks"])]
    return not idle, (f"{len(idle)} segment(s)/slab(s) with nothing active survived empty_cache "
                      f"({sum(seg['total_size'] for seg in idle)} B); {held} B reserved beyond active in live segments")


def check_cuda_graph_capture_and_replay(torch, ba) -> Tuple[bool, str]:
    # Warm up and capture on the same side stream (CUDAGraph.capture_begin/capture_end:
    # torch.cuda.graph empties the cache on entry), replay, compare, reset (releases the graph pool).
    s = torch.cuda.Stream()
    a = torch.randn(512, 512, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        for _ in range(3):
            out = torch.relu(a @ a) + 1
        del out
        g.capture_begin()
        out = torch.relu(a @ a) + 1
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    a.copy_(torch.randn(512, 512, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    err = (out - (torch.relu(a @ a) + 1)).abs().max().item()
    del out
    g.reset()
    refusals = ba.memory_stats()["num_capture_refusals"]
    return err < 1e-2 and refusals == 0, f"max abs error {err:.2e}; capture refusals {refusals}"


def check_graphs_sharing_a_pool(torch, ba) -> Tuple[bool, str]:
    # torch.cuda.graph with one private pool shared by two graphs (graph_pool_handle()), as serving
    # engines capture their decode graphs: the second graph reuses the first one's freed blocks.
    pool = torch.cuda.graph_pool_handle()
    x = torch.randn(1024, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm up (cuBLAS workspaces) outside the capture
            torch.relu(x @ w) @ w
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g1, pool=pool):
        y1 = torch.relu(x @ w) @ w  # the intermediate relu(x @ w) is freed inside the capture
    one = ba.memory_reserved()
    with torch.cuda.graph(g2, pool=pool):
        y2 = torch.relu(y1 @ w) @ w
    two = ba.memory_reserved()
    x.copy_(torch.randn(1024, 1024, device="cuda"))
    g1.replay()
    g2.replay()
    torch.cuda.synchronize()
    ref1 = torch.relu(x @ w) @ w
    ref2 = torch.relu(ref1 @ w) @ w
    err = max((y1 - ref1).abs().max().item() / ref1.abs().max().item(),
              (y2 - ref2).abs().max().item() / ref2.abs().max().item())
    g1.reset()  # one graph gone; the other still replays into the shared pool
    eager = [torch.empty(4 << 20, device="cuda") for _ in range(8)]
    for e in eager:
        e.fill_(7.0)
    g2.replay()
    torch.cuda.synchronize()
    err2 = (y2 - torch.relu(y1 @ w) @ w).abs().max().item() / ref2.abs().max().item()
    del eager, y1, y2
    g2.reset()
    return (err < 1e-3 and err2 < 1e-3 and two - one <= (one // 4),
            f"relative error {err:.1e} / after reset {err2:.1e}; reserved after graph 1 {one} B, after graph 2 {two} B")


def check_make_graphed_callables(torch, ba) -> Tuple[bool, str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)).cuda()
    sample = torch.randn(32, 256, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    inp = torch.randn(32, 256, device="cuda", requires_grad=True)
    out = graphed(inp)
    out.sum().backward()
    graphed_grad = inp.grad.clone()
    inp.grad = None
    ref = model(inp)
    ref.sum().backward()
    err = max((out - ref).abs().max().item(), (graphed_grad - inp.grad).abs().max().item())
    return err < 1e-3, f"max abs error {err:.1e}"


def check_memory_viz_reads_the_snapshot(torch, ba) -> Tuple[bool, str]:
    # torch's own history and dump, served by the native path; PyTorch's memory_viz reads the pickle.
    keep = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=10000)
    outputs = []
    ok = True
    try:
        tmp = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        del tmp
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snapshot.pickle")
            torch.cuda.memory._dump_snapshot(path)
            for command in ("stats", "trace"):
                proc = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", command, path],
                                      capture_output=True, text=True, timeout=60)
                ok = ok and proc.returncode == 0
                text = (proc.stdout or proc.stderr).strip().splitlines()
                outputs.append(f"{command}: exit {proc.returncode} {text[-1][:120] if text else ''}")
    finally:
        torch.cuda.memory._record_memory_history(None)
    del keep
    return ok, "; ".join(outputs)


def check_oom_raises_torch_out_of_memory_error(torch, ba) -> Tuple[bool, str]:
    # An impossible request raises torch's own OOM type, with torch's message first, then our report;
    # torch's OOM observers are told.
    seen: List[Tuple[int, int]] = []
    torch._C._cuda_attach_out_of_memory_observer(
        lambda device, alloc, device_allocated, device_free: seen.append((device, alloc)))
    try:
        torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
        return False, "a 64 TiB tensor was allocated"
    except torch.cuda.OutOfMemoryError as e:
        text = str(e)
        ok = text.startswith("CUDA out of memory. Tried to allocate") and "bucketalloc: out of memory" in text
        return ok and bool(seen), f"{text.splitlines()[0][:160]}; OOM observer calls {seen[:2]}"
    except RuntimeError as e:
        return False, f"a {type(e).__name__}, not torch.cuda.OutOfMemoryError: {str(e).splitlines()[0][:160]}"


def check_accelerate_finds_a_batch_size(torch, ba) -> Tuple[bool, str]:
    # accelerate's batch-size search under a cap: shrinks the batch after each OOM until it fits.
    try:
        from accelerate.utils import find_executable_batch_size
    except ImportError:
        raise Skip("accelerate is not installed here") from None
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((4 << 30) / total)  # a 4 GiB cap
    tried = []

    @find_executable_batch_size(starting_batch_size=128)
    def step(batch_size):
        tried.append(batch_size)
        t = torch.empty(batch_size * (256 << 20), dtype=torch.uint8, device="cuda")  # 256 MiB per sample
        del t
        return batch_size

    try:
        found = step()
        return found * (256 << 20) < (4 << 30) and len(tried) > 1, f"tried {tried}, found {found}"
    except Exception as e:  # noqa: BLE001
        return False, f"tried {tried}: {first_line(e, 160)}"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def check_invariants_hold(torch, ba) -> Tuple[bool, str]:
    ba.check_invariants()
    return True, ""


def ipc_expandable_producer() -> int:
    """--ipc-expandable: a process whose bucketalloc uses expandable (vmm) segments shares a tensor
    with a spawned consumer (which inherits the configuration), as check_ipc_share_tensor does."""
    import bucketalloc_torch as ba
    ba.enable()
    import torch
    torch.cuda.init()
    probe = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    expandable = [s.get("is_expandable") for s in torch.cuda.memory._snapshot()["segments"]
                  if s["address"] <= probe.data_ptr() < s["address"] + s["total_size"]]
    del probe
    ok, detail = check_ipc_share_tensor(torch, Ctx("bucketalloc"))
    print("IPC " + json.dumps({"ok": ok and expandable == [True], "detail": f"segment expandable {expandable}; {detail}"}),
          flush=True)
    return 0


def check_ipc_share_expandable_segment(torch, ba) -> Tuple[bool, str]:
    # Configurations are fixed at creation: a process of its own, with expandable segments.
    env = dict(os.environ, BUCKETALLOC_CONF="expandable_segments:True")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--ipc-expandable"], env=env, text=True,
                          capture_output=True, timeout=IPC_TIMEOUT_S + 60)
    for line in proc.stdout.splitlines():
        if line.startswith("IPC "):
            result = json.loads(line[4:])
            return bool(result["ok"]), result["detail"]
    return False, f"the producer exited with {proc.returncode}: {one_line(proc.stderr)[-400:]}"


BUCKETALLOC_ONLY: List[Tuple[str, Callable[..., Any]]] = [
    ("ipc_share_expandable_segment", check_ipc_share_expandable_segment),
    ("variable_length_workload_matches_cpu", check_variable_length_workload),
    ("stats_follow_a_tensor", check_stats_follow_a_tensor),
    ("record_stream_defers_reuse", check_record_stream_defers_reuse),
    ("empty_cache_releases_the_cache", check_empty_cache_releases_the_cache),
    ("cuda_graph_capture_and_replay", check_cuda_graph_capture_and_replay),
    ("graphs_sharing_a_pool", check_graphs_sharing_a_pool),
    ("make_graphed_callables", check_make_graphed_callables),
    ("memory_viz_reads_the_snapshot", check_memory_viz_reads_the_snapshot),
    ("oom_raises_torch_out_of_memory_error", check_oom_raises_torch_out_of_memory_error),
    ("accelerate_finds_a_batch_size", check_accelerate_finds_a_batch_size),
    ("invariants_hold", check_invariants_hold),
]


def run_plain_check(name: str, fn: Callable[..., Any], *args: Any) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"group": "bucketalloc", "name": name, "ok": False, "skipped": False, "detail": ""}
    t0 = time.perf_counter()
    try:
        ok, detail = fn(*args)
        entry["ok"], entry["detail"] = bool(ok), detail
    except Skip as e:
        entry["ok"], entry["skipped"], entry["detail"] = True, True, str(e)
    except Exception as e:  # noqa: BLE001
        entry["detail"] = first_line(e)
    entry["seconds"] = time.perf_counter() - t0
    entry["detail"] = one_line(entry["detail"])
    return entry


# ---- the child ----------------------------------------------------------------------------------


def emit(entry: Dict[str, Any]) -> Dict[str, Any]:
    print("CHECK " + json.dumps(entry), flush=True)
    return entry


def child(mode: str) -> None:
    result: Dict[str, Any] = {"mode": mode, "checks": []}
    ba = None
    native_path = True
    if mode == "bucketalloc":
        import warnings
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import bucketalloc_torch as ba
            ba.enable()  # no patch_torch: on the native path torch's own functions serve
        enable_s = time.perf_counter() - t0
        path = ba.allocator_path()
        import torch
        backend = torch.cuda.get_allocator_backend()
        native_path = path == "native"
        why = "; ".join(one_line(str(w.message))[:300] for w in caught if "bucketalloc" in str(w.message))
        print(f"bucketalloc_torch.allocator_path() = {path!r}; torch.cuda.get_allocator_backend() = {backend!r}",
              flush=True)
        result["checks"].append(emit({
            "group": "setup", "name": "allocator_path", "ok": native_path and backend == "bucketalloc",
            "skipped": False,
            "detail": f"{path} (torch's allocator names itself {backend!r}; enable() took {enable_s:.1f} s)"
                      + (f"; enable() warned: {why}" if why else ""),
        }))
    import torch
    torch.cuda.init()
    result.update(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                  allocator=torch.cuda.get_allocator_backend())
    ctx = Ctx(mode)
    for name, fn in SIDE_BY_SIDE:
        if not native_path:
            entry = {"group": "side", "name": name, "ok": False, "skipped": False, "peak_reserved": None,
                     "seconds": None, "extra": {},
                     "detail": "not run: bucketalloc is on the pluggable path, where torch's own functions fail"}
        else:
            entry = run_side_check(torch, ctx, name, fn)
        result["checks"].append(emit(entry))
    if mode == "bucketalloc":
        for name, fn in BUCKETALLOC_ONLY:
            result["checks"].append(emit(run_plain_check(name, fn, torch, ba)))
    result["latency_ns"] = latency_ns(torch)
    print("RESULT " + json.dumps(result), flush=True)


# ---- the driver ---------------------------------------------------------------------------------


class ChildRun(NamedTuple):
    returncode: Optional[int]  # None: killed at its time limit
    stdout: str
    stderr: str
    seconds: float


def run_command(argv: List[str], timeout_s: float, env: Dict[str, str]) -> ChildRun:
    """Runs `argv` in its own session; output goes to files, so that a descendant still holding them
    (a compile worker) cannot keep the driver waiting. At the limit, the child and whatever it
    started (its process group, while the child is still there to own it) are killed."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, text=True, start_new_session=True)
        try:
            code: Optional[int] = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            code = None
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        return ChildRun(code, out.read(), err.read(), time.perf_counter() - t0)


def run_child(mode: str, timeout_s: float, env: Dict[str, str]) -> ChildRun:
    return run_command([sys.executable, os.path.abspath(__file__), "--child", mode], timeout_s, env)


def parse_child_output(stdout: str) -> Tuple[Dict[str, Dict[str, Any]], Optional[Dict[str, Any]]]:
    """The CHECK entries by name, and the RESULT (None when the child did not get that far)."""
    checks: Dict[str, Dict[str, Any]] = {}
    result = None
    for line in stdout.splitlines():
        try:
            if line.startswith("CHECK "):
                entry = json.loads(line[len("CHECK "):])
                checks[entry["name"]] = entry
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        except (ValueError, KeyError):
            continue
    return checks, result


def status_of(entry: Optional[Dict[str, Any]]) -> str:
    if entry is None or not entry.get("ok"):
        return "FAIL"
    return "SKIP" if entry.get("skipped") else "PASS"


def combine_side(name: str, ours: Optional[Dict[str, Any]], theirs: Optional[Dict[str, Any]]) -> Tuple[str, str]:
    """The status and the report line of a side-by-side check: FAIL when either side failed or did not
    run, SKIP when either side could not run it here, else PASS."""
    statuses = [status_of(ours), status_of(theirs)]
    status = "FAIL" if "FAIL" in statuses else ("SKIP" if "SKIP" in statuses else "PASS")
    parts = []
    for label, entry, st in (("bucketalloc", ours, statuses[0]), ("torch", theirs, statuses[1])):
        detail = "did not run (the process ended before it)" if entry is None else entry.get("detail", "")
        parts.append(f"{label} {st}: {detail}")
    return status, f"check {name}: {status} " + " | ".join(parts)


def format_side_table(ours: Dict[str, Dict[str, Any]], theirs: Dict[str, Dict[str, Any]]) -> List[str]:
    rows = [("check", "bucketalloc peak reserved", "torch peak reserved", "bucketalloc time", "torch time")]
    for name, _ in SIDE_BY_SIDE:
        a, b = ours.get(name) or {}, theirs.get(name) or {}
        rows.append((name, fmt_bytes(a.get("peak_reserved")), fmt_bytes(b.get("peak_reserved")),
                     fmt_seconds(a.get("seconds")), fmt_seconds(b.get("seconds"))))
        if name == "compile_reduce_overhead":
            rows.append(("  (replays only)", "-", "-", fmt_seconds((a.get("extra") or {}).get("replay_s")),
                         fmt_seconds((b.get("extra") or {}).get("replay_s"))))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(widths[i]) for i, cell in enumerate(row) if i]
        lines.append("| " + " | ".join(cells) + " |")
        if k == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return lines


def child_env() -> Tuple[Dict[str, str], Optional[str]]:
    """The children's environment, and the inductor cache directory made for this run (to remove)."""
    env = os.environ.copy()
    env.setdefault("TORCH_SYMBOLIZE_MODE", "dladdr")
    made = None
    if "TORCHINDUCTOR_CACHE_DIR" not in env:
        made = tempfile.mkdtemp(prefix="gpu_torch_check_inductor.")
        env["TORCHINDUCTOR_CACHE_DIR"] = made
    return env, made


def driver(run: Callable[[str, float, Dict[str, str]], ChildRun] = run_child,
           budget_s: Optional[float] = None) -> int:
    budget = budget_s if budget_s is not None else float(os.environ.get("GPU_TORCH_CHECK_BUDGET_S", DEFAULT_BUDGET_S))
    start = time.perf_counter()
    env, made = child_env()
    checks: Dict[str, Dict[str, Dict[str, Any]]] = {}
    results: Dict[str, Optional[Dict[str, Any]]] = {}
    failed = skipped = 0
    try:
        for mode in MODES:
            left = budget - (time.perf_counter() - start)
            limit = left - NATIVE_RESERVE_S if mode == "bucketalloc" else left
            limit = max(limit, 10.0)
            child_run = run(mode, limit, env)
            checks[mode], results[mode] = parse_child_output(child_run.stdout)
            print(f"{LABEL[mode]} process: {child_run.seconds:.1f} s, "
                  + ("exit 0" if child_run.returncode == 0 else
                     f"KILLED at its {limit:.0f} s limit" if child_run.returncode is None else
                     f"exit {child_run.returncode}"), flush=True)
            if child_run.stderr.strip():  # warnings, and the traceback of a failed child
                print("  its stderr (the last 4000 characters):\n    "
                      + "\n    ".join(child_run.stderr[-4000:].strip().splitlines()))
            if child_run.returncode != 0 or results[mode] is None:
                failed += 1
                own = [line for line in child_run.stdout.strip().splitlines() if not line.startswith("CHECK ")]
                tail = "\n    ".join(own[-15:]) or "(nothing)"
                why = "ran out of time" if child_run.returncode is None else f"exit {child_run.returncode}"
                print(f"check {mode}_process: FAIL {why}, no RESULT line; its last output besides CHECK lines:\n"
                      f"    {tail}")
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)
    ours, theirs = checks["bucketalloc"], checks["native"]

    print()
    setup = ours.get("allocator_path")
    print(f"check allocator_path: {status_of(setup)} "
          + (setup["detail"] if setup else "not reported (the bucketalloc process ended before enable() returned)"))
    failed += status_of(setup) == "FAIL"
    for name, _ in SIDE_BY_SIDE:
        status, line = combine_side(name, ours.get(name), theirs.get(name))
        print(line)
        failed += status == "FAIL"
        if status == "SKIP":
            skipped += 1
            print(f"!!! SKIPPED {name}: it did not run on this machine, so it checks nothing here; "
                  "see the reason above")
    for name, _ in BUCKETALLOC_ONLY:
        entry = ours.get(name)
        status = status_of(entry)
        print(f"check {name}: {status} "
              + (entry["detail"] if entry else "did not run (the bucketalloc process ended before it)"))
        failed += status == "FAIL"
        skipped += status == "SKIP"

    nat, ba_result = results.get("native"), results.get("bucketalloc")
    about = nat or ba_result
    if about:
        print(f"\ntorch {about['torch']} on {about['device']}; allocators: "
              f"{(ba_result or {}).get('allocator', '-')} vs {(nat or {}).get('allocator', '-')}")
    if nat and ba_result:
        print("torch.empty/del latency, ns per pair (best of %d x %d):" % (REPEATS, PAIRS))
        print(f"{'bytes':>10} {'native':>10} {'bucketalloc':>12} {'ratio':>7}")
        for n in SIZES:
            native_ns = nat["latency_ns"][str(n)]
            ours_ns = ba_result["latency_ns"][str(n)]
            print(f"{n:>10} {native_ns:>10.1f} {ours_ns:>12.1f} {ours_ns / native_ns:>7.2f}")
        print("target: ratio <= 1.10 (reported, not enforced)")

    print("\nside by side (peak reserved: torch.cuda.max_memory_reserved() after empty_cache() and "
          "reset_peak_memory_stats(); time: the check's wall time; compile_reduce_overhead's includes "
          "compiling, cold in the bucketalloc process and from the warm cache in torch's):")
    for line in format_side_table(ours, theirs):
        print(line)
    print(f"gpu_torch_check: {failed} check(s) failed, {skipped} skipped")
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=MODES, help="run one process's checks and print JSON lines")
    parser.add_argument("--ipc-expandable", action="store_true",
                        help="share a tensor of an expandable segment with a spawned process (one check's producer)")
    args = parser.parse_args(argv)
    if args.ipc_expandable:
        return ipc_expandable_producer()
    if args.child:
        child(args.child)
        return 0
    return driver()


if __name__ == "__main__":
    sys.exit(main())
