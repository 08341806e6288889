// src/pool/segment_backing.cc — plain and virtual-memory segments (pool/segment_backing.h).
#include "pool/segment_backing.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/check.h"

namespace bucketalloc::internal {

// ---------------------------------------------------------------------------------------------
// Plain segments: one backend allocation each.

absl::StatusOr<Segment*> PlainBacking::Grow(LargePool& pool, LargePool::StreamState& ss, Stream stream,
                                            std::size_t bytes, int tier) {
  absl::StatusOr<std::uintptr_t> base = source_->AllocateSegment(bytes, pool.config().index);
  if (!base.ok()) return base.status();
  return pool.AddSegment(ss, stream, *base, bytes, tier);
}

bool PlainBacking::Release(LargePool& pool, Segment* seg) {
  const Block* block = seg->first;
  BA_CHECK(block->next == nullptr && block->state == BlockState::kFree, "releasing a split segment");
  if (!source_->ReleaseSegment(seg->base, seg->size, pool.config().index)) return false;  // stays cached
  pool.DropFreeSegment(seg);
  return true;
}

absl::Status PlainBacking::CheckInvariants(const LargePool& pool) const {
  absl::Status status;
  pool.ForEachSegment([&](const Segment& seg) {
    for (const Block* b = seg.first; b != nullptr && status.ok(); b = b->next) {
      if (b->state == BlockState::kUnmapped) {
        status = absl::InternalError(
            absl::StrCat("large pool: segment ", absl::Hex(seg.base), ": a hole in a segment without stitching"));
      }
    }
  });
  return status;
}

// ---------------------------------------------------------------------------------------------
// Virtual-memory segments: ranges of physical granules.

VirtualBacking::VirtualBacking(const PoolContext& ctx, std::size_t granule) : ctx_(ctx), granule_(granule) {
  BA_CHECK(IsPowerOfTwo(granule), "a granule is a power of two");
}

absl::StatusOr<Segment*> VirtualBacking::Grow(LargePool& pool, LargePool::StreamState& ss, Stream stream,
                                              std::size_t bytes, int tier) {
  absl::StatusOr<std::uintptr_t> base = ctx_.source->ReserveRange(bytes, bytes);
  if (!base.ok()) return base.status();
  std::vector<PhysicalHandle> granules;
  if (absl::Status s = TakeGranules(bytes / granule_, &granules); !s.ok()) {
    ReleaseGranules(&granules);
    ctx_.source->ReleaseRange(*base, bytes);
    return s;
  }
  return MapNewSegment(pool, ss, stream, *base, bytes, tier, std::move(granules));
}

bool VirtualBacking::Release(LargePool& pool, Segment* seg) {
  if (!ctx_.source->SynchronizeStream(seg->stream).ok()) {
    ctx_.stats->Count(&DeviceStats::num_device_free_failures);
    return false;
  }
  std::vector<PhysicalHandle> handles;
  absl::Status s;
  while (s.ok() && seg->free_blocks > 0) {
    Block* b = seg->first;
    while (b->state != BlockState::kFree) b = b->next;
    std::size_t g0 = 0, g1 = 0;
    pool.WholeGranules(b, &g0, &g1);  // all of it: its neighbours are holes or the segment's ends
    s = UnmapRun(pool, b, g0, g1, &handles);
  }
  ReleaseGranules(&handles);
  if (!s.ok()) {
    ctx_.stats->Count(&DeviceStats::num_device_free_failures);
    return false;
  }
  pool.DropSegment(seg);
  return true;
}

void VirtualBacking::Forget(const Segment* seg) {
  granules_.erase(seg);
  ctx_.source->ReleaseRange(seg->base, seg->size);
}

absl::Status VirtualBacking::TakeGranules(std::size_t n, std::vector<PhysicalHandle>* out) {
  while (out->size() < n && !spare_.empty()) {
    out->push_back(spare_.back());
    spare_.pop_back();
    ctx_.stats->Decrease(&DeviceStats::cached_bytes, kLargePool, static_cast<std::int64_t>(granule_));
  }
  while (out->size() < n) {
    absl::StatusOr<PhysicalHandle> h = ctx_.source->CreateGranule();
    if (!h.ok()) return h.status();
    out->push_back(*h);
  }
  return absl::OkStatus();
}

absl::StatusOr<Segment*> VirtualBacking::MapNewSegment(LargePool& pool, LargePool::StreamState& ss, Stream stream,
                                                       std::uintptr_t base, std::size_t bytes, int tier,
                                                       std::vector<PhysicalHandle> granules) {
  std::size_t mapped = 0;
  absl::Status s = ctx_.source->MapGranules(base, granules, &mapped);
  if (s.ok()) {
    Segment* seg = pool.AddSegment(ss, stream, base, bytes, tier, &granules);
    granules_.emplace(seg, std::move(granules));
    return seg;
  }
  std::vector<PhysicalHandle> unmapped(granules.begin() + static_cast<std::ptrdiff_t>(mapped), granules.end());
  ReleaseGranules(&unmapped);
  if (mapped == 0) {
    ctx_.source->ReleaseRange(base, bytes);
  } else {
    // The mapped prefix is cached memory like any other (a plain segment: a tier segment has no holes).
    std::fill(granules.begin() + static_cast<std::ptrdiff_t>(mapped), granules.end(), PhysicalHandle{0});
    Segment* seg = pool.AddSegment(ss, stream, base, bytes, -1, &granules);
    granules_.emplace(seg, std::move(granules));
  }
  return s;
}

absl::Status VirtualBacking::UnmapRun(LargePool& pool, Block* block, std::size_t g0, std::size_t g1,
                                      std::vector<PhysicalHandle>* out) {
  Segment* seg = block->segment;
  BA_DCHECK(block->state == BlockState::kFree && seg->base + g0 * granule_ >= block->ptr &&
                seg->base + g1 * granule_ <= block->ptr + block->size,
            "unmapping granules that are not wholly inside a free block");
  std::vector<PhysicalHandle>& handles = granules_[seg];
  absl::Status s;
  std::size_t end = g0;
  for (; end < g1; ++end) {
    s = ctx_.source->UnmapGranule(seg->base + end * granule_);
    if (!s.ok()) break;
    out->push_back(handles[end]);
    handles[end] = 0;
  }
  if (end > g0) pool.MakeHole(block, seg->base + g0 * granule_, seg->base + end * granule_);
  return s;
}

void VirtualBacking::AddSpare(PhysicalHandle handle) {
  spare_.push_back(handle);
  ctx_.stats->Increase(&DeviceStats::cached_bytes, kLargePool, static_cast<std::int64_t>(granule_));
}

void VirtualBacking::ReleaseGranules(std::vector<PhysicalHandle>* handles) {
  for (PhysicalHandle h : *handles) {
    if (ctx_.source->ReleaseGranule(h)) {
      ctx_.stats->Count(&DeviceStats::num_granules_released);
    } else {
      AddSpare(h);
    }
  }
  handles->clear();
}

std::vector<PhysicalHandle> VirtualBacking::TakeSpares() {
  std::vector<PhysicalHandle> handles;
  handles.swap(spare_);
  ctx_.stats->Decrease(&DeviceStats::cached_bytes, kLargePool, static_cast<std::int64_t>(handles.size() * granule_));
  return handles;
}

absl::Status VirtualBacking::CheckInvariants(const LargePool& pool) const {
  absl::Status status;
  std::size_t segments = 0;
  pool.ForEachSegment([&](const Segment& seg) {
    ++segments;
    if (!status.ok()) return;
    auto fail = [&](absl::string_view what) {
      status = absl::InternalError(
          absl::StrCat("large pool: segment ", absl::Hex(seg.base), " (", seg.size, " bytes): ", what));
    };
    auto it = granules_.find(&seg);
    if (it == granules_.end() || it->second.size() * granule_ != seg.size)
      return fail("its granule table does not cover it");
    const std::vector<PhysicalHandle>& handles = it->second;
    for (const Block* b = seg.first; b != nullptr; b = b->next) {
      // A hole is whole granules with no physical memory; every other block lies on mapped ones.
      const bool hole = b->state == BlockState::kUnmapped;
      if (hole && ((b->ptr - seg.base) % granule_ != 0 || b->size % granule_ != 0)) {
        return fail("a hole is not granule-aligned");
      }
      for (std::size_t i = (b->ptr - seg.base) / granule_; i < (b->ptr + b->size - seg.base + granule_ - 1) / granule_;
           ++i) {
        if ((handles[i] == 0) != hole) return fail("a granule's mapping does not match its block");
      }
    }
  });
  if (!status.ok()) return status;
  if (granules_.size() != segments) return absl::InternalError("large pool: a granule table belongs to no segment");
  for (PhysicalHandle h : spare_) {
    if (h == 0) return absl::InternalError("large pool: a spare granule has no handle");
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
