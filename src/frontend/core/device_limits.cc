// src/frontend/core/device_limits.cc — the limits set while a device runs: the memory fraction
// (the cap) and each tenant's cap (DeviceAllocator's methods; frontend/core/device_allocator.h).
#include "frontend/core/device_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace bucketalloc::internal {

absl::StatusOr<std::size_t> DeviceAllocator::ComputeCap(std::size_t capacity, double fraction, std::size_t total,
                                                        std::size_t granularity, int device) {
  std::size_t cap = capacity == 0 ? total : std::min(capacity, total);
  const auto by_fraction = static_cast<std::size_t>(fraction * static_cast<double>(total));
  cap = std::min(cap, by_fraction) / granularity * granularity;
  if (cap > 0) return cap;
  return absl::InvalidArgumentError(absl::StrCat(
      "bucketalloc: capacity:", SizeText(capacity), " and memory_fraction:", NumberText(fraction), " give device ",
      device, " (", FormatBytes(total), ") a cap of ",
      FormatBytes(std::min(capacity == 0 ? total : capacity, by_fraction)), ", less than one ",
      FormatBytes(granularity),
      " granule, so every allocation would fail; accepted: a capacity of 0 "
      "(the whole device) or at least one granule, and a memory_fraction that leaves at least one granule"));
}

absl::Status DeviceAllocator::SetMemoryFraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: memory fraction ", fraction, " for device ", device_,
                                                   " is invalid; accepted: a number in (0, 1]"));
  }
  absl::StatusOr<std::size_t> cap =
      ComputeCap(options_.capacity, fraction, device_total_, backend_->Granularity(), device_);
  if (!cap.ok()) return cap.status();  // the cap stays as it was
  MutexLock lock(mu_);
  registry_.set_cap(*cap);
  stats_.SetCapacity(static_cast<std::int64_t>(registry_.cap()));
  memory_fraction_ = fraction;
  return absl::OkStatus();
}

double DeviceAllocator::memory_fraction() const {
  MutexLock lock(mu_);
  return memory_fraction_;
}

absl::Status DeviceAllocator::SetTenantCap(int index, std::size_t cap) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  EndAbandonedCaptures();
  if (CaptureMayRun() && tenants_.ReservesOver(index, cap)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucketalloc: lowering tenant '", tenants_.tenants().Name(index), "''s cap below what it reserves on device ",
        device_,
        " during CUDA graph capture: releasing its cache needs the synchronization and frees CUDA forbids then; "
        "the cap is unchanged. Set it after the capture ends"));
  }
  tenants_.ApplyCap(index, cap);
  if (!tenants_.ReservesOver(index, cap)) return absl::OkStatus();
  // Over the new cap: give back what the tenant caches (after waiting for every pending free's
  // stream events); live blocks stay, and its growth is refused until it fits
  // (SegmentRegistry::Headroom).
  SyncPendingFrees();
  ReleasePoolCache(tenants_.PoolTag(index));
  registry_.TrimAddressSpace();
  if (tenants_.ReservesOver(index, cap)) tenants_.set_over_cap();  // live memory above it: its frees give it back
  MaybeCheckInvariants();
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
