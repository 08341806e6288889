// bucketalloc/stats.h — statistics, the fragmentation histogram and the OOM report.
//
// Owns: the stat declarations (one X-macro list each, from which the struct, the JSON with
// PyTorch's memory_stats() key names and the summary table are generated), the fragmentation
// report, and the out-of-memory report with its one-line diagnosis.
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

namespace bucketalloc {

// Pools of a stat array, in PyTorch's order and naming ("all", "small_pool", "large_pool").
enum PoolIndex : int { kAllPools = 0, kSmallPool = 1, kLargePool = 2, kNumPoolIndices = 3 };

// One gauge: PyTorch's current / peak / allocated (sum of increments) / freed (sum of decrements).
// Invariant: current == allocated - freed; peak >= current.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void Add(std::int64_t delta) {
    current += delta;
    if (delta > 0) {
      allocated += delta;
      if (current > peak) peak = current;
    } else {
      freed -= delta;
    }
  }
  void ResetPeak() { peak = current; }
};
using StatArray = std::array<Stat, kNumPoolIndices>;

// Gauges per pool: X(name, meaning). The name is PyTorch's memory_stats() prefix where it exists.
#define BUCKETALLOC_POOL_STATS(X)                                                              \
  X(requested_bytes, "bytes the callers asked for, of live allocations")                     \
  X(allocated_bytes, "bytes of live allocations after rounding (block sizes)")               \
  X(active_bytes, "allocated bytes plus blocks freed but awaiting stream events")            \
  X(reserved_bytes, "bytes obtained from the backend (segments and slabs; vmm: granules)")   \
  X(cached_bytes, "reserved bytes not active: free blocks kept for reuse")                   \
  X(inactive_split_bytes, "free bytes inside segments or slabs that also hold active blocks") \
  X(allocation, "number of live allocations")                                                \
  X(active, "number of active blocks (live or awaiting stream events)")                      \
  X(segment, "number of backend allocations held (segments and slabs)")                      \
  X(inactive_split, "number of free blocks inside partly used segments and slabs")

// Event counters: X(name, meaning). PyTorch's names where they exist.
#define BUCKETALLOC_COUNTERS(X)                                                              \
  X(num_alloc_retries, "allocations that released the cache and retried")                   \
  X(num_ooms, "allocations that failed with out-of-memory")                                 \
  X(num_device_alloc, "backend allocations (cudaMalloc calls that succeeded)")              \
  X(num_device_free, "backend frees (cudaFree calls)")                                      \
  X(num_device_free_failures, "backend frees that failed (the memory stayed cached)")        \
  X(num_sync_all_streams, "times pending stream events were synchronized to release memory") \
  X(num_splits, "free blocks split to serve a smaller request")                             \
  X(num_merges, "adjacent free blocks coalesced")                                           \
  X(num_cache_hits, "allocations served from cached memory without a backend call")         \
  X(num_cache_misses, "allocations that needed a new segment or slab")                      \
  X(num_tier_fallbacks, "tier requests served at their exact rounded size instead")         \
  X(num_gc_releases, "segments and slabs released by garbage_collection_threshold")                   \
  X(num_invalid_frees, "frees rejected (unknown pointer, double free, size mismatch)")        \
  X(num_capture_refusals, "allocations refused during CUDA graph capture (no cached block fit)") \
  X(num_deferred_frees, "cross-stream frees whose events were recorded later (a capture ran, or recording failed)") \
  X(num_stitches, "large allocations served by stitching granules of free blocks into a new range (vmm)") \
  X(num_granules_stitched, "physical granules unmapped from free blocks and mapped into a stitched range (vmm)") \
  X(num_granules_released, "physical granules of free blocks unmapped and given back to the device (vmm)")

// Device-wide gauges (no per-pool split, as in PyTorch): X(name, meaning).
#define BUCKETALLOC_DEVICE_STATS(X)                                             \
  X(oversize_allocations, "live allocations larger than max_split_size")      \
  X(oversize_segments, "segments larger than max_split_size")

// A snapshot of one device's statistics.
struct DeviceStats {
#define BUCKETALLOC_DECLARE_POOL_STAT(name, doc) StatArray name;
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_DECLARE_POOL_STAT)
#undef BUCKETALLOC_DECLARE_POOL_STAT
#define BUCKETALLOC_DECLARE_COUNTER(name, doc) std::int64_t name = 0;
  BUCKETALLOC_COUNTERS(BUCKETALLOC_DECLARE_COUNTER)
#undef BUCKETALLOC_DECLARE_COUNTER
#define BUCKETALLOC_DECLARE_DEVICE_STAT(name, doc) Stat name;
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_DECLARE_DEVICE_STAT)
#undef BUCKETALLOC_DECLARE_DEVICE_STAT
  std::int64_t max_split_size = -1;  // PyTorch reports -1 for "unlimited"
  std::int64_t capacity_bytes = 0;   // the effective cap

  // Resets every gauge's peak to its current value.
  void ResetPeaks();
};

// Returns a flat JSON object with PyTorch's dotted keys, e.g. "allocated_bytes.all.current",
// "reserved_bytes.large_pool.peak", "num_alloc_retries", "oversize_allocations.current".
std::string StatsToJson(const DeviceStats& stats);

// ---------------------------------------------------------------------------------------------
// Fragmentation.

// Free blocks in power-of-two size bins: bin i counts free blocks with 2^i <= size < 2^(i+1).
inline constexpr int kHistogramBins = 48;

struct PoolFragmentation {
  std::array<std::int64_t, kHistogramBins> free_count{};
  std::array<std::int64_t, kHistogramBins> free_bytes{};
  std::int64_t total_free = 0;     // bytes of all free blocks (cached, not pending)
  std::int64_t largest_free = 0;   // the largest single free block
  std::int64_t requested = 0;      // live requested bytes
  std::int64_t allocated = 0;      // live allocated bytes
  std::int64_t reserved = 0;
  // 1 - largest_free / total_free (0 when nothing is free).
  double external_fragmentation() const;
  // 1 - requested / allocated (0 when nothing is allocated).
  double internal_fragmentation() const;
};

struct TierUsage {
  std::int64_t tier_bytes = 0;
  std::int64_t in_use = 0;  // blocks of this tier held by callers (or awaiting stream events)
  std::int64_t cached = 0;  // free blocks of this tier kept for reuse
};

struct FragmentationReport {
  PoolFragmentation small_pool;
  PoolFragmentation large_pool;
  PoolFragmentation all;  // both pools together
  std::vector<TierUsage> tiers;
};

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
};

const char* OomCauseName(OomCause cause);

struct OomReport {
  int device = 0;
  std::size_t requested = 0;
  std::size_t rounded = 0;
  std::size_t capacity = 0;
  std::size_t reserved = 0;
  std::size_t allocated = 0;
  std::size_t active = 0;
  std::size_t cached = 0;
  std::size_t largest_free = 0;
  std::size_t device_free = 0;  // as the backend reported it
  OomCause cause = OomCause::kCapacity;
  std::string diagnosis;  // one line, names the cause and the numbers behind it
  FragmentationReport fragmentation;

  std::string ToString() const;  // the diagnosis, the numbers and the histogram
  std::string ToJson() const;
};

// The readable table like torch.cuda.memory_summary().
std::string StatsSummary(const DeviceStats& stats, int device);

}  // namespace bucketalloc

#endif  // BUCKETALLOC_STATS_H_
