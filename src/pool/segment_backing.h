// src/pool/segment_backing.h — the interface of what backs the large pool's segments (layer L3).
//
// Owns: `SegmentBacking`, the interface only: how a segment's memory is made, given back and
// forgotten, and what a backing may do beyond that when the pool asks (serve a request at the
// cap, give back free memory inside segments, report what it could move, name the physical pieces
// under a block). Two kinds implement it:
//   - pool/plain_backing.h: one backend allocation per segment (cudaMalloc); every optional call
//     keeps its default;
//   - pool/virtual_backing.h: address ranges mapped by physical pieces (the vmm backends), which
//     serves at the cap by stitching (pool/stitcher.h).
// The large pool (pool/large_pool.h) owns one backing, chosen by whoever builds the pool, and calls
// it on its slow paths only, never knowing which kind it is; the backing changes the pool's blocks
// only through the pool's block-level calls (AddSegment, MakeHole, Take, Drop*). This header knows
// the pool by name only: the pool depends on it, never the reverse.
// Invariants: each backing checks its own (CheckInvariants), called by LargePool::CheckInvariants.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   LargePool pool(ctx, config, std::make_unique<PlainBacking>(ctx.source));
//   // inside the pool, on a slow path:
//   absl::StatusOr<Segment*> seg = backing_->Grow(*this, ss, stream, 20 << 20, /*tier=*/-1);
#ifndef BUCKETALLOC_POOL_SEGMENT_BACKING_H_
#define BUCKETALLOC_POOL_SEGMENT_BACKING_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bucketalloc/backend.h"
#include "memory/segment.h"

namespace bucketalloc::internal {

class LargePool;
struct LargeStreamState;

class SegmentBacking {
 public:
  virtual ~SegmentBacking() = default;
  // Makes the memory of a new segment of `bytes` for `stream` (a tier segment when tier >= 0) and
  // adds it to `pool`, wholly free. ResourceExhausted from the source (the cap or the device).
  virtual absl::StatusOr<Segment*> Grow(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t bytes,
                                        int tier) = 0;
  // Gives the memory of wholly free `seg` back and drops it from `pool`. False when the source
  // refused: it stays cached (a virtual segment may have lost some granules, which holes mark).
  virtual bool Release(LargePool& pool, Segment* seg) = 0;
  // Forgets `seg` as the pool drops it (a virtual range goes back to the device).
  virtual void Forget(Segment* seg) {}
  // Reserved bytes in no segment (virtual: the spare pieces).
  virtual std::size_t spare_bytes() const { return 0; }
  virtual absl::Status CheckInvariants(const LargePool& pool) const = 0;

  // True when segments are virtual-memory ranges (reports: SpanView::virtual_memory, units).
  virtual bool virtual_memory() const { return false; }
  // After a grow of the request at the cap failed (ResourceExhausted): another way to serve
  // `rounded` bytes (a tier block when tier >= 0) as an active block of `pool`. nullopt when this
  // backing has none (now); else the block, or an error whose message the pool appends to the
  // grow's (having changed nothing a caller can see).
  virtual std::optional<absl::StatusOr<Block*>> ServeAtCap(LargePool& pool, LargeStreamState& ss, Stream stream,
                                                           std::size_t rounded, int tier) {
    return std::nullopt;
  }
  // Before a grow, for a plain request (tier < 0): serves `rounded` bytes as an active block of
  // `pool` from new memory mapped beside free bytes of a segment of `stream`, as PyTorch's expandable
  // segments grow (virtual memory), or nullopt when this backing makes a new segment instead (Grow).
  // ResourceExhausted (nothing changed) when the memory cannot be created.
  virtual std::optional<absl::StatusOr<Block*>> Extend(LargePool& pool, LargeStreamState& ss, Stream stream,
                                                       std::size_t rounded) {
    return std::nullopt;
  }
  // Gives back the free memory it can inside the segments left after the pool released its wholly
  // free ones, and what it keeps in none (a full release: empty_cache, release-and-retry).
  virtual void ReleaseFreeMemory(LargePool& pool) {}
  // Bytes that ServeAtCap or ReleaseFreeMemory could move out of free blocks (a walk; 0: none).
  virtual std::size_t MovableBytes(const LargePool& pool) const { return 0; }
  // Creates physical memory ahead of need, kept as spare pieces that grows and stitches take before
  // they create any (Allocator::Prefetch): brings the spares up to `spare_target` bytes, creating at
  // most `max_create` (whole granules; less at the cap). The bytes created (0 when the spares were
  // enough), or the source's error when it needed to create and could not. FailedPrecondition when
  // segments are not virtual memory.
  virtual absl::StatusOr<std::size_t> Prefetch(std::size_t spare_target, std::size_t max_create) {
    return absl::FailedPreconditionError(
        "bucketalloc: prefetch creates physical memory for virtual-memory segments; this device's large pool "
        "makes plain ones (accepted: backend:vmm, or expandable_segments:true with a vmm-capable backend)");
  }
  // CUDA IPC of allocated `block`: appends the physical pieces mapped under it (each whole, in
  // address order) to `out` and sets `*first_va` to the first one's address. FailedPrecondition
  // when its segment is not virtual memory.
  virtual absl::Status PiecesUnder(const LargePool& pool, const Block* block, std::uintptr_t* first_va,
                                   std::vector<PhysicalPiece>* out) const {
    return absl::FailedPreconditionError("bucketalloc: the block is not in a virtual-memory segment");
  }
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_SEGMENT_BACKING_H_
