#!/usr/bin/env python3
"""scripts/gpu_torch_check.py — the PyTorch section of scripts/gpu_check.sh (needs torch and a GPU).

Runs two fresh processes in one run and compares them:
  * bucketalloc: bucketalloc_torch.enable(patch_torch=True), then
      - a variable-length workload (a seeded list of sequence lengths; embedding-like matmuls and a
        softmax per step) whose results must equal a CPU reference within float tolerance;
      - our stats: memory_allocated() grows by a tensor's size and returns after `del`; the patched
        torch.cuda.memory_stats() is ours; snapshot() lists the live tensor as active_allocated;
      - record_stream: a block used on a busy side stream is pending (snapshot state) and not handed
        out again while that stream runs, and is free once it has finished;
      - empty_cache: torch.cuda.empty_cache() releases everything cached;
      - CUDA graphs: warm up on a side stream, capture on it (CUDAGraph.capture_begin/capture_end,
        which call bucketalloc's graph-pool hooks), replay, compare, reset;
      - torch.cuda.graph with one graph_pool_handle() shared by two graphs: both replay correctly,
        the second costs no new memory, and resetting the first leaves the second correct;
      - torch.cuda.make_graphed_callables on a small MLP, forward and backward against eager;
      - torch/cuda/_memory_viz.py reads dump_snapshot()'s pickle (stats and trace);
      - an impossible request raises torch.cuda.OutOfMemoryError whose message begins as torch's
        and carries bucketalloc's report;
      - accelerate.find_executable_batch_size shrinks the batch until it fits under a cap set with
        torch.cuda.set_per_process_memory_fraction (SKIP when accelerate is not installed);
      - the latency loop below.
  * native: PyTorch's own caching allocator, the same latency loop.
The latency loop: `torch.empty(n, dtype=uint8, device="cuda")` then `del` (a cache hit after the
first), for n in 4 KiB, 256 KiB, 2 MiB and 64 MiB, best of 5 repetitions of 20000 pairs each,
in nanoseconds per pair. Target (issue 3): bucketalloc within 1.1x of native.

Prints one line per check ("check <name>: PASS|FAIL|SKIP <detail>"), the latency table, and exits
non-zero when a check failed. The latency target is reported, not enforced (a benchmark, not a test).

Usage: python3 scripts/gpu_torch_check.py            (the driver: runs both processes)
       python3 scripts/gpu_torch_check.py --child bucketalloc|native   (one process; prints JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SIZES = [4 << 10, 256 << 10, 2 << 20, 64 << 20]
PAIRS = 20000
REPEATS = 5


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


def checks_bucketalloc(torch, ba) -> list:
    results = []

    def check(name, ok, detail="", skipped=False):
        results.append({"name": name, "ok": bool(ok) or skipped, "skipped": skipped, "detail": detail})

    # Variable-length workload against a CPU reference.
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
    check("variable_length_workload_matches_cpu", worst < 1e-3, f"{len(lengths)} steps, max abs error {worst:.2e}")

    # Stats follow a tensor.
    torch.cuda.synchronize()
    base = ba.memory_allocated()
    t = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    grew = ba.memory_allocated() - base
    patched = torch.cuda.memory_stats()["allocated_bytes.all.current"] == ba.memory_allocated()
    states = {b["address"]: b["state"] for s in ba.snapshot()["segments"] for b in s["blocks"]}
    state = states.get(t.data_ptr())
    del t
    back = ba.memory_allocated() == base
    check("stats_follow_a_tensor", grew == 3 << 20 and patched and back and state == "active_allocated",
          f"grew {grew} B, patched memory_stats {'ours' if patched else 'NOT ours'}, back to base {back}, "
          f"snapshot state {state}")

    # record_stream: no reuse while the side stream still runs; reusable once it is done.
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
    check("record_stream_defers_reuse",
          busy and pending == "active_pending_free" and not reused_while_busy and after in ("inactive", "released"),
          f"side stream busy at free: {busy}, state while busy: {pending}, reused while busy: {reused_while_busy}, "
          f"state after: {after}")

    # empty_cache releases what is cached.
    del big, work
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    # Live tensors keep their segments and slabs (a 256 KiB tensor keeps its 2 MiB slab, cuBLAS
    # its workspaces), so reserved == active is not the condition: no segment or slab may be left
    # with nothing active in it.
    stats = ba.memory_stats()
    held = stats["reserved_bytes.all.current"] - stats["active_bytes.all.current"]
    idle = [seg for seg in ba.snapshot()["segments"]
            if all(block["state"] not in ("active_allocated", "active_pending_free") for block in seg["blocks"])]
    check("empty_cache_releases_the_cache", not idle,
          f"{len(idle)} segment(s)/slab(s) with nothing active survived empty_cache "
          f"({sum(seg['total_size'] for seg in idle)} B); {held} B reserved beyond active in live segments")

    # CUDA graphs: warm up and capture on the same side stream (CUDAGraph.capture_begin/capture_end:
    # torch.cuda.graph empties the cache on entry), replay, compare, reset (releases the graph pool).
    try:
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
        check("cuda_graph_capture_and_replay", err < 1e-2 and refusals == 0,
              f"max abs error {err:.2e}; capture refusals {refusals}")
    except Exception as e:  # noqa: BLE001 — report the failure as a check
        check("cuda_graph_capture_and_replay", False, f"{type(e).__name__}: {str(e).splitlines()[0]}")

    # torch.cuda.graph with one private pool shared by two graphs (graph_pool_handle()), as serving
    # engines capture their decode graphs: the second graph reuses the first one's freed blocks.
    try:
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
        del eager
        g2.reset()
        check("graphs_sharing_a_pool", err < 1e-3 and err2 < 1e-3 and two - one <= (one // 4),
              f"relative error {err:.1e} / after reset {err2:.1e}; reserved after graph 1 {one} B, after graph 2 "
              f"{two} B")
        del y1, y2
    except Exception as e:  # noqa: BLE001
        check("graphs_sharing_a_pool", False, f"{type(e).__name__}: {str(e).splitlines()[0]}")

    # make_graphed_callables: forward and backward graphs of a module, against eager.
    try:
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
        check("make_graphed_callables", err < 1e-3, f"max abs error {err:.1e}")
        del model, graphed, out, ref, inp, sample
    except Exception as e:  # noqa: BLE001
        check("make_graphed_callables", False, f"{type(e).__name__}: {str(e).splitlines()[0]}")

    # PyTorch's memory_viz reads our snapshot.
    import tempfile
    keep = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
    ba.record_memory_history("all", 10000)
    tmp = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    del tmp
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snapshot.pickle")
        ba.dump_snapshot(path)
        outputs = []
        ok = True
        for command in ("stats", "trace"):
            proc = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", command, path],
                                  capture_output=True, text=True, timeout=120)
            ok = ok and proc.returncode == 0
            outputs.append(f"{command}: exit {proc.returncode} "
                           f"{(proc.stdout or proc.stderr).strip().splitlines()[-1:] if (proc.stdout or proc.stderr) else ''}")
    ba.record_memory_history(None)
    del keep
    check("memory_viz_reads_the_snapshot", ok, "; ".join(outputs))

    # An impossible request raises torch's own OOM type, with torch's message first, then our report.
    try:
        torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
        check("oom_raises_torch_out_of_memory_error", False, "a 64 TiB tensor was allocated")
    except torch.cuda.OutOfMemoryError as e:
        text = str(e)
        check("oom_raises_torch_out_of_memory_error",
              text.startswith("CUDA out of memory. Tried to allocate") and "bucketalloc: out of memory" in text,
              text.splitlines()[0][:200])
    except RuntimeError as e:
        check("oom_raises_torch_out_of_memory_error", False, f"a {type(e).__name__}: {str(e).splitlines()[0][:160]}")

    # accelerate's batch-size search under a cap: shrinks the batch after each OOM until it fits.
    try:
        from accelerate.utils import find_executable_batch_size
    except ImportError:
        check("accelerate_finds_a_batch_size", True, "accelerate is not installed here", skipped=True)
    else:
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
            check("accelerate_finds_a_batch_size", found * (256 << 20) < (4 << 30) and len(tried) > 1,
                  f"tried {tried}, found {found}")
        except Exception as e:  # noqa: BLE001
            check("accelerate_finds_a_batch_size", False, f"tried {tried}: {type(e).__name__}: {str(e)[:160]}")
        torch.cuda.set_per_process_memory_fraction(1.0)

    try:
        ba.check_invariants()
        check("invariants_hold", True)
    except Exception as e:  # noqa: BLE001
        check("invariants_hold", False, str(e)[:200])
    return results


def child(mode: str) -> None:
    if mode == "bucketalloc":
        import bucketalloc_torch as ba
        ba.enable(patch_torch=True)
    import torch
    torch.cuda.init()
    result = {"mode": mode, "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if mode == "bucketalloc":
        result["checks"] = checks_bucketalloc(torch, ba)
    result["latency_ns"] = latency_ns(torch)
    print("RESULT " + json.dumps(result), flush=True)


def driver() -> int:
    results = {}
    for mode in ("bucketalloc", "native"):
        proc = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True,
                              env=os.environ.copy(), timeout=600)
        sys.stderr.write(proc.stderr[-4000:])
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(f"check {mode}_process: FAIL exit {proc.returncode}\n{proc.stdout[-2000:]}")
            return 1
        results[mode] = json.loads(line[len("RESULT "):])
    failed = 0
    for c in results["bucketalloc"]["checks"]:
        status = "SKIP" if c.get("skipped") else ("PASS" if c["ok"] else "FAIL")
        print(f"check {c['name']}: {status} {c['detail']}")
        failed += not c["ok"]
    print(f"\ntorch {results['native']['torch']} on {results['native']['device']}")
    print("torch.empty/del latency, ns per pair (best of %d x %d):" % (REPEATS, PAIRS))
    print(f"{'bytes':>10} {'native':>10} {'bucketalloc':>12} {'ratio':>7}")
    for n in SIZES:
        nat = results["native"]["latency_ns"][str(n)]
        ours = results["bucketalloc"]["latency_ns"][str(n)]
        print(f"{n:>10} {nat:>10.1f} {ours:>12.1f} {ours / nat:>7.2f}")
    print("target: ratio <= 1.10 (reported, not enforced)")
    print(f"gpu_torch_check: {failed} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=["bucketalloc", "native"])
    args = parser.parse_args()
    if args.child:
        child(args.child)
    else:
        sys.exit(driver())
