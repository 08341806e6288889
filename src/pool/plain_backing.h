// src/pool/plain_backing.h — plain segments: one backend allocation each (layer L3).
//
// Owns: `PlainBacking`, the SegmentBacking (pool/segment_backing.h) of the packed small pool and
// the large pool without virtual memory (stitching off): a segment is one backend allocation (cudaMalloc), made by a
// grow and given back whole by a release (a release the source refuses leaves it cached). It has
// no other way to serve at the cap, nothing to give back inside segments, no pieces.
// Invariants (CheckInvariants): no segment holds a hole.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   LargePool pool(ctx, config, std::make_unique<PlainBacking>(ctx.source));
#ifndef BUCKETALLOC_POOL_PLAIN_BACKING_H_
#define BUCKETALLOC_POOL_PLAIN_BACKING_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bucketalloc/backend.h"
#include "memory/segment.h"
#include "pool/memory_source.h"
#include "pool/segment_backing.h"

namespace bucketalloc::internal {

class PlainBacking final : public SegmentBacking {
 public:
  explicit PlainBacking(MemorySource* source) : source_(source) {}
  absl::StatusOr<Segment*> Grow(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t bytes,
                                int tier) override;
  bool Release(LargePool& pool, Segment* seg) override;
  absl::Status CheckInvariants(const LargePool& pool) const override;

 private:
  MemorySource* source_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_PLAIN_BACKING_H_
