// src/pool/segment_backing.h — what backs the large pool's segments (layer L3).
//
// Owns: `SegmentBacking`, how a segment's memory is made, given back and forgotten, in two kinds:
//   - `PlainBacking`: one backend allocation per segment (cudaMalloc);
//   - `VirtualBacking` (stitching, the vmm backends): an address range mapped by pieces, each piece
//     one physical allocation (cuMemCreate) of whole granules mapped whole (cuda.h's cuMemMap maps
//     a handle from offset 0 only, and cuMemUnmap takes whole mappings, so a piece is what moves).
//     It keeps each segment's piece table (holes are gaps in it) and the spare pieces (unmapped,
//     not released: a release the backend refused; still reserved, used first), and the operations
//     a stitch is made of (take memory, map a new segment, unmap pieces into a hole with one call,
//     release pieces).
// How big a piece is, is the trade between driver calls and what a stitch can move (docs/vmm.md,
// "What a piece is"): a plain segment, which the pool splits, is granule pieces, so that the free
// granules beside a live block can move; a tier segment, one block never split, is one piece
// (three calls: create, map, access).
// The large pool owns one backing and calls it on its slow paths only; the backing changes the
// pool's blocks only through the pool's block-level calls (AddSegment, MakeHole, Drop*).
// Invariants (VirtualBacking::CheckInvariants): every segment has a piece table; its pieces are
// ordered, do not overlap, lie inside the segment and have handles; a granule lies in a piece iff
// its block is not a hole; holes are granule-aligned; no table belongs to a segment the pool no
// longer has; spares have handles and sizes of whole granules. A plain segment holds granule pieces
// but for the prefix a failed map left of a tier segment's (rare: it is plain memory from then on).
// Thread-safety: none; the device lock guards it.
//
// Example:
//   absl::StatusOr<Segment*> seg = backing.Grow(pool, ss, stream, 20 << 20, /*tier=*/-1);
//   if (seg.ok() && (*seg)->active_blocks == 0) backing.Release(pool, *seg);
#ifndef BUCKETALLOC_POOL_SEGMENT_BACKING_H_
#define BUCKETALLOC_POOL_SEGMENT_BACKING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "memory/segment.h"
#include "pool/large_pool.h"
#include "pool/memory_source.h"

namespace bucketalloc::internal {

class SegmentBacking {
 public:
  virtual ~SegmentBacking() = default;
  // Makes the memory of a new segment of `bytes` for `stream` (a tier segment when tier >= 0) and
  // adds it to `pool`, wholly free. ResourceExhausted from the source (the cap or the device).
  virtual absl::StatusOr<Segment*> Grow(LargePool& pool, LargePool::StreamState& ss, Stream stream, std::size_t bytes,
                                        int tier) = 0;
  // Gives the memory of wholly free `seg` back and drops it from `pool`. False when the source
  // refused: it stays cached (a virtual segment may have lost some granules, which holes mark).
  virtual bool Release(LargePool& pool, Segment* seg) = 0;
  // Forgets `seg` as the pool drops it (a virtual range goes back to the device).
  virtual void Forget(Segment* seg) {}
  // Reserved bytes in no segment (virtual: the spare pieces).
  virtual std::size_t spare_bytes() const { return 0; }
  virtual absl::Status CheckInvariants(const LargePool& pool) const = 0;
};

class PlainBacking final : public SegmentBacking {
 public:
  explicit PlainBacking(MemorySource* source) : source_(source) {}
  absl::StatusOr<Segment*> Grow(LargePool& pool, LargePool::StreamState& ss, Stream stream, std::size_t bytes,
                                int tier) override;
  bool Release(LargePool& pool, Segment* seg) override;
  absl::Status CheckInvariants(const LargePool& pool) const override;

 private:
  MemorySource* source_;
};

class VirtualBacking final : public SegmentBacking {
 public:
  VirtualBacking(const PoolContext& ctx, std::size_t granule);
  absl::StatusOr<Segment*> Grow(LargePool& pool, LargePool::StreamState& ss, Stream stream, std::size_t bytes,
                                int tier) override;
  // Its stream must have passed the last use of its blocks before they are unmapped; its free
  // blocks lie between holes or the segment's ends, so they are whole pieces.
  bool Release(LargePool& pool, Segment* seg) override;
  void Forget(Segment* seg) override;
  std::size_t spare_bytes() const override { return spare_bytes_; }
  absl::Status CheckInvariants(const LargePool& pool) const override;

  // ---- The operations of a stitch (pool/stitcher.h) ----
  std::size_t granule() const { return granule_; }
  // The pieces of `seg`, by address (holes are the gaps).
  absl::Span<const Piece> pieces(const Segment* seg) const;
  // The pieces wholly inside free `block`: [*first, *last) of pieces(block->segment), side by side.
  // Returns their bytes (0: none).
  std::size_t WholePieces(const LargePool& pool, const Block* block, std::size_t* first, std::size_t* last) const;
  // Bytes of the pieces wholly inside free blocks: what a stitch or a release can move (a walk).
  std::size_t MovableBytes(const LargePool& pool) const;
  // The bytes of the spares TakeSpares(bytes, max_piece, ...) would take.
  std::size_t SpareBytesWithin(std::size_t bytes, std::size_t max_piece) const;
  // Appends the spares of at most `max_piece` bytes to `out` while they fit in `*bytes` (which
  // shrinks by theirs), the newest first.
  void TakeSpares(std::size_t* bytes, std::size_t max_piece, std::vector<PhysicalPiece>* out);
  // Creates the physical memory of `bytes` (within the cap) in pieces of `piece` bytes (the last
  // may be smaller) and appends them to `out`; on failure `out` keeps what was created.
  absl::Status Create(std::size_t bytes, std::size_t piece, std::vector<PhysicalPiece>* out);
  // Maps `pieces` (their bytes add up to `bytes`) into the fresh range [base, base + bytes) and
  // adds it to `pool` as a segment. On a failed map the mapped prefix stays as a free segment (a
  // hole after it) or, when nothing mapped, the range is released; the unmapped pieces are
  // released. The segment, or the error.
  absl::StatusOr<Segment*> MapNewSegment(LargePool& pool, LargePool::StreamState& ss, Stream stream,
                                         std::uintptr_t base, std::size_t bytes, int tier,
                                         std::vector<PhysicalPiece> pieces);
  // Unmaps pieces [first, last) of the segment of free `block` (wholly inside it, side by side)
  // with one call and appends them to `out`; they become a hole (LargePool::MakeHole). On failure
  // nothing changes. The caller drops the segment if it is all hole now.
  absl::Status UnmapPieces(LargePool& pool, Block* block, std::size_t first, std::size_t last,
                           std::vector<PhysicalPiece>* out);
  // Releases `pieces` to the device (one the backend refuses stays a spare), and clears it.
  void ReleasePieces(std::vector<PhysicalPiece>* pieces);
  // Takes every spare (they leave the cached bytes), for a release.
  std::vector<PhysicalPiece> TakeAllSpares();

 private:
  void AttachPieces(Segment* seg, std::vector<Piece> table);
  void AddSpare(const PhysicalPiece& piece);

  PoolContext ctx_;
  const std::size_t granule_;
  const int shift_;
  // Each segment's pieces, by address, and the spare pieces.
  absl::flat_hash_map<const Segment*, std::unique_ptr<std::vector<Piece>>> pieces_;
  std::vector<PhysicalPiece> spare_;
  std::size_t spare_bytes_ = 0;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_SEGMENT_BACKING_H_
