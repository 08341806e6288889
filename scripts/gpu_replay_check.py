#!/usr/bin/env python3
"""scripts/gpu_replay_check.py — replays one allocation trace through real PyTorch on a GPU and
checks the harness's model of PyTorch against it (a step of scripts/gpu_check.sh; issue 5).

Replays TRACE (RMM replay-log CSV, e.g. from `bucketalloc-bench generate serving`) in file order
with `torch.empty(size, dtype=uint8, device="cuda")` for each allocate and `del` for each free, in a
fresh process per allocator:
  native             PyTorch's caching allocator, default settings
  expandable         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cudaMallocAsync    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  bucketalloc        bucketalloc_torch.enable() (libbucketalloc.so), default options
and reports each one's peak reserved bytes (torch.cuda.max_memory_reserved, or bucketalloc's own
stats), OOMs, and wall time per operation. Then it runs
`bucketalloc-bench replay TRACE --allocator pytorch-policy` on the simulated device and checks that
its peak reserved is within 5% of native PyTorch's: the harness's pytorch-policy must predict the
real allocator (target of issue 5). It also runs `bucketalloc-bench replay --device cuda` for
bucketalloc and nocache (the harness on cudaMalloc) and checks that each one's peak reserved equals
its replay on the simulated device: the policies do not depend on the addresses a device returns.
The other figures are reported, not enforced.

With --vmm (issue 6; no PyTorch needed) it checks virtual-memory stitching on the GPU instead:
`bucketalloc-bench min-capacity TRACE --allocator bucketalloc:backend:vmm` on the simulated device
finds the tight card, the smallest on which stitching serves the trace; then bucketalloc and
bucketalloc:backend:vmm are replayed on that card and on --capacity, each with --device sim and
--device cuda (cuMemCreate/cuMemMap on the GPU). Enforced: each cuda replay matches its simulated
twin (peak reserved, OOMs, granules stitched), and bucketalloc:backend:vmm has no OOM on either card
and stitches granules on the GPU on the tight one. Plain bucketalloc's OOMs on the tight card (what
stitching saves) are reported.
(cudaMallocAsync's max_memory_reserved is the pool's reserved high-water mark as PyTorch reports it.)
It also calibrates the harness's cost model: with PYTORCH_NO_CUDA_MEMORY_CACHING=1 every torch.empty
is a cudaMalloc and every del a cudaFree, timed separately for 2 MiB, 20 MiB and 1 GiB (median of 50),
to compare with the defaults --malloc-us 50 and --free-us 10.

Usage: python3 scripts/gpu_replay_check.py TRACE --bench PATH/bucketalloc-bench [--capacity 130GiB]
       python3 scripts/gpu_replay_check.py TRACE --bench PATH/bucketalloc-bench --vmm [--capacity 130GiB]
       python3 scripts/gpu_replay_check.py --child NAME TRACE   (one replay; prints JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ALLOC_CONF = {
    "native": None,
    "expandable": "expandable_segments:True",
    "cudaMallocAsync": "backend:cudaMallocAsync",
    "bucketalloc": None,
}
TOLERANCE = 0.05
VMM = "bucketalloc:backend:vmm"


def read_trace(path):
    """(is_allocate, pointer, size) per line; 'allocate failure' lines are skipped, as the harness does."""
    events = []
    with open(path) as f:
        header = f.readline().strip()
        if header != "Thread,Time,Action,Pointer,Size,Stream":
            raise SystemExit(f"{path}: not an RMM replay-log CSV (header {header!r})")
        for number, line in enumerate(f, start=2):
            fields = line.rstrip("\n").split(",")
            if len(fields) != 6:
                raise SystemExit(f"{path}:{number}: {len(fields)} fields; expected 6")
            action = fields[2]
            if action == "allocate failure":
                continue
            if action not in ("allocate", "free"):
                raise SystemExit(f"{path}:{number}: action {action!r}; expected allocate, free")
            events.append((action == "allocate", int(fields[3], 0), int(fields[4])))
    return events


def child(name, trace_path):
    conf = ALLOC_CONF[name]
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import torch
    ba = None
    if name == "bucketalloc":
        import bucketalloc_torch as ba
        ba.enable(patch_torch=True)
    events = read_trace(trace_path)
    torch.cuda.init()
    live = {}
    ooms = 0
    t0 = time.perf_counter_ns()
    for is_alloc, ptr, size in events:
        if is_alloc:
            try:
                live[ptr] = torch.empty(size, dtype=torch.uint8, device="cuda")
            except RuntimeError:  # torch.OutOfMemoryError, or bucketalloc's RuntimeError
                ooms += 1
        else:
            live.pop(ptr, None)
    torch.cuda.synchronize()
    elapsed = time.perf_counter_ns() - t0
    live.clear()
    peak = ba.max_memory_reserved() if ba else torch.cuda.max_memory_reserved()
    print(json.dumps({"allocator": name, "peak_reserved_bytes": peak, "ooms": ooms,
                      "ns_per_op": elapsed / max(1, len(events)), "events": len(events)}))


def calibrate():
    """Median microseconds of cudaMalloc and cudaFree (through PyTorch with caching off) per size."""
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    import torch
    torch.cuda.init()
    out = {}
    for size in (2 << 20, 20 << 20, 1 << 30):
        allocs, frees = [], []
        for _ in range(50):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            t1 = time.perf_counter_ns()
            del x
            t2 = time.perf_counter_ns()
            allocs.append((t1 - t0) / 1000)
            frees.append((t2 - t1) / 1000)
        allocs.sort()
        frees.sort()
        out[str(size)] = {"malloc_us": allocs[len(allocs) // 2], "free_us": frees[len(frees) // 2]}
    print(json.dumps(out))


def gib(n):
    return f"{n / (1 << 30):.2f} GiB"


def run_bench(bench, name, *args):
    """Runs `bench ARGS --json OUT`; returns (the JSON, None), or (None, "exit N" and its stderr)."""
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gpu_replay_{name.replace(':', '_')}.json")
    # The bench is a bundle program: BENCH_LD_LIBRARY_PATH (set by gpu_check.sh) gives it the
    # bundle's libraries without putting them in front of torch's own in this process.
    env = dict(os.environ)
    if os.environ.get("BENCH_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["BENCH_LD_LIBRARY_PATH"]
    proc = subprocess.run([bench, *args, "--json", out], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return None, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    with open(out) as f:
        return json.load(f), None


def describe(r):
    """One replay's figures, for a report line."""
    return (f"peak reserved {gib(r['peak_reserved_bytes'])}, OOMs {r['ooms']} (fragmentation "
            f"{r['fragmentation_ooms']}), granules stitched {r.get('granules_stitched', 0)}, p50 {r['p50_ns']:.0f} ns, "
            f"p99 {r['p99_ns']:.0f} ns, backend calls {r['backend_calls']}")


def vmm_check(trace, bench, capacity):
    """The --vmm mode (see the module comment). Returns the exit code."""
    m, error = run_bench(bench, "min_capacity_vmm", "min-capacity", trace, "--allocator", VMM)
    if error:
        print(f"check vmm_min_capacity: FAIL {error}")
        return 1
    tight = m["min_capacity_bytes"]
    print(f"{VMM}: smallest card on the simulated device {gib(tight)} ({tight} B, "
          f"{m['min_capacity_over_live']:.3f} x peak live {gib(m['peak_live_bytes'])})")
    failed = False
    for card, cap in (("tight", str(tight)), ("card", capacity)):
        for allocator in ("bucketalloc", VMM):
            runs = {}
            for device in ("sim", "cuda"):
                r, error = run_bench(bench, f"{allocator}_{card}_{device}", "replay", trace, "--allocator", allocator,
                                     "--capacity", cap, "--device", device)
                if error:
                    print(f"check vmm_replay_{allocator}_{card}_{device}: FAIL {error}")
                    failed = True
                    continue
                runs[device] = r
                print(f"harness replay {allocator} --device {device} --capacity {gib(r['capacity_bytes'])}: {describe(r)}")
            if len(runs) != 2:
                continue
            keys = ("peak_reserved_bytes", "ooms", "granules_stitched")
            ok = all(runs["sim"].get(k) == runs["cuda"].get(k) for k in keys)
            print(f"check vmm_cuda_matches_sim_{allocator}_{card}: {'PASS' if ok else 'FAIL'} "
                  + ", ".join(f"{k} sim {runs['sim'].get(k)} cuda {runs['cuda'].get(k)}" for k in keys))
            failed = failed or not ok
            if allocator == VMM:
                cuda = runs["cuda"]
                ok = cuda["ooms"] == 0 and (card != "tight" or cuda.get("granules_stitched", 0) > 0)
                print(f"check vmm_serves_{card}: {'PASS' if ok else 'FAIL'} {cuda['ooms']} OOMs, "
                      f"{cuda.get('granules_stitched', 0)} granules stitched on the GPU at {gib(cuda['capacity_bytes'])}")
                failed = failed or not ok
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--bench", help="bucketalloc-bench, for the pytorch-policy prediction")
    p.add_argument("--capacity", default="130GiB", help="simulated card for the prediction")
    p.add_argument("--child", choices=sorted(ALLOC_CONF) + ["calibrate"])
    p.add_argument("--vmm", action="store_true", help="check stitching on the GPU (needs --bench, not torch)")
    args = p.parse_args()
    if args.vmm:
        if args.bench is None:
            p.error("--vmm needs --bench")
        return vmm_check(args.trace, args.bench, args.capacity)
    if args.child == "calibrate":
        calibrate()
        return 0
    if args.child:
        child(args.child, args.trace)
        return 0

    results = {}
    failed = False
    for name in ALLOC_CONF:
        proc = subprocess.run([sys.executable, __file__, "--child", name, args.trace], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"check replay_{name}: FAIL exit {proc.returncode}\n{proc.stderr[-3000:]}")
            failed = True
            continue
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    with_bench = args.bench is not None
    predicted = None
    if with_bench:
        r, error = run_bench(args.bench, "pytorch_policy", "replay", args.trace, "--allocator", "pytorch-policy",
                             "--capacity", args.capacity)
        if error:
            print(f"check pytorch_policy_replay: FAIL {error}")
            failed = True
        else:
            predicted = r["peak_reserved_bytes"]

    if with_bench:
        for allocator in ("bucketalloc", "nocache"):
            peaks = {}
            for device in ("sim", "cuda"):
                r, error = run_bench(args.bench, f"{allocator}_{device}", "replay", args.trace, "--allocator", allocator,
                                     "--capacity", args.capacity, "--device", device)
                if error:
                    print(f"check harness_replay_{allocator}_{device}: FAIL {error}")
                    failed = True
                    continue
                peaks[device] = r["peak_reserved_bytes"]
                print(f"harness replay {allocator} --device {device}: {describe(r)}")
            if len(peaks) == 2:
                ok = peaks["sim"] == peaks["cuda"]
                print(f"check harness_cuda_matches_sim_{allocator}: {'PASS' if ok else 'FAIL'} "
                      f"sim {peaks['sim']} B, cuda {peaks['cuda']} B")
                failed = failed or not ok

    print(f"trace {args.trace}: {next(iter(results.values()))['events'] if results else '?'} events")
    print(f"{'allocator':<28} {'peak reserved':>14} {'OOMs':>6} {'ns/op':>8}")
    for name, r in results.items():
        print(f"{name:<28} {gib(r['peak_reserved_bytes']):>14} {r['ooms']:>6} {r['ns_per_op']:>8.0f}")
    if predicted is not None:
        print(f"{'pytorch-policy (simulated)':<28} {gib(predicted):>14}")
    proc = subprocess.run([sys.executable, __file__, "--child", "calibrate", args.trace], capture_output=True, text=True)
    if proc.returncode == 0:
        print("cost model calibration (median us; harness defaults: cudaMalloc 50, cudaFree 10):")
        for size, c in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            print(f"  {int(size) >> 20:>5} MiB: cudaMalloc {c['malloc_us']:8.1f} us, cudaFree {c['free_us']:8.1f} us")
    else:
        print(f"check cost_model_calibration: FAIL exit {proc.returncode}\n{proc.stderr[-2000:]}")
        failed = True
    if predicted is not None and "native" in results:
        native = results["native"]["peak_reserved_bytes"]
        error = abs(predicted - native) / native
        ok = error <= TOLERANCE and results["native"]["ooms"] == 0
        print(f"check pytorch_policy_predicts_native: {'PASS' if ok else 'FAIL'} predicted {gib(predicted)}, "
              f"native {gib(native)}, error {error * 100:.2f}% (target <= {TOLERANCE * 100:.0f}%)")
        failed = failed or not ok
    elif with_bench:
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
