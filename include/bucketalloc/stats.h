// bucketalloc/stats.h — the reports: stats as JSON and as a table, the fragmentation report, and
// the out-of-memory report with its one-line diagnosis.
//
// Owns: the renderings of the stat data (bucketalloc/stat_types.h, which declares every stat
// once), and the OOM report's causes and fields (built by the front end's OOM diagnosis).
// Layer: L4 (front end). Stats never change an allocation decision.
// Thread-safety: these are value snapshots, copied out under the device lock.
//
// Example:
//   bucketalloc::DeviceStats s = *allocator->GetStats(0);
//   s.allocated_bytes[bucketalloc::kAllPools].current;  // PyTorch "allocated_bytes.all.current"
//   std::string json = bucketalloc::StatsToJson(s);      // flat, PyTorch's dotted keys
#ifndef BUCKETALLOC_STATS_H_
#define BUCKETALLOC_STATS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bucketalloc/stat_types.h"
#include "bucketalloc/units.h"

namespace bucketalloc {

// Returns a flat JSON object with PyTorch's dotted keys, e.g. "allocated_bytes.all.current",
// "reserved_bytes.large_pool.peak", "num_alloc_retries", "oversize_allocations.current".
std::string StatsToJson(const DeviceStats& stats);

// The fragmentation report as JSON: {"all": ..., "small_pool": ..., "large_pool": ..., "tiers": [...]}.
std::string FragmentationToJson(const FragmentationReport& report);
// A readable table: the histogram bins that are non-empty, the fragmentation ratios, the tiers.
std::string FragmentationToTable(const FragmentationReport& report);

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
// tenant is bound to; its cap is the device's) first, then the tenants in their order. The bytes
// are its own pools': reserved (backend memory), allocated (live blocks), requested (what their
// callers asked for), cached (reserved - allocated - pending: free for the tenant only).
struct TenantStats {
  std::string name;
  std::size_t cap = 0;
  std::size_t reserved = 0;
  std::size_t peak_reserved = 0;
  std::size_t allocated = 0;
  std::size_t requested = 0;
  std::size_t cached = 0;
  std::int64_t live_allocations = 0;
  std::int64_t ooms = 0;
  std::int64_t ooms_at_cap = 0;  // of those, refused by its own cap (not the device's)
};
std::string TenantStatsToJson(const std::vector<TenantStats>& tenants);

struct OomReport {
  int device = 0;
  // The tenant of the request ("" without tenants) and its cap; at_tenant_cap when that cap, not
  // the device's, refused the growth (the numbers below are then the tenant's).
  std::string tenant;
  std::size_t tenant_cap = 0;
  bool at_tenant_cap = false;
  std::size_t requested = 0;
  std::size_t rounded = 0;
  std::size_t capacity = 0;
  std::size_t reserved = 0;
  std::size_t allocated = 0;
  std::size_t active = 0;
  std::size_t cached = 0;
  std::size_t largest_free = 0;
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
};

// torch.cuda.memory_summary()'s table, rendered from `stats` exactly as torch renders it
// (torch/cuda/memory.py); `abbreviated` leaves out the per-pool rows, as torch's does.
std::string TorchMemorySummary(const DeviceStats& stats, int device, bool abbreviated);
// The readable summary: TorchMemorySummary, then bucketalloc's rows (the cap, cached bytes per pool,
// every counter).
std::string StatsSummary(const DeviceStats& stats, int device);

}  // namespace bucketalloc

#endif  // BUCKETALLOC_STATS_H_
