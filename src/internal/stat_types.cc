// src/internal/stat_types.cc — the few computations on the stat data (bucketalloc/stat_types.h).
#include "bucketalloc/stat_types.h"

#include <algorithm>

#include "internal/bits.h"

namespace bucketalloc {

void DeviceStats::ResetPeaks() {
#define BUCKETALLOC_RESET_PEAK(name, doc) \
  for (Stat & s : name) s.ResetPeak();
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_RESET_PEAK)
#undef BUCKETALLOC_RESET_PEAK
#define BUCKETALLOC_RESET_DEVICE_PEAK(name, doc) name.ResetPeak();
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_RESET_DEVICE_PEAK)
#undef BUCKETALLOC_RESET_DEVICE_PEAK
}

void PoolFragmentation::AddFree(std::size_t size, std::int64_t count) {
  if (count == 0) return;
  const auto bytes = static_cast<std::int64_t>(size);
  const int bin = std::min(internal::Log2Floor(size), kHistogramBins - 1);
  free_count[bin] += count;
  free_bytes[bin] += bytes * count;
  total_free += bytes * count;
  largest_free = std::max(largest_free, bytes);
}

void PoolFragmentation::Merge(const PoolFragmentation& other) {
  for (int i = 0; i < kHistogramBins; ++i) {
    free_count[i] += other.free_count[i];
    free_bytes[i] += other.free_bytes[i];
  }
  total_free += other.total_free;
  largest_free = std::max(largest_free, other.largest_free);
  requested += other.requested;
  allocated += other.allocated;
  reserved += other.reserved;
}

double PoolFragmentation::external_fragmentation() const {
  return total_free == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(total_free);
}

double PoolFragmentation::internal_fragmentation() const {
  return allocated == 0 ? 0.0 : 1.0 - static_cast<double>(requested) / static_cast<double>(allocated);
}

}  // namespace bucketalloc
