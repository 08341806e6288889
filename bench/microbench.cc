// bench/microbench.cc — bucketalloc_microbench: the CPU cost of bucketalloc's fast path, with
// mimalloc as the reference for a good general-purpose host allocator.
//
// What is measured:
//   BM_BucketAlloc_AllocFree/<bytes>   One Allocate(bytes, 0, stream) + Free(p, 0) pair that is a
//                                      cache hit: the block is warmed into the cache before timing,
//                                      so the loop never calls the backend. With ->Threads(2) both
//                                      threads share device 0 (and so its one lock, the realistic
//                                      contention) but each uses its own stream (thread 0 the
//                                      default stream nullptr, the others distinct pseudo-streams),
//                                      so they never share a free list. Counters (thread 0, taken
//                                      outside the timed region): reserved_bytes (all pools, at the
//                                      end) and cache_hit_rate (hits / (hits + misses) of the timed
//                                      loops only; 1.0 means the fast path was all that ran).
//   BM_Mimalloc_AllocFree/<bytes>      mi_malloc + mi_free of the same size; nothing else.
//   BM_BucketAlloc_MixedSizes          Steady-state churn: 64 live blocks in a ring; each iteration
//                                      frees the oldest and allocates the next size from a fixed,
//                                      seeded list (log-uniform, 512 B to 64 MiB). Both pools,
//                                      splitting, coalescing and some slow paths (new segments) run.
//                                      Counters: reserved_bytes and external_fragmentation
//                                      (GetFragmentation(0).all()) with the 64 blocks live,
//                                      cache_hit_rate.
//   BM_Mimalloc_MixedSizes             The same pattern with mi_malloc / mi_free (items/s only).
//   BM_BucketAlloc_SlowPath/path:N     The slow path of one 12 MiB request after fragmentation: a
//                                      plain backend allocation (0), a stitching segment grown in
//                                      place by new granules (1), or by free ones moved at the cap (2).
//   BM_BucketAlloc_ScatteredFree/free:N/slabs:S
//                                      One 512 B alloc + free pair with N free 512 B blocks scattered
//                                      between live ones: packed (S=0, the default) or in slabs (1).
//   BM_BucketAlloc_PairWhileScraped/free:N/scrape_us:U
//                                      The same pair while another thread reads Metrics() every U us
//                                      (0: none, the baseline): the pairs' worst and 99.99th
//                                      percentile latency, and a scrape's time.
//   BM_BucketAlloc_Metrics/free:N      One Allocator::Metrics() call alone with N free blocks.
// AllocFree and MixedSizes run on two allocators, backend:0 (plain) and backend:1 (stitching on).
//
// What is NOT measured:
//   - Anything on a GPU. The sim backend runs on the CPU; in unbacked mode its memory is a reserved,
//     never-touched address range. cudaMalloc / cudaFree latency, event record/query costs, driver
//     locks and device-side effects of fragmentation are outside this binary.
//   - The slow path on a GPU: AllocFree is cache hits only; MixedSizes mixes in backend calls at
//     whatever rate the churn produces (see cache_hit_rate) but they are simulated (cheap) calls;
//     SlowPath prices the simulated device's calls (mmap syscalls), not cuMemMap's.
//   - Memory traffic: neither allocator's memory is written to.
//   - A fair "same job" comparison: mimalloc is a host heap that returns memory to its own caches; it
//     has no streams, no stats and no device lock. It is shown as a lower bound for a CPU allocator.
//
// Process-wide note: libmimalloc.so (the Debian `mimalloc` target) exports malloc/free, so every
// host allocation in this process, bucketalloc's own included, goes through mimalloc.
//
// One sim allocator (a function-local static: unbacked, 64 GiB card) serves every BucketAlloc
// benchmark; each run starts from an emptied cache (EmptyCache in the Setup hook).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <mimalloc.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/metrics.h"
#include "bucketalloc/options.h"
#include "bucketalloc/stats.h"

namespace {

using bucketalloc::Allocator;
using bucketalloc::Stream;

constexpr int kDevice = 0;

// Makes an allocator from `conf` or aborts (a benchmark binary has no one to report to).
Allocator* MakeOrDie(const char* conf) {
  absl::StatusOr<bucketalloc::Options> options = bucketalloc::ParseOptions(conf);
  if (!options.ok()) {
    std::fprintf(stderr, "bucketalloc_microbench: %s\n", std::string(options.status().message()).c_str());
    std::abort();
  }
  absl::StatusOr<std::unique_ptr<Allocator>> created = Allocator::Create(*options);
  if (!created.ok()) {
    std::fprintf(stderr, "bucketalloc_microbench: %s\n", std::string(created.status().message()).c_str());
    std::abort();
  }
  return created->release();  // lives for the whole process
}

// The allocator of a benchmark: backend 0 is the plain sim device, 1 the same with stitching
// (expandable_segments, the sim's virtual memory: the vmm backend's twin).
Allocator& SimAllocator(std::int64_t backend = 0) {
  static Allocator* const plain = MakeOrDie("backend:sim,sim_memory:unbacked,sim_total_memory:64GiB");
  static Allocator* const vmm =
      MakeOrDie("backend:sim,sim_memory:unbacked,sim_total_memory:64GiB,expandable_segments:true");
  return backend == 0 ? *plain : *vmm;
}

// Thread 0 uses the default stream; thread i > 0 a distinct non-null pseudo-stream (never
// dereferenced: a cache hit makes no backend call).
Stream StreamOf(int thread_index) {
  return thread_index == 0 ? nullptr : reinterpret_cast<Stream>(static_cast<std::uintptr_t>(thread_index));
}

// Skips the benchmark with "<what> failed: <status message>" (SkipWithError copies the text).
void SkipWithStatus(benchmark::State& state, const char* what, const absl::Status& status) {
  const std::string message = std::string(what) + " failed: " + std::string(status.message());
  state.SkipWithError(message.c_str());
}

// benchmark::DoNotOptimize on a *const* reference: an input-only asm operand. The non-const overload
// of Debian's benchmark 1.7.1 uses an in-out "+m,r" operand, with which GCC 12 was seen to lose the
// store of live[oldest] in BM_BucketAlloc_MixedSizes (one block leaked per iteration, then OOM).
inline void Keep(void* const& p) { benchmark::DoNotOptimize(p); }

// Stats counters at the start of the timed region (written by Setup, which runs single-threaded
// before the benchmark's threads start).
struct Snapshot {
  std::int64_t hits = 0;
  std::int64_t misses = 0;
  absl::Status status;
};
Snapshot g_start;

Snapshot TakeSnapshot(Allocator& allocator) {
  Snapshot s;
  absl::StatusOr<bucketalloc::DeviceStats> stats = allocator.GetStats(kDevice);
  if (!stats.ok()) {
    s.status = stats.status();
    return s;
  }
  s.hits = stats->num_cache_hits;
  s.misses = stats->num_cache_misses;
  return s;
}

double HitRate(const Snapshot& start, const Snapshot& end) {
  const double hits = static_cast<double>(end.hits - start.hits);
  const double total = hits + static_cast<double>(end.misses - start.misses);
  return total > 0 ? hits / total : 0.0;
}

// Reports reserved_bytes and cache_hit_rate (thread 0 only, after the timed loop).
void ReportAllocatorCounters(benchmark::State& state, Allocator& allocator) {
  absl::StatusOr<bucketalloc::DeviceStats> stats = allocator.GetStats(kDevice);
  if (!stats.ok() || !g_start.status.ok()) {
    state.SkipWithError("GetStats failed");
    return;
  }
  Snapshot end;
  end.hits = stats->num_cache_hits;
  end.misses = stats->num_cache_misses;
  state.counters["reserved_bytes"] =
      benchmark::Counter(static_cast<double>(stats->reserved_bytes[bucketalloc::kAllPools].current),
                         benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
  state.counters["cache_hit_rate"] = HitRate(g_start, end);
}

// ---------------------------------------------------------------------------------------------
// Alloc + free pairs of one size.

// Setup hook: empty the cache, warm one block of the size per thread's stream, snapshot the
// counters, so that the timed loops are cache hits and the hit rate covers them alone.
void SetupAllocFree(const benchmark::State& state) {
  Allocator& allocator = SimAllocator(state.range(1));
  g_start = Snapshot();
  if (absl::Status s = allocator.EmptyCache(); !s.ok()) {
    g_start.status = s;
    return;
  }
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (int t = 0; t < state.threads(); ++t) {
    absl::StatusOr<void*> p = allocator.Allocate(bytes, kDevice, StreamOf(t));
    if (!p.ok()) {
      g_start.status = p.status();
      return;
    }
    if (absl::Status s = allocator.Free(*p, kDevice); !s.ok()) {
      g_start.status = s;
      return;
    }
  }
  g_start = TakeSnapshot(allocator);
}

void BM_BucketAlloc_AllocFree(benchmark::State& state) {
  Allocator& allocator = SimAllocator(state.range(1));
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const Stream stream = StreamOf(state.thread_index());
  if (!g_start.status.ok()) {
    SkipWithStatus(state, "warm-up", g_start.status);
    for (auto _ : state) {
    }
    return;
  }
  for (auto _ : state) {
    absl::StatusOr<void*> p = allocator.Allocate(bytes, kDevice, stream);
    if (!p.ok()) {
      SkipWithStatus(state, "Allocate", p.status());
      break;
    }
    void* ptr = *p;
    Keep(ptr);
    if (absl::Status s = allocator.Free(ptr, kDevice); !s.ok()) {
      SkipWithStatus(state, "Free", s);
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) ReportAllocatorCounters(state, allocator);
}

void BM_Mimalloc_AllocFree(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = mi_malloc(bytes);
    Keep(p);
    mi_free(p);
  }
  state.SetItemsProcessed(state.iterations());
}

#define BUCKETALLOC_SIZES Arg(4096)->Arg(262144)->Arg(2097152)->Arg(67108864)

// backend:0 is the plain sim device, backend:1 the same with stitching (expandable_segments): the
// cache-hit pair must cost the same on both (the fast path never looks at granules).
BENCHMARK(BM_BucketAlloc_AllocFree)
    ->ArgsProduct({{4096, 262144, 2097152, 67108864}, {0, 1}})
    ->ArgNames({"bytes", "backend"})
    ->Setup(SetupAllocFree)
    ->Threads(1)
    ->Threads(2);
BENCHMARK(BM_Mimalloc_AllocFree)->BUCKETALLOC_SIZES->Threads(1)->Threads(2);

// ---------------------------------------------------------------------------------------------
// Mixed sizes: a ring of 64 live blocks, the oldest freed and a new one allocated per iteration.

constexpr int kLiveBlocks = 64;
constexpr std::size_t kNumSizes = 4096;

// A fixed, seeded list of sizes, log-uniform between 512 B (2^9) and 64 MiB (2^26).
const std::vector<std::size_t>& MixedSizes() {
  static const std::vector<std::size_t> sizes = [] {
    std::mt19937_64 rng(20240601);
    std::uniform_real_distribution<double> log2_size(9.0, 26.0);
    std::vector<std::size_t> v(kNumSizes);
    for (std::size_t& s : v) {
      s = static_cast<std::size_t>(std::exp2(log2_size(rng)));
      if (s < 512) s = 512;
      if (s > (std::size_t{64} << 20)) s = std::size_t{64} << 20;
    }
    return v;
  }();
  return sizes;
}

void SetupMixed(const benchmark::State& state) {
  g_start = Snapshot();
  if (absl::Status s = SimAllocator(state.range(0)).EmptyCache(); !s.ok()) g_start.status = s;
}

void FreeAll(Allocator& allocator, std::vector<void*>& live) {
  for (void*& p : live) {
    if (p != nullptr) allocator.Free(p, kDevice).IgnoreError();
    p = nullptr;
  }
}

void BM_BucketAlloc_MixedSizes(benchmark::State& state) {
  Allocator& allocator = SimAllocator(state.range(0));
  const std::vector<std::size_t>& sizes = MixedSizes();
  std::vector<void*> live(kLiveBlocks, nullptr);
  if (!g_start.status.ok()) {
    SkipWithStatus(state, "EmptyCache", g_start.status);
    for (auto _ : state) {
    }
    return;
  }
  // Fill the ring (untimed), then snapshot: the timed loop is the steady state.
  std::size_t next = 0;
  for (void*& p : live) {
    absl::StatusOr<void*> r = allocator.Allocate(sizes[next++ % kNumSizes], kDevice);
    if (!r.ok()) {
      SkipWithStatus(state, "Allocate (filling the ring)", r.status());
      FreeAll(allocator, live);
      for (auto _ : state) {
      }
      return;
    }
    p = *r;
  }
  g_start = TakeSnapshot(allocator);
  std::size_t oldest = 0;
  for (auto _ : state) {
    if (absl::Status s = allocator.Free(live[oldest], kDevice); !s.ok()) {
      live[oldest] = nullptr;
      SkipWithStatus(state, "Free", s);
      break;
    }
    live[oldest] = nullptr;
    absl::StatusOr<void*> r = allocator.Allocate(sizes[next], kDevice);
    if (!r.ok()) {
      SkipWithStatus(state, "Allocate", r.status());
      break;
    }
    live[oldest] = *r;
    Keep(live[oldest]);
    if (++next == kNumSizes) next = 0;
    if (++oldest == kLiveBlocks) oldest = 0;
  }
  state.SetItemsProcessed(state.iterations());
  // Counters with the 64 blocks still live (the steady state), then clean up.
  if (!state.error_occurred()) {
    ReportAllocatorCounters(state, allocator);
    absl::StatusOr<bucketalloc::FragmentationReport> frag = allocator.GetFragmentation(kDevice);
    if (frag.ok()) {
      state.counters["external_fragmentation"] = frag->all().external_fragmentation();
    } else {
      state.SkipWithError("GetFragmentation failed");
    }
  }
  FreeAll(allocator, live);
}

void BM_Mimalloc_MixedSizes(benchmark::State& state) {
  const std::vector<std::size_t>& sizes = MixedSizes();
  std::vector<void*> live(kLiveBlocks, nullptr);
  std::size_t next = 0;
  for (void*& p : live) p = mi_malloc(sizes[next++ % kNumSizes]);
  std::size_t oldest = 0;
  for (auto _ : state) {
    mi_free(live[oldest]);
    live[oldest] = mi_malloc(sizes[next]);
    Keep(live[oldest]);
    if (++next == kNumSizes) next = 0;
    if (++oldest == kLiveBlocks) oldest = 0;
  }
  state.SetItemsProcessed(state.iterations());
  for (void* p : live) mi_free(p);
}

BENCHMARK(BM_BucketAlloc_MixedSizes)->Arg(0)->Arg(1)->ArgName("backend")->Setup(SetupMixed);
BENCHMARK(BM_Mimalloc_MixedSizes);

// ---------------------------------------------------------------------------------------------
// Scattered free blocks of one size: `free` free 512-byte blocks, each between two live ones, in
// the small pool, then one 512 B alloc + free pair per iteration (the lowest-addressed free block
// is the best fit, and the pair puts it back). With slabs (slab_limit:1MiB, conf 1) a hit pops a
// slot; packed (the default, conf 0) it reads every free block of that size class's bin for the
// lowest address, so the time grows with `free`.

// Scattered free blocks: `free_blocks` free 512 B blocks of `allocator` on the default stream,
// each between two live ones (returned in `held`, which the caller frees). False, with the
// benchmark skipped naming why, when an allocation fails.
bool ScatterFreeBlocks(benchmark::State& state, Allocator& allocator, std::size_t free_blocks,
                       std::vector<void*>* held) {
  std::vector<void*> freed;
  for (std::size_t i = 0; i < 2 * free_blocks + 1; ++i) {
    absl::StatusOr<void*> p = allocator.Allocate(512, kDevice, nullptr);
    if (!p.ok()) {
      SkipWithStatus(state, "Allocate", p.status());
      return false;
    }
    (i % 2 == 1 ? freed : *held).push_back(*p);
  }
  for (void* p : freed) allocator.Free(p, kDevice).IgnoreError();
  return true;
}

void BM_BucketAlloc_ScatteredFree(benchmark::State& state) {
  const auto free_blocks = static_cast<std::size_t>(state.range(0));
  static Allocator* const packed = MakeOrDie("backend:sim,sim_memory:unbacked,sim_total_memory:64GiB");
  static Allocator* const slabs = MakeOrDie("backend:sim,sim_memory:unbacked,sim_total_memory:64GiB,slab_limit:1MiB");
  Allocator& allocator = state.range(1) == 0 ? *packed : *slabs;
  std::vector<void*> held;
  if (!ScatterFreeBlocks(state, allocator, free_blocks, &held)) return;
  for (auto _ : state) {
    absl::StatusOr<void*> p = allocator.Allocate(512, kDevice, nullptr);
    if (!p.ok()) {
      SkipWithStatus(state, "Allocate", p.status());
      break;
    }
    Keep(*p);
    allocator.Free(*p, kDevice).IgnoreError();
  }
  state.SetItemsProcessed(state.iterations());
  for (void* p : held) allocator.Free(p, kDevice).IgnoreError();
  allocator.EmptyCache().IgnoreError();
}
BENCHMARK(BM_BucketAlloc_ScatteredFree)->ArgsProduct({{16, 1024, 65536}, {0, 1}})->ArgNames({"free", "slabs"});

// ---------------------------------------------------------------------------------------------
// A scrape's cost to the allocation path: `free` free 512 B blocks scattered between live ones (as
// in ScatteredFree, packed), and a thread that reads every device's metrics (what GET /metrics and
// a timeline sample read: Allocator::Metrics, under each device's lock) every `scrape_us`
// microseconds (0: no scraper, the baseline of the same run). The timed loop is the 512 B
// alloc + free pair; each pair is also timed alone. Counters: pair_max_us and pair_p9999_us (the
// pairs' worst and 99.99th percentile latency: a pair that waited for a scrape), scrapes (how many
// ran during the loop) and scrape_us (a scrape's mean time, on the scraper's thread).

void BM_BucketAlloc_PairWhileScraped(benchmark::State& state) {
  const auto free_blocks = static_cast<std::size_t>(state.range(0));
  const auto scrape_us = static_cast<int>(state.range(1));
  static Allocator* const allocator = MakeOrDie("backend:sim,sim_memory:unbacked,sim_total_memory:64GiB");
  std::vector<void*> held;
  if (!ScatterFreeBlocks(state, *allocator, free_blocks, &held)) return;
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> scrapes{0};
  std::atomic<std::int64_t> scrape_ns{0};
  std::thread scraper;
  if (scrape_us > 0) {
    scraper = std::thread([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<bucketalloc::DeviceMetrics> m = allocator->Metrics();
        benchmark::DoNotOptimize(m.data());
        scrape_ns +=
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
        ++scrapes;
        std::this_thread::sleep_for(std::chrono::microseconds(scrape_us));
      }
    });
  }
  std::vector<std::int64_t> pair_ns;
  pair_ns.reserve(1 << 22);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<void*> p = allocator->Allocate(512, kDevice, nullptr);
    if (!p.ok()) {
      SkipWithStatus(state, "Allocate", p.status());
      break;
    }
    Keep(*p);
    allocator->Free(*p, kDevice).IgnoreError();
    if (pair_ns.size() < pair_ns.capacity()) {
      pair_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  stop = true;
  if (scraper.joinable()) scraper.join();
  state.SetItemsProcessed(state.iterations());
  if (!pair_ns.empty()) {
    state.counters["pair_max_us"] = bucketalloc::Percentile(absl::MakeSpan(pair_ns), 1.0) / 1e3;
    state.counters["pair_p9999_us"] = bucketalloc::Percentile(absl::MakeSpan(pair_ns), 0.9999) / 1e3;
  }
  state.counters["scrapes"] = static_cast<double>(scrapes.load());
  state.counters["scrape_us"] =
      scrapes.load() == 0 ? 0.0 : static_cast<double>(scrape_ns.load()) / 1e3 / static_cast<double>(scrapes.load());
  for (void* p : held) allocator->Free(p, kDevice).IgnoreError();
  allocator->EmptyCache().IgnoreError();
}
// One scrape alone (Allocator::Metrics: every device's figures, copied under its lock, with the
// vectors it returns), with `free` free 512 B blocks scattered between live ones: what a metrics
// scrape or a timeline sample costs its thread, an upper bound on how long it holds the lock.
void BM_BucketAlloc_Metrics(benchmark::State& state) {
  const auto free_blocks = static_cast<std::size_t>(state.range(0));
  static Allocator* const allocator = MakeOrDie("backend:sim,sim_memory:unbacked,sim_total_memory:64GiB");
  std::vector<void*> held;
  if (!ScatterFreeBlocks(state, *allocator, free_blocks, &held)) return;
  for (auto _ : state) {
    std::vector<bucketalloc::DeviceMetrics> m = allocator->Metrics();
    benchmark::DoNotOptimize(m.data());
  }
  for (void* p : held) allocator->Free(p, kDevice).IgnoreError();
  allocator->EmptyCache().IgnoreError();
}
BENCHMARK(BM_BucketAlloc_Metrics)->Arg(16)->Arg(200000)->ArgName("free");

BENCHMARK(BM_BucketAlloc_PairWhileScraped)
    ->ArgsProduct({{200000}, {0, 50000, 1000}})
    ->ArgNames({"free", "scrape_us"})
    ->MinTime(2.0)
    ->UseRealTime();

// ---------------------------------------------------------------------------------------------
// The slow path that serves a 12 MiB request after a fragmenting pattern (ten 4 MiB blocks, every
// other one freed: 20 MiB free, no piece fits; two 20 MiB segments on the plain device, one segment
// grown in place with stitching). Backed sim memory, so a map
// is a real mmap of the device's memfd and an unmap a real mmap(PROT_NONE). Only the Allocate is
// timed; the set-up and the clean-up after it are not.
//   path:0  plain sim device, headroom under the cap: one backend Allocate of 12 MiB (cudaMalloc)
//   path:1  stitching on, headroom under the cap: the segment grows in place, 6 granules created
//           and mapped
//   path:2  stitching on, at the cap: the segment's range (the cap's size) is all used, so a new one,
//           the 6 free granules unmapped and mapped there
//   path:3-5  the same on GPU 0 (backend:cuda, backend:vmm); skipped with the reason without one
// Counters: backend_calls per request, granules_stitched per request.

// Paths 3-5 are paths 0-2 on GPU 0 (backend:cuda, backend:vmm): cudaMalloc against cuMemCreate +
// cuMemMap, and a stitch's cuMemUnmap + cuMemMap. Without a GPU they are skipped with the reason.
absl::StatusOr<Allocator*> SlowPathAllocator(std::int64_t path) {
  static const char* const kConfs[] = {
      "backend:sim,sim_total_memory:128MiB,capacity:64MiB",
      "backend:sim,sim_total_memory:128MiB,capacity:64MiB,expandable_segments:true",
      "backend:sim,sim_total_memory:128MiB,capacity:40MiB,expandable_segments:true",
      "backend:cuda,capacity:64MiB",
      "backend:vmm,capacity:64MiB",
      "backend:vmm,capacity:40MiB",
  };
  static std::vector<absl::StatusOr<Allocator*>>* const made = [] {
    auto* v = new std::vector<absl::StatusOr<Allocator*>>;
    for (const char* conf : kConfs) {
      absl::StatusOr<bucketalloc::Options> options = bucketalloc::ParseOptions(conf);
      if (!options.ok()) {
        v->push_back(options.status());
        continue;
      }
      absl::StatusOr<std::unique_ptr<Allocator>> created = Allocator::Create(*options);
      if (created.ok()) {
        v->push_back(created->release());  // lives for the whole process
      } else {
        v->push_back(created.status());
      }
    }
    return v;
  }();
  return (*made)[static_cast<std::size_t>(path)];
}

std::int64_t BackendCalls(Allocator& allocator) {
  const bucketalloc::BackendCounters c = (*allocator.backend(kDevice))->counters();
  std::int64_t calls = 0;  // every memory call, as the harness counts them
  for (const bucketalloc::BackendCall& call : bucketalloc::BackendCalls(c)) calls += call.count;
  return calls;
}

void BM_BucketAlloc_SlowPath(benchmark::State& state) {
  absl::StatusOr<Allocator*> made = SlowPathAllocator(state.range(0));
  if (!made.ok()) {
    SkipWithStatus(state, "creating the allocator", made.status());
    for (auto _ : state) {
    }
    return;
  }
  Allocator& allocator = **made;
  std::int64_t calls = 0, stitched = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<void*> blocks;
    for (int i = 0; i < 10 && state.error_occurred() == false; ++i) {
      absl::StatusOr<void*> p = allocator.Allocate(std::size_t{4} << 20, kDevice);
      if (!p.ok()) {
        SkipWithStatus(state, "Allocate (fragmenting)", p.status());
        break;
      }
      blocks.push_back(*p);
    }
    if (state.error_occurred()) {
      for (void* p : blocks) allocator.Free(p, kDevice).IgnoreError();
      state.ResumeTiming();
      break;
    }
    for (int i = 0; i < 10; i += 2) allocator.Free(blocks[i], kDevice).IgnoreError();
    const std::int64_t calls_before = BackendCalls(allocator);
    const std::int64_t stitched_before = allocator.GetStats(kDevice)->num_granules_stitched;
    state.ResumeTiming();
    absl::StatusOr<void*> big = allocator.Allocate(std::size_t{12} << 20, kDevice);
    state.PauseTiming();
    if (!big.ok()) {
      SkipWithStatus(state, "Allocate", big.status());
      break;
    }
    calls += BackendCalls(allocator) - calls_before;
    stitched += allocator.GetStats(kDevice)->num_granules_stitched - stitched_before;
    allocator.Free(*big, kDevice).IgnoreError();
    for (int i = 1; i < 10; i += 2) allocator.Free(blocks[i], kDevice).IgnoreError();
    allocator.EmptyCache().IgnoreError();
    state.ResumeTiming();
  }
  const double n = static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
  state.counters["backend_calls"] = static_cast<double>(calls) / n;
  state.counters["granules_stitched"] = static_cast<double>(stitched) / n;
}

BENCHMARK(BM_BucketAlloc_SlowPath)->DenseRange(0, 5)->ArgName("path");

// One CUDA-graph capture's pool announcements (begin, end, release) with `open` other private
// pools in use on the device: each is a constant-time index lookup, so the time per capture must
// not grow with `open` (a linear search made 20,000 open pools' capture ends quadratic).
void BM_BucketAlloc_CaptureWithOpenPools(benchmark::State& state) {
  Allocator* a = MakeOrDie("backend:sim,sim_memory:unbacked,sim_total_memory:64GiB");
  const auto open = static_cast<std::uint64_t>(state.range(0));
  const bucketalloc::CaptureFilter none = [](Stream) { return false; };
  for (std::uint64_t i = 1; i <= open; ++i) {
    if (!a->BeginCapture(kDevice, {0, i}, none).ok() || !a->EndCapture(kDevice, {0, i}).ok()) {
      state.SkipWithError("opening the pools failed");
      return;
    }
  }
  std::uint64_t next = open + 1;
  for (auto _ : state) {
    const bucketalloc::GraphPoolId id{0, next++};
    if (!a->BeginCapture(kDevice, id, none).ok() || !a->EndCapture(kDevice, id).ok() ||
        !a->ReleasePool(kDevice, id).ok()) {
      state.SkipWithError("a capture's announcements failed");
      break;
    }
  }
  state.counters["open_pools"] = static_cast<double>(open);
}

BENCHMARK(BM_BucketAlloc_CaptureWithOpenPools)->Arg(10)->Arg(1000)->Arg(20000);

}  // namespace

BENCHMARK_MAIN();
