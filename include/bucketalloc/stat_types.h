// bucketalloc/stat_types.h — the statistics as data (layer L0: usable by every layer).
//
// Owns: the stat declarations (one X-macro list each, from which the struct, the JSON with
// PyTorch's memory_stats() key names, the summary table and the invariant checks are generated),
// the pools' indices and names, and the fragmentation report's data. The renderings (JSON,
// tables) and the OOM report are bucketalloc/stats.h (front end).
// Thread-safety: value types, copied out under the device lock.
//
// Example:
//   bucketalloc::DeviceStats s = *allocator->GetStats(0);
//   s.allocated_bytes[bucketalloc::kAllPools].current;  // PyTorch "allocated_bytes.all.current"
#ifndef BUCKETALLOC_STAT_TYPES_H_
#define BUCKETALLOC_STAT_TYPES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "bucketalloc/stat_list.h"  // the X-macro lists of every stat

namespace bucketalloc {

// Pools of a stat array, in PyTorch's order and naming ("all", "small_pool", "large_pool"). Every
// pool has an index from 1; index 0 is their sum.
enum PoolIndex : int { kAllPools = 0, kSmallPool = 1, kLargePool = 2, kNumPoolIndices = 3 };

// A pool's names: its key in stats and reports ("small_pool") and its label in tables ("small pool").
struct PoolName {
  const char* key;
  const char* label;
};
inline constexpr PoolName kPoolNames[kNumPoolIndices] = {
    {"all", "all pools"}, {"small_pool", "small pool"}, {"large_pool", "large pool"}};

// One gauge: PyTorch's current / peak / allocated (sum of increments) / freed (sum of decrements).
// Invariant: current == allocated - freed (after a reset of the accumulated stats, which zeroes the
// totals: current == its value then + allocated - freed); peak >= current >= 0.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void Add(std::int64_t delta) {
    if (delta > 0) {
      Increase(delta);
    } else {
      Decrease(-delta);
    }
  }
  // Adds n >= 0.
  void Increase(std::int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  // Subtracts n >= 0.
  void Decrease(std::int64_t n) {
    current -= n;
    freed += n;
  }
  void ResetPeak() { peak = current; }
};
using StatArray = std::array<Stat, kNumPoolIndices>;

// Gauges per pool: X(name, meaning). The name is PyTorch's memory_stats() prefix where it exists.
struct PrivatePoolStats {
  std::uint64_t id_first = 0;
  std::uint64_t id_second = 0;
  StatArray reserved_bytes;
};

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
  // Each private pool's reserved bytes (CUDA graphs), as PyTorch's memory_stats() reports them
  // under "reserved_bytes_by_private_pools.<first>_<second>.<pool>.<metric>".
  std::vector<PrivatePoolStats> reserved_bytes_by_private_pools;

  // Resets every gauge's peak to its current value.
  void ResetPeaks();
};

// ---------------------------------------------------------------------------------------------
// Fragmentation.

// Free blocks in power-of-two size bins: bin i counts free blocks with 2^i <= size < 2^(i+1).
inline constexpr int kHistogramBins = 48;

struct PoolFragmentation {
  std::array<std::int64_t, kHistogramBins> free_count{};
  std::array<std::int64_t, kHistogramBins> free_bytes{};
  std::int64_t total_free = 0;    // bytes of all free blocks (cached, not pending)
  std::int64_t largest_free = 0;  // the largest single free block
  std::int64_t requested = 0;     // live requested bytes
  std::int64_t allocated = 0;     // live allocated bytes
  std::int64_t reserved = 0;
  // Counts `count` free blocks of `size` bytes (size > 0) in the histogram and the totals.
  void AddFree(std::size_t size, std::int64_t count = 1);
  // Adds another pool's histogram and totals (the "all" report is the sum of the pools').
  void Merge(const PoolFragmentation& other);
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
  // By PoolIndex: pools[kAllPools] is every pool together.
  std::array<PoolFragmentation, kNumPoolIndices> pools;
  std::vector<TierUsage> tiers;

  PoolFragmentation& all() { return pools[kAllPools]; }
  const PoolFragmentation& all() const { return pools[kAllPools]; }
  const PoolFragmentation& small_pool() const { return pools[kSmallPool]; }
  const PoolFragmentation& large_pool() const { return pools[kLargePool]; }
};

}  // namespace bucketalloc

#endif  // BUCKETALLOC_STAT_TYPES_H_
