// src/frontend/core/device_reports.cc — what the coordinator reports: stats, metrics, tenant
// stats, fragmentation, the last OOM, PyTorch's cacheInfo, snapshots and the history
// (DeviceAllocator's methods; frontend/core/device_allocator.h).
#include "frontend/core/device_allocator.h"

#include "absl/strings/str_cat.h"
#include "frontend/observability/snapshot_walk.h"

namespace bucketalloc::internal {

std::size_t DeviceAllocator::CacheInfo(bool with_headroom) {
  std::size_t largest = 0;
  std::size_t headroom = 0;
  {
    MutexLock lock(mu_);
    largest = static_cast<std::size_t>(FragmentationLocked().all().largest_free);
    headroom = registry_.Headroom();
  }
  if (with_headroom && headroom > largest) {
    // What the device could still give under the cap: its free memory, asked outside the lock.
    absl::StatusOr<DeviceMemInfo> info = backend_->GetMemInfo();
    if (info.ok()) largest = std::max(largest, std::min(headroom, info->free_bytes));
  }
  return largest;
}

void DeviceAllocator::ResetAccumulatedStats() {
  MutexLock lock(mu_);
  stats_.ResetAccumulated();
  registry_.ResetOwnedAccumulated();
}

void DeviceAllocator::SetTraceHook(TraceHook hook) {
  MutexLock lock(mu_);
  history_.SetHook(hook, device_);
}

DeviceStats DeviceAllocator::GetStats() const {
  MutexLock lock(mu_);
  return StatsLocked();
}

DeviceStats DeviceAllocator::StatsLocked(bool since_start) const {
  DeviceStats s = stats_.Snapshot(since_start);
  private_.ForEach([&](std::uint16_t tag, const PrivatePools::Pool& p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (p.tenant() != 0) return;  // tenants' pools are reported per tenant (GetTenantStats)
    if (const StatArray* reserved = registry_.OwnedReserved(tag)) {
      s.reserved_bytes_by_private_pools.push_back(PrivatePoolStats{p.id.first, p.id.second, *reserved});
    }
  });
  return s;
}

DeviceMetrics DeviceAllocator::GetMetrics() const {
  DeviceMetrics m;
  m.device = device_;
  MutexLock lock(mu_);
  m.stats = StatsLocked(/*since_start=*/true);  // Prometheus counters never go back
  m.fragmentation = FragmentationLocked();
  m.backend_calls = backend_->counters();
  m.recent_ooms = ooms_.recent();
  m.tenants = tenants_.Stats();
  return m;
}

std::vector<TenantStats> DeviceAllocator::GetTenantStats() const {
  MutexLock lock(mu_);
  return tenants_.Stats();
}

void DeviceAllocator::ResetPeakStats() {
  MutexLock lock(mu_);
  stats_.ResetPeaks();
  registry_.ResetOwnedPeaks();
}

std::optional<OomReport> DeviceAllocator::LastOom() const {
  MutexLock lock(mu_);
  return ooms_.last();
}

FragmentationReport DeviceAllocator::GetFragmentation() const {
  MutexLock lock(mu_);
  return FragmentationLocked();
}

FragmentationReport DeviceAllocator::FragmentationLocked() const {
  FragmentationReport r;
  pools_.AddFragmentation(streams_, &r);
  private_.ForEach([&](std::uint16_t, const PrivatePools::Pool& p) { p.pools->AddFragmentation(p.streams, &r); });
  for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) {
    const auto pool = static_cast<PoolIndex>(p);
    r.pools[p].requested = stats_.Current(&DeviceStats::requested_bytes, pool);
    r.pools[p].allocated = stats_.Current(&DeviceStats::allocated_bytes, pool);
    r.pools[p].reserved = stats_.Current(&DeviceStats::reserved_bytes, pool);
    r.all().Merge(r.pools[p]);
  }
  return r;
}

std::size_t DeviceAllocator::SpareBytes() const {
  std::size_t spare = 0;
  ForEachPools(
      [&](const Pools& pools, GraphPoolId) { pools.ForEach([&](const auto& pool) { spare += pool.spare_bytes(); }); });
  return spare;
}

absl::Status DeviceAllocator::SetHistory(bool enabled, std::size_t max_entries) {
  MutexLock lock(mu_);
  absl::Status s = history_.Reset(enabled ? std::max<std::size_t>(max_entries, 1) : 0);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(s.message(), " on device ", device_));
  return s;
}

std::vector<TraceEntry> DeviceAllocator::AppendSnapshot(std::vector<SegmentSnapshot>* segments) const {
  MutexLock lock(mu_);
  absl::flat_hash_map<std::uintptr_t, std::size_t> pending;
  pending_.ForEach([&](std::uintptr_t ptr, const LiveEntry& e) { pending.emplace(ptr, e.requested); });
  const std::size_t first = segments->size();
  ForEachPools([&](const Pools& pools, GraphPoolId id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::vector<SpanView> spans;
    pools.ForEach([&](const auto& pool) { pool.Describe(&spans); });
    const std::size_t before = segments->size();
    AppendSegmentSnapshots(
        device_, std::move(spans),
        [&](std::uintptr_t ptr) ABSL_NO_THREAD_SAFETY_ANALYSIS -> BlockUse {
          if (const LiveEntry* e = live_.Find(ptr)) return {BlockSnapshotState::kActiveAllocated, e->requested};
          auto it = pending.find(ptr);
          return {BlockSnapshotState::kActivePendingFree, it == pending.end() ? 0 : it->second};
        },
        segments);
    const std::string tenant = tenants_.NameOfPool(id);
    for (std::size_t i = before; i < segments->size(); ++i) {
      (*segments)[i].pool_id = id;
      (*segments)[i].tenant = tenant;
    }
  });
  // The device's segments in address order, whichever pool holds them.
  std::sort(segments->begin() + static_cast<std::ptrdiff_t>(first), segments->end(),
            [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.address < b.address; });
  return history_.Entries();
}

}  // namespace bucketalloc::internal
