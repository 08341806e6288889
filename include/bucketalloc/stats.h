// bucketalloc/stats.h — the reports: stats as JSON and as a table, the fragmentation report, the
// memory figures that tenants, OOM reports and timelines report, and the out-of-memory report
// with its one-line diagnosis.
//
// Owns: the renderings of the stat data (bucketalloc/stat_types.h, which declares every stat
// once); the memory figures (`MemoryFigures`, declared once by BUCKETALLOC_MEMORY_FIGURES, with
// the names every writer and reader of them uses); the tenants' figures; the OOM report's causes
// and fields (built by the front end's OOM diagnosis); and the one percentile of the latencies
// the harness and the benchmarks report.
// Layer: L4 (front end). Stats never change an allocation decision.
// Thread-safety: these are value snapshots, copied out under the device lock.
//
// Example:
//   bucketalloc::DeviceStats s = *allocator->GetStats(0);
//   s.allocated_bytes[bucketalloc::kAllPools].current;  // PyTorch "allocated_bytes.all.current"
//   std::string json = bucketalloc::StatsToJson(s);      // flat, PyTorch's dotted keys
//   bucketalloc::MemoryFigures m = bucketalloc::MemoryFiguresOf(s, *allocator->GetFragmentation(0));
//   m.cached == m.reserved - m.active;
#ifndef BUCKETALLOC_STATS_H_
#define BUCKETALLOC_STATS_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/types/span.h"
#include "bucketalloc/stat_types.h"
#include "bucketalloc/units.h"

namespace bucketalloc {

// Returns a flat JSON object with PyTorch's dotted keys, e.g. "allocated_bytes.all.current",
// "reserved_bytes.large_pool.peak", "num_alloc_retries", "oversize_allocations.current".
std::string StatsToJson(const DeviceStats& stats);

// The fragmentation report as JSON: {"all": ..., "small_pool": ..., "large_pool": ..., "tiers": [...]},
// each pool's object as PoolFragmentationToJson writes it.
std::string FragmentationToJson(const FragmentationReport& report);
// One pool's fragmentation as JSON, the one writer of it (the library's reports, the harness's
// peak_fragmentation): {"reserved", "allocated", "requested", "total_free", "largest_free",
// "external_fragmentation", "internal_fragmentation", "histogram": [{"min_bytes", "max_bytes",
// "count", "bytes"}]}, the histogram's non-empty bins only.
std::string PoolFragmentationToJson(const PoolFragmentation& pool);
// A readable table: the histogram bins that are non-empty, the fragmentation ratios, the tiers.
std::string FragmentationToTable(const FragmentationReport& report);

// ---------------------------------------------------------------------------------------------
// Memory figures.

// Every memory figure, declared once: X(type, name, key, meaning), in the order the timeline lists
// them. `name` is the member of MemoryFigures (and the OOM report's JSON key); `key` is the name
// with its unit: the timeline's JSON key and TimelineSample's member (bucketalloc/timeline.h), the
// tenants' JSON key and, after "bucketalloc_tenant_", their metric's name; in text the key without
// "_bytes" is the label ("largest free block"). A figure added here is in MemoryFigures, hence in
// TenantStats and OomReport, and in every timeline line; the OOM report and the tenants name the
// figures they list by member (kOomFigures in reports.cc, ForEachTenantField).
#define BUCKETALLOC_MEMORY_FIGURES(X)                                                                               \
  X(std::size_t, reserved, reserved_bytes, "bytes obtained from the backend (segments and slabs; vmm: granules)")   \
  X(std::size_t, allocated, allocated_bytes, "bytes of the live allocations' blocks (their sizes after rounding)")  \
  X(std::size_t, active, active_bytes, "allocated bytes plus blocks freed but awaiting stream events")              \
  X(std::size_t, cached, cached_bytes, "reserved bytes not active (reserved - active): free blocks kept for reuse") \
  X(std::size_t, requested, requested_bytes, "bytes the live allocations' callers asked for (<= allocated)")        \
  X(std::size_t, largest_free, largest_free_block_bytes, "the largest free cached block")                           \
  X(std::int64_t, live_allocations, live_allocations, "allocations served and not yet freed")

// The memory of a device, or of one tenant's pools, at one moment, all pools together: what
// TenantStats, OomReport and the timeline's samples are built from. Each is computed by one
// function: a device's by MemoryFiguresOf (the timeline, the OOM report), a tenant's by the front
// end's tenants (its stats, its OOM report); the harness's models of other allocators have their
// own. Invariants: requested <= allocated <= active <= reserved, cached == reserved - active,
// largest_free <= cached. The members and what each means: BUCKETALLOC_MEMORY_FIGURES.
struct MemoryFigures {
#define BUCKETALLOC_DECLARE_FIGURE(type, name, key, meaning) type name = 0;
  BUCKETALLOC_MEMORY_FIGURES(BUCKETALLOC_DECLARE_FIGURE)
#undef BUCKETALLOC_DECLARE_FIGURE
};

// A figure's names (BUCKETALLOC_MEMORY_FIGURES): its member's, and its key with its unit.
struct MemoryFigureName {
  const char* name;  // "largest_free"
  const char* key;   // "largest_free_block_bytes"
};

// Calls `f(MemoryFigureName, member)` for each figure, in the list's order, with `member` the
// pointer to its member of MemoryFigures (`figures.*member` reads it, in a TenantStats or an
// OomReport too). The one walk over the figures that their writers and readers go through.
template <typename F>
constexpr void ForEachMemoryFigure(F&& f) {
#define BUCKETALLOC_VISIT_FIGURE(type, name, key, meaning) f(MemoryFigureName{#name, #key}, &MemoryFigures::name);
  BUCKETALLOC_MEMORY_FIGURES(BUCKETALLOC_VISIT_FIGURE)
#undef BUCKETALLOC_VISIT_FIGURE
}

// The names of the figure at `member`: MemoryFigureNameOf(&MemoryFigures::largest_free).key is
// "largest_free_block_bytes".
template <typename T>
constexpr MemoryFigureName MemoryFigureNameOf(T MemoryFigures::*member) {
  MemoryFigureName found{nullptr, nullptr};
  ForEachMemoryFigure([&](const MemoryFigureName& name, auto m) {
    if constexpr (std::is_same_v<decltype(m), T MemoryFigures::*>) {
      if (m == member) found = name;
    }
  });
  return found;
}

// A device's figures, from its stats (the "all" pools' current values) and its fragmentation
// report (the largest free block of all pools).
MemoryFigures MemoryFiguresOf(const DeviceStats& stats, const FragmentationReport& fragmentation);

// ---------------------------------------------------------------------------------------------
// Out of memory.

enum class OomCause {
  // The live allocations plus the request exceed the cap: more memory is really needed.
  kCapacity,
  // Enough memory is free in total (cached pieces plus headroom under the cap), but no free block
  // fits and the pieces could not be released because their segments hold live blocks.
  kFragmentation,
  // Memory is held by blocks awaiting stream events (record_stream) that could not be synchronized,
  // and without it the request's pool had too little free memory.
  kCacheHeld,
  // The cap allows the request but the device itself refused: memory is used outside this allocator.
  kDeviceExhausted,
  // A tenant's own cap refused the growth, not the device's (tenants:[...]): the lever is that
  // tenant's cap (or what is bound to it). The report's diagnosis says what held the tenant's
  // memory (its live blocks, or its cache in pieces).
  kTenantCap,
};

inline constexpr int kNumOomCauses = 5;

// The counter of each cause (stat_list.h declares them; num_ooms is their sum), indexed by OomCause:
// the one place that pairs a cause with its counter.
inline constexpr std::array<std::int64_t DeviceStats::*, kNumOomCauses> kOomCounters = {
    &DeviceStats::num_ooms_capacity, &DeviceStats::num_ooms_fragmentation, &DeviceStats::num_ooms_cache_held,
    &DeviceStats::num_ooms_device_exhausted, &DeviceStats::num_ooms_tenant_cap};
static_assert(static_cast<int>(OomCause::kCapacity) == 0 && static_cast<int>(OomCause::kFragmentation) == 1 &&
                  static_cast<int>(OomCause::kCacheHeld) == 2 && static_cast<int>(OomCause::kDeviceExhausted) == 3 &&
                  static_cast<int>(OomCause::kTenantCap) == 4 && kNumOomCauses == 5,
              "kOomCounters pairs each OomCause with its counter in this order");
inline constexpr std::int64_t DeviceStats::*OomCounter(OomCause cause) { return kOomCounters[static_cast<int>(cause)]; }
// Each cause's count in `s`, indexed by OomCause.
inline std::array<std::int64_t, kNumOomCauses> OomCounts(const DeviceStats& s) {
  std::array<std::int64_t, kNumOomCauses> counts{};
  for (int c = 0; c < kNumOomCauses; ++c) counts[c] = s.*kOomCounters[c];
  return counts;
}

const char* OomCauseName(OomCause cause);
// The cause as a key or label value: "capacity", "fragmentation", "cache_held", "device_exhausted",
// "tenant_cap".
const char* OomCauseKey(OomCause cause);

// One out-of-memory failure, as the timeline lists them: its number on the device (1, 2, ...),
// when (seconds since the Unix epoch; in a replay, since the trace's first event), the bytes asked
// and the cause. When a tenant's own cap refused the request (not the device's), `tenant` names
// the tenant and `tenant_cap` is its cap: the cause is then the diagnosis within the tenant (its
// cap as the capacity, its live blocks and cache), the same in a process and in a replay.
struct OomEvent {
  std::uint64_t seq = 0;
  double time_s = 0.0;
  std::size_t size = 0;
  OomCause cause = OomCause::kCapacity;
  std::string tenant;  // "" when the device's cap refused it
  std::size_t tenant_cap = 0;
};

// One tenant's figures on one device (Options::tenants): the default tenant ("default": what no
// tenant is bound to; its cap is the device's) first, then the tenants in their order. The memory
// figures are its own pools': reserved (backend memory), allocated and requested (its live blocks,
// and what their callers asked for), active, cached (reserved - active: free for the tenant only)
// and its live allocations. largest_free is not kept per tenant (0).
struct TenantStats : MemoryFigures {
  std::string name;
  std::size_t cap = 0;
  std::size_t peak_reserved = 0;
  std::int64_t ooms = 0;
  std::int64_t ooms_at_cap = 0;  // of those, refused by its own cap (not the device's)
};
// Calls `f(key, value, meaning)` for each figure of `t` that its JSON (TenantStatsToJson, key
// "<key>") and its metrics (bucketalloc_tenant_<key>, HELP `meaning`) list, in their order: its
// cap, then its memory figures (their keys) with its peak of reserved bytes.
template <typename F>
void ForEachTenantField(const TenantStats& t, F&& f) {
  auto figure = [&](auto member, const char* meaning) { f(MemoryFigureNameOf(member).key, t.*member, meaning); };
  f("cap_bytes", t.cap, "the cap on what each tenant's pools reserve (default: the device's)");
  figure(&MemoryFigures::reserved, "bytes reserved by each tenant's pools");
  f("peak_reserved_bytes", t.peak_reserved,
    "the peak of bucketalloc_tenant_reserved_bytes since the start or the last peak reset");
  figure(&MemoryFigures::allocated, "bytes of each tenant's live blocks");
  figure(&MemoryFigures::requested, "bytes each tenant's live allocations asked for");
  figure(&MemoryFigures::cached, "bytes each tenant's pools hold free, for it alone");
  figure(&MemoryFigures::live_allocations, "each tenant's live allocations");
}
std::string TenantStatsToJson(const std::vector<TenantStats>& tenants);

// One out-of-memory failure: the request, and the memory figures of the device (or, at a
// tenant's own cap, of the tenant) then, with largest_free the request's pool's (the block that
// could have served it). The JSON and the text list reserved, allocated, active, cached and
// largest_free.
struct OomReport : MemoryFigures {
  int device = 0;
  // The tenant of the request ("" without tenants) and its cap; at_tenant_cap when that cap, not
  // the device's, refused the growth (the numbers below are then the tenant's).
  std::string tenant;
  std::size_t tenant_cap = 0;
  bool at_tenant_cap = false;
  // The bytes the request asked for. This `requested` hides MemoryFigures::requested, the bytes
  // the live allocations' callers asked for: figures().requested.
  std::size_t requested = 0;
  std::size_t rounded = 0;
  std::size_t capacity = 0;
  std::size_t device_free = 0;   // as the backend reported it
  std::size_t segment = 0;       // the backend allocation the request needed (PyTorch's "Tried to allocate")
  std::size_t device_total = 0;  // the device's memory
  OomCause cause = OomCause::kCapacity;
  // throw_on_cudamalloc_oom refused it at the cap, without releasing the cache and retrying
  // (PyTorch's preemptive rejection).
  bool rejected = false;
  std::string diagnosis;  // one line, names the cause and the numbers behind it
  FragmentationReport fragmentation;

  std::string ToString() const;  // the diagnosis, the numbers and the histogram
  // The first sentences of PyTorch's own OOM message (c10/cuda/CUDACachingAllocator.cpp), from
  // these numbers: "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of
  // 79.19 GiB of which 1.20 GiB is free. 40.00 GiB allowed; Of the allocated memory ... is allocated
  // by PyTorch, and ... is reserved by PyTorch but unallocated." (sizes as PyTorch's format_size).
  std::string TorchHeader() const;
  std::string ToJson() const;
  const MemoryFigures& figures() const { return *this; }
};

// torch.cuda.memory_summary()'s table, rendered from `stats` exactly as torch renders it
// (torch/cuda/memory.py); `abbreviated` leaves out the per-pool rows, as torch's does.
std::string TorchMemorySummary(const DeviceStats& stats, int device, bool abbreviated);
// The readable summary: TorchMemorySummary, then bucketalloc's rows (the cap, cached bytes per pool,
// every counter).
std::string StatsSummary(const DeviceStats& stats, int device);

// ---------------------------------------------------------------------------------------------
// Latencies.

// The q-quantile (0 <= q <= 1) of `samples` by nearest rank: the smallest sample with at least a
// fraction q of them at or below it (q = 1: the largest); 0 when there are none. Reorders
// `samples` (a partial sort). The one percentile of the harness's replays (p50_ns, p99_ns) and
// the benchmarks.
template <typename T>
double Percentile(absl::Span<T> samples, double q) {
  if (samples.empty()) return 0.0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
  const std::size_t k = std::min(samples.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(k), samples.end());
  return static_cast<double>(samples[k]);
}

}  // namespace bucketalloc

#endif  // BUCKETALLOC_STATS_H_
