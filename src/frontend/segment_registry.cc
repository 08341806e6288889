// src/frontend/segment_registry.cc — the cap, the backend calls that give and take device memory,
// and their registry (frontend/segment_registry.h).
#include "frontend/segment_registry.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "internal/check.h"

namespace bucketalloc::internal {

absl::Status SegmentRegistry::CheckHeadroom(std::size_t bytes) const {
  if (Headroom() >= bytes) return absl::OkStatus();
  stats_->Count(&DeviceStats::num_oom_rejections);  // PyTorch's count of allocations over its fraction limit
  return absl::ResourceExhaustedError(
      absl::StrCat("bucketalloc: reserving ", bytes, " more bytes would exceed the cap of ", cap_, " bytes (",
                   stats_->Current(&DeviceStats::reserved_bytes, kAllPools), " reserved)"));
}

std::size_t SegmentRegistry::Headroom() const {
  const auto reserved = static_cast<std::size_t>(stats_->Current(&DeviceStats::reserved_bytes, kAllPools));
  return cap_ > reserved ? cap_ - reserved : 0;
}

absl::StatusOr<std::uintptr_t> SegmentRegistry::AllocateSegment(std::size_t bytes, PoolIndex pool) {
  if (collect_ && !capturing_) collect_(bytes);  // no release during a capture
  if (absl::Status s = CheckHeadroom(bytes); !s.ok()) return s;
  absl::StatusOr<void*> p = backend_->Allocate(bytes);
  if (!p.ok()) return p.status();
  const auto base = reinterpret_cast<std::uintptr_t>(*p);
  ranges_.emplace(base, Range{base, bytes, pool, false, 0, owner_});
  stats_->Increase(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
  CountOwned(owner_, pool, static_cast<std::int64_t>(bytes));
  stats_->Increase(&DeviceStats::segment, pool, 1);
  stats_->Count(&DeviceStats::num_device_alloc);
  history_->Record(TraceAction::kSegmentAlloc, base, bytes, slow_path_stream_);
  return base;
}

bool SegmentRegistry::ReleaseSegment(std::uintptr_t base, std::size_t bytes, PoolIndex pool) {
  if (absl::Status s = backend_->Free(reinterpret_cast<void*>(base), bytes); !s.ok()) {
    stats_->Count(&DeviceStats::num_device_free_failures);
    return false;
  }
  auto it = ranges_.find(base);
  CountOwned(it->second.owner, pool, -static_cast<std::int64_t>(bytes));
  ranges_.erase(it);
  stats_->Decrease(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
  stats_->Decrease(&DeviceStats::segment, pool, 1);
  stats_->Count(&DeviceStats::num_device_free);
  history_->Record(TraceAction::kSegmentFree, base, bytes, nullptr);
  return true;
}

absl::StatusOr<std::uintptr_t> SegmentRegistry::ReserveRange(std::size_t bytes, std::size_t to_map) {
  if (to_map > 0 && collect_ && !capturing_) collect_(to_map);
  absl::StatusOr<std::uintptr_t> va = backend_->ReserveAddressRange(bytes, granularity_);
  if (!va.ok()) return va.status();
  ranges_.emplace(*va, Range{*va, bytes, kLargePool, /*virtual_memory=*/true, /*mapped=*/0, owner_});
  stats_->Increase(&DeviceStats::segment, kLargePool, 1);
  history_->Record(TraceAction::kSegmentAlloc, *va, bytes, slow_path_stream_);
  return *va;
}

void SegmentRegistry::ReleaseRange(std::uintptr_t va, std::size_t bytes) {
  auto it = ranges_.find(va);
  BA_CHECK(it != ranges_.end() && it->second.virtual_memory && it->second.mapped == 0,
           "releasing a range still mapped");
  if (!backend_->ReleaseAddressRange(va, bytes).ok()) {
    stats_->Count(&DeviceStats::num_device_free_failures);  // only address space
  }
  ranges_.erase(it);
  stats_->Decrease(&DeviceStats::segment, kLargePool, 1);
  history_->Record(TraceAction::kSegmentFree, va, bytes, nullptr);
}

absl::StatusOr<PhysicalHandle> SegmentRegistry::CreateGranule() {
  if (absl::Status s = CheckHeadroom(granularity_); !s.ok()) return s;
  absl::StatusOr<PhysicalHandle> h = backend_->CreatePhysical(granularity_);
  if (!h.ok()) return h.status();
  stats_->Increase(&DeviceStats::reserved_bytes, kLargePool, static_cast<std::int64_t>(granularity_));
  CountOwned(owner_, kLargePool, static_cast<std::int64_t>(granularity_));
  return *h;
}

bool SegmentRegistry::ReleaseGranule(PhysicalHandle handle) {
  if (!backend_->ReleasePhysical(handle).ok()) {
    stats_->Count(&DeviceStats::num_device_free_failures);
    return false;
  }
  stats_->Decrease(&DeviceStats::reserved_bytes, kLargePool, static_cast<std::int64_t>(granularity_));
  CountOwned(owner_, kLargePool, -static_cast<std::int64_t>(granularity_));
  return true;
}

absl::Status SegmentRegistry::MapGranules(std::uintptr_t va, absl::Span<const PhysicalHandle> handles,
                                          std::size_t* mapped) {
  absl::Status s = backend_->MapRun(va, handles, granularity_, mapped);
  if (*mapped > 0) {
    // Inside a registered range (the backend checked).
    std::prev(ranges_.upper_bound(va))->second.mapped += *mapped * granularity_;
  }
  for (std::size_t i = 0; i < *mapped; ++i) {
    history_->Record(TraceAction::kSegmentMap, va + i * granularity_, granularity_, slow_path_stream_);
  }
  return s;
}

absl::Status SegmentRegistry::UnmapGranule(std::uintptr_t va) {
  if (absl::Status s = backend_->Unmap(va, granularity_); !s.ok()) return s;
  std::prev(ranges_.upper_bound(va))->second.mapped -= granularity_;
  history_->Record(TraceAction::kSegmentUnmap, va, granularity_, slow_path_stream_);
  return absl::OkStatus();
}

absl::Status SegmentRegistry::SynchronizeStream(Stream stream) {
  if (retired_.contains(stream)) return absl::OkStatus();
  if (IsPseudoStream(stream)) return backend_->SynchronizeDevice();
  absl::StatusOr<Event> e = backend_->RecordEvent(stream);
  if (!e.ok()) return e.status();
  absl::Status s = backend_->SynchronizeEvent(*e);
  backend_->DestroyEvent(*e);
  return s;
}

absl::Status SegmentRegistry::RetireStream(Stream stream) {
  retired_.erase(stream);
  if (absl::Status s = SynchronizeStream(stream); !s.ok()) return s;
  retired_.insert(stream);
  return absl::OkStatus();
}

void SegmentRegistry::CountOwned(std::uint16_t owner, PoolIndex pool, std::int64_t delta) {
  if (owner == 0) return;
  StatArray& a = owned_[owner];
  a[pool].Add(delta);
  a[kAllPools].Add(delta);
}

const StatArray* SegmentRegistry::OwnedReserved(std::uint16_t tag) const {
  auto it = owned_.find(tag);
  return it == owned_.end() ? nullptr : &it->second;
}

void SegmentRegistry::ResetOwnedPeaks() {
  for (auto& [tag, a] : owned_)
    for (Stat& s : a) s.ResetPeak();
}

std::optional<SegmentRegistry::Range> SegmentRegistry::Holding(std::uintptr_t addr, std::size_t size) const {
  auto it = ranges_.upper_bound(addr);
  if (it == ranges_.begin()) return std::nullopt;
  --it;
  if (addr + size > it->first + it->second.bytes) return std::nullopt;
  return it->second;
}

std::optional<SegmentRegistry::Range> SegmentRegistry::At(std::uintptr_t base) const {
  auto it = ranges_.find(base);
  if (it == ranges_.end()) return std::nullopt;
  return it->second;
}

SegmentRegistry::Totals SegmentRegistry::totals() const {
  Totals t;
  for (const auto& [base, r] : ranges_) {
    t.reserved[r.pool] += static_cast<std::int64_t>(r.virtual_memory ? r.mapped : r.bytes);
    t.segments[r.pool] += 1;
    t.ranges += r.virtual_memory;
  }
  return t;
}

std::int64_t SegmentRegistry::LargeRangesOver(std::size_t bytes) const {
  std::int64_t n = 0;
  for (const auto& [base, r] : ranges_) n += r.pool == kLargePool && r.bytes > bytes;
  return n;
}

absl::Status SegmentRegistry::CheckInvariants(std::size_t spare_bytes) const {
  auto fail = [](absl::string_view what) { return absl::InternalError(absl::StrCat("segment registry: ", what)); };
  std::uintptr_t end = 0;
  std::int64_t allocations = 0, allocation_bytes = 0;
  std::size_t granule_bytes = spare_bytes;
  for (const auto& [base, r] : ranges_) {
    if (base < end) return fail("registered segments overlap");
    if (r.base != base || (!r.virtual_memory && r.mapped != 0) || r.mapped > r.bytes) {
      return fail(absl::StrCat("the range at ", absl::Hex(base), " is inconsistent"));
    }
    end = base + r.bytes;
    allocations += !r.virtual_memory;
    allocation_bytes += r.virtual_memory ? 0 : static_cast<std::int64_t>(r.bytes);
    granule_bytes += r.mapped;
  }
  const BackendCounters c = backend_->counters();
  // Bytes are held against the backend's own count when it keeps one (BackendCounters: optional).
  const bool counts_bytes = c.alloc_bytes != 0 || c.free_bytes != 0;
  if (c.allocs - c.frees != allocations || (counts_bytes && c.alloc_bytes - c.free_bytes != allocation_bytes)) {
    return fail(absl::StrCat("the backend holds ", c.allocs - c.frees, " allocations of ", c.alloc_bytes - c.free_bytes,
                             " bytes but ", allocations, " segments of ", allocation_bytes, " bytes are registered"));
  }
  if (c.physical_creates - c.physical_releases != static_cast<std::int64_t>(granule_bytes / granularity_)) {
    return fail(absl::StrCat("the backend holds ", c.physical_creates - c.physical_releases, " physical granules but ",
                             granule_bytes / granularity_, " are mapped or spare"));
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
