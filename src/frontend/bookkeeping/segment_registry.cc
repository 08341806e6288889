// src/frontend/bookkeeping/segment_registry.cc — the cap, the backend calls that give and take device memory,
// and their registry (frontend/bookkeeping/segment_registry.h).
#include "frontend/bookkeeping/segment_registry.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "internal/check.h"

namespace bucketalloc::internal {

absl::Status SegmentRegistry::CheckHeadroom(std::size_t bytes) const {
  if (Headroom() >= bytes) return absl::OkStatus();
  stats_->Count(&DeviceStats::num_oom_rejections);  // PyTorch's count of allocations over its fraction limit
  if (OverOwnerCap(owner_, bytes)) {
    const OwnerCapEntry& c = owner_caps_.at(owner_);
    return absl::ResourceExhaustedError(absl::StrCat("bucketalloc: reserving ", bytes,
                                                     " more bytes would exceed tenant '", c.name, "''s cap of ", c.cap,
                                                     " bytes (", OwnedNow(owner_), " reserved by it)"));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("bucketalloc: reserving ", bytes, " more bytes would exceed the cap of ", cap_, " bytes (",
                   stats_->Current(&DeviceStats::reserved_bytes, kAllPools), " reserved)"));
}

std::size_t SegmentRegistry::Headroom() const {
  const auto reserved = static_cast<std::size_t>(stats_->Current(&DeviceStats::reserved_bytes, kAllPools));
  std::size_t headroom = cap_ > reserved ? cap_ - reserved : 0;
  if (const std::optional<std::size_t> cap = owner_caps_.empty() ? std::nullopt : OwnerCap(owner_)) {
    const std::size_t owned = OwnedNow(owner_);
    headroom = std::min(headroom, *cap > owned ? *cap - owned : 0);
  }
  return headroom;
}

std::size_t SegmentRegistry::OwnedNow(std::uint16_t tag) const {
  const StatArray* a = OwnedReserved(tag);
  return a == nullptr ? 0 : static_cast<std::size_t>((*a)[kAllPools].current);
}

absl::StatusOr<std::uintptr_t> SegmentRegistry::AllocateSegment(std::size_t bytes, PoolIndex pool) {
  if (collect_ && !capturing_) collect_(bytes);  // no release during a capture
  if (absl::Status s = CheckHeadroom(bytes); !s.ok()) return s;
  SegmentAllocator* const external = owner_ != 0 && allocator_of_ ? allocator_of_(owner_) : nullptr;
  absl::StatusOr<void*> p =
      external != nullptr ? external->Allocate(bytes, slow_path_stream_) : backend_->Allocate(bytes);
  if (!p.ok()) return p.status();
  const auto base = reinterpret_cast<std::uintptr_t>(*p);
  if (external != nullptr) {
    if (absl::Status s = CheckExternalSegment(*external, base, bytes); !s.ok()) return s;
  }
  ranges_.emplace(base, Range{base, bytes, pool, false, 0, owner_, external != nullptr});
  stats_->Increase(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
  CountOwned(owner_, pool, static_cast<std::int64_t>(bytes));
  stats_->Increase(&DeviceStats::segment, pool, 1);
  stats_->Count(&DeviceStats::num_device_alloc);
  history_->Record(TraceAction::kSegmentAlloc, base, bytes, slow_path_stream_, 0, owner_);
  return base;
}

absl::Status SegmentRegistry::CheckExternalSegment(SegmentAllocator& external, std::uintptr_t base,
                                                   std::size_t bytes) const {
  // The refusal's subject, built only when there is one (this runs on every external segment).
  auto what = [&] {
    return absl::StrCat("bucketalloc: a private pool's segment allocator (MemPool(allocator)) returned 0x",
                        absl::Hex(base), " for a segment of ", bytes, " bytes");
  };
  if (base == 0) {
    return absl::InternalError(absl::StrCat(what(), " (NULL with success); accepted: memory, or no memory"));
  }
  if (base > std::numeric_limits<std::uintptr_t>::max() - bytes) {
    return absl::InternalError(absl::StrCat(what(), ", which runs past the end of the address space; refused"));
  }
  // The registered range that starts last before the new one's end: the only one it can overlap.
  auto it = ranges_.lower_bound(base + bytes);
  if (it != ranges_.begin() && std::prev(it)->second.base + std::prev(it)->second.bytes > base) {
    const Range& held = std::prev(it)->second;
    // Not given back: its free would release memory the live segment's blocks use.
    return absl::InternalError(absl::StrCat(
        what(), ", which overlaps the ", held.external ? "segment it gave before" : "device memory", " at [0x",
        absl::Hex(held.base), ", 0x", absl::Hex(held.base + held.bytes),
        "); refused, and not given back to it (its free could release memory live blocks use); accepted: memory no "
        "segment holds"));
  }
  if (base % kSegmentAlignment != 0) {
    external.Free(reinterpret_cast<void*>(base), bytes);
    return absl::InternalError(absl::StrCat(what(), ", which is not ", kSegmentAlignment,
                                            "-byte aligned (every block is); refused and given back to it"));
  }
  return absl::OkStatus();
}

bool SegmentRegistry::ReleaseSegment(std::uintptr_t base, std::size_t bytes, PoolIndex pool) {
  auto it = ranges_.find(base);
  BA_CHECK(it != ranges_.end(), "releasing a segment that is not registered");
  if (it->second.external) {
    SegmentAllocator* const external = allocator_of_(it->second.owner);
    BA_CHECK(external != nullptr, "a segment of another allocator outlived its allocator");
    external->Free(reinterpret_cast<void*>(base), bytes);
  } else if (absl::Status s = backend_->Free(reinterpret_cast<void*>(base), bytes); !s.ok()) {
    stats_->Count(&DeviceStats::num_device_free_failures);
    return false;
  }
  const std::uint16_t owner = it->second.owner;
  CountOwned(owner, pool, -static_cast<std::int64_t>(bytes));
  ranges_.erase(it);
  stats_->Decrease(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
  stats_->Decrease(&DeviceStats::segment, pool, 1);
  stats_->Count(&DeviceStats::num_device_free);
  history_->Record(TraceAction::kSegmentFree, base, bytes, nullptr, 0, owner);
  return true;
}

absl::StatusOr<std::uintptr_t> SegmentRegistry::ReserveRange(std::size_t bytes, std::size_t to_map, PoolIndex pool) {
  CollectFor(to_map);
  // Reservations of 1 1/4 x the cap: a plain segment's range of the cap's size (GrowableRangeBytes)
  // leaves room for the tier segments and stitches beside it, and most grows make no address call.
  absl::StatusOr<std::uintptr_t> va = arena_.Carve(bytes, cap_ + cap_ / 4);
  if (!va.ok()) return va.status();
  ranges_.emplace(*va, Range{*va, bytes, pool, /*virtual_memory=*/true, /*mapped=*/0, owner_});
  stats_->Increase(&DeviceStats::segment, pool, 1);
  history_->Record(TraceAction::kSegmentAlloc, *va, bytes, slow_path_stream_, 0, owner_);
  return *va;
}

void SegmentRegistry::ReleaseRange(std::uintptr_t va, std::size_t bytes) {
  auto it = ranges_.find(va);
  BA_CHECK(it != ranges_.end() && it->second.virtual_memory && it->second.mapped == 0,
           "releasing a range still mapped");
  const std::uint16_t owner = it->second.owner;
  const PoolIndex pool = it->second.pool;
  arena_.Return(va, bytes);
  ranges_.erase(it);
  stats_->Decrease(&DeviceStats::segment, pool, 1);
  history_->Record(TraceAction::kSegmentFree, va, bytes, nullptr, 0, owner);
}

void SegmentRegistry::AbandonRange(std::uintptr_t va, std::size_t bytes) {
  auto it = ranges_.find(va);
  BA_CHECK(it != ranges_.end() && it->second.virtual_memory, "abandoning a range that is not registered");
  const PoolIndex pool = it->second.pool;
  ranges_.erase(it);  // it stays carved from its reservation, which is then never freed
  stats_->Decrease(&DeviceStats::segment, pool, 1);
  stats_->Count(&DeviceStats::num_device_free_failures);
  history_->Record(TraceAction::kSegmentFree, va, bytes, nullptr);
}

void SegmentRegistry::TrimAddressSpace() {
  if (!arena_.Trim()) stats_->Count(&DeviceStats::num_device_free_failures);  // only address space
}

absl::StatusOr<PhysicalHandle> SegmentRegistry::CreatePhysical(std::size_t bytes, PoolIndex pool) {
  if (absl::Status s = CheckHeadroom(bytes); !s.ok()) return s;
  absl::StatusOr<PhysicalHandle> h = backend_->CreatePhysical(bytes);
  if (!h.ok()) return h.status();
  ++physical_handles_;
  physical_bytes_ += bytes;
  stats_->Increase(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
  CountOwned(owner_, pool, static_cast<std::int64_t>(bytes));
  return *h;
}

bool SegmentRegistry::ReleasePhysical(const PhysicalPiece& piece, PoolIndex pool) {
  if (!backend_->ReleasePhysical(piece.handle).ok()) {
    stats_->Count(&DeviceStats::num_device_free_failures);
    return false;
  }
  --physical_handles_;
  physical_bytes_ -= piece.bytes;
  stats_->Decrease(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(piece.bytes));
  CountOwned(owner_, pool, -static_cast<std::int64_t>(piece.bytes));
  return true;
}

absl::Status SegmentRegistry::MapPieces(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces,
                                        std::size_t* mapped) {
  absl::Status s = backend_->MapRun(va, pieces, mapped);
  std::size_t bytes = 0;
  Range& range = std::prev(ranges_.upper_bound(va))->second;  // inside a registered range (the backend checked)
  for (std::size_t i = 0; i < *mapped; ++i) {
    history_->Record(TraceAction::kSegmentMap, va + bytes, pieces[i].bytes, slow_path_stream_, 0, range.owner);
    bytes += pieces[i].bytes;
  }
  range.mapped += bytes;
  return s;
}

absl::Status SegmentRegistry::Unmap(std::uintptr_t va, std::size_t bytes) {
  if (absl::Status s = backend_->Unmap(va, bytes); !s.ok()) return s;
  Range& range = std::prev(ranges_.upper_bound(va))->second;
  range.mapped -= bytes;
  history_->Record(TraceAction::kSegmentUnmap, va, bytes, slow_path_stream_, 0, range.owner);
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

void SegmentRegistry::ResetOwnedAccumulated() {
  for (auto& [tag, a] : owned_)
    for (Stat& s : a) s.allocated = s.freed = 0;
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

absl::Status SegmentRegistry::CheckHolds(absl::Span<const std::pair<std::uintptr_t, std::size_t>> blocks) const {
  auto range = ranges_.begin();
  for (const auto& [ptr, size] : blocks) {
    while (range != ranges_.end() && range->first + range->second.bytes <= ptr) ++range;
    if (range == ranges_.end() || range->first > ptr || ptr + size > range->first + range->second.bytes) {
      return absl::InternalError(absl::StrCat("block ", absl::Hex(ptr), " does not lie inside one registered segment"));
    }
  }
  return absl::OkStatus();
}

namespace {

// What CheckUnits compares of a range, mixed into 64 bits (SplitMix64's finalizer over the fields).
std::uint64_t UnitHash(std::uintptr_t base, std::size_t bytes, PoolIndex pool, bool virtual_memory,
                       std::size_t mapped) {
  auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::uint64_t h = mix(base);
  h = mix(h ^ bytes);
  h = mix(h ^ (static_cast<std::uint64_t>(pool) << 1 | static_cast<std::uint64_t>(virtual_memory)));
  return mix(h ^ mapped);
}

}  // namespace

absl::Status SegmentRegistry::CheckUnits(absl::Span<const Range> units) const {
  if (units.size() != ranges_.size()) {
    return absl::InternalError(
        absl::StrCat(ranges_.size(), " ranges are registered for ", units.size(), " segments and slabs of the pools"));
  }
  // The two collections are equal as multisets when the sums of their elements' 64-bit mixes are
  // (a difference passes with a chance of about 2^-64): one pass over each, no sort. On a
  // difference, the unit at fault is looked up for the message.
  std::uint64_t want = 0, got = 0;
  for (const auto& [base, r] : ranges_) {
    want += UnitHash(base, r.bytes, r.pool, r.virtual_memory, r.virtual_memory ? r.mapped : r.bytes);
  }
  for (const Range& u : units) got += UnitHash(u.base, u.bytes, u.pool, u.virtual_memory, u.mapped);
  if (want == got) return absl::OkStatus();
  for (const Range& u : units) {
    auto it = ranges_.find(u.base);
    if (it == ranges_.end() || it->second.bytes != u.bytes || it->second.pool != u.pool ||
        it->second.virtual_memory != u.virtual_memory ||
        (it->second.virtual_memory ? it->second.mapped : it->second.bytes) != u.mapped) {
      return absl::InternalError(absl::StrCat("segment ", absl::Hex(u.base), " does not match its registered range"));
    }
  }
  return absl::InternalError("two segments of the pools name the same registered range");
}

absl::Status SegmentRegistry::CheckInvariants(std::size_t spare_bytes) const {
  auto fail = [](absl::string_view what) { return absl::InternalError(absl::StrCat("segment registry: ", what)); };
  std::uintptr_t end = 0;
  std::int64_t allocations = 0, allocation_bytes = 0;
  std::size_t physical_bytes = spare_bytes;  // mapped or spare
  for (const auto& [base, r] : ranges_) {
    if (base < end) return fail("registered segments overlap");
    if (r.base != base || (!r.virtual_memory && r.mapped != 0) || r.mapped > r.bytes) {
      return fail(absl::StrCat("the range at ", absl::Hex(base), " is inconsistent"));
    }
    end = base + r.bytes;
    if (r.external && (r.virtual_memory || !allocator_of_ || allocator_of_(r.owner) == nullptr)) {
      return fail(absl::StrCat("the segment at ", absl::Hex(base), " of another allocator has no allocator"));
    }
    const bool backend_allocation = !r.virtual_memory && !r.external;  // what the backend's counts hold
    allocations += backend_allocation;
    allocation_bytes += backend_allocation ? static_cast<std::int64_t>(r.bytes) : 0;
    physical_bytes += r.mapped;
  }
  const BackendCounters c = backend_->counters();
  // Bytes are held against the backend's own count when it keeps one (BackendCounters: optional).
  const bool counts_bytes = c.alloc_bytes != 0 || c.free_bytes != 0;
  if (c.allocs - c.frees != allocations || (counts_bytes && c.alloc_bytes - c.free_bytes != allocation_bytes)) {
    return fail(absl::StrCat("the backend holds ", c.allocs - c.frees, " allocations of ", c.alloc_bytes - c.free_bytes,
                             " bytes but ", allocations, " segments of ", allocation_bytes, " bytes are registered"));
  }
  if (c.physical_creates - c.physical_releases != physical_handles_ || physical_bytes_ != physical_bytes) {
    return fail(absl::StrCat("the backend holds ", c.physical_creates - c.physical_releases, " physical allocations, ",
                             physical_handles_, " of ", physical_bytes_, " bytes are counted, and ", physical_bytes,
                             " bytes are mapped or spare"));
  }
  if (absl::Status s = arena_.CheckInvariants(); !s.ok()) return s;
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
