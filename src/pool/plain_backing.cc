// src/pool/plain_backing.cc — plain segments: one backend allocation each (pool/plain_backing.h).
#include "pool/plain_backing.h"

#include "absl/strings/str_cat.h"
#include "internal/check.h"
#include "pool/large_pool.h"

namespace bucketalloc::internal {

absl::StatusOr<Segment*> PlainBacking::Grow(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t bytes,
                                            int tier) {
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

}  // namespace bucketalloc::internal
