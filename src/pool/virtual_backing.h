// src/pool/virtual_backing.h — virtual-memory segments: address ranges mapped by physical pieces
// (layer L3; docs/vmm.md).
//
// Owns: `VirtualBacking`, the SegmentBacking (pool/segment_backing.h) of the large pool and of the
// packed small pool with the vmm backends (stitching; the small pool's granule is 2 MiB, as
// expandable segments' small pages): a segment is an address range mapped by pieces, each piece one physical
// allocation (cuMemCreate) of whole granules mapped whole (cuda.h's cuMemMap maps a handle from
// offset 0 only, and cuMemUnmap takes whole mappings, so a piece is what moves). It keeps each
// segment's piece table (holes are gaps in it) and the spare pieces (unmapped, not released: a
// release the backend refused; still reserved, used first), the operations a stitch is made of
// (take memory, map a new segment, unmap pieces into a hole with one call, release pieces), and
// its Stitcher (pool/stitcher.h), which grows a plain segment in place (Extend: a plain segment's
// range is the cap's size, mapped where it holds memory, the rest a hole), serves at the cap
// (ServeAtCap) and gives back the free pieces of partly used segments (ReleaseFreeMemory).
// How big a piece is, is the trade between driver calls and what a stitch can move (docs/vmm.md,
// "What a piece is"): a plain segment, which the pool splits, is granule pieces, so that the free
// granules beside a live block can move; a tier segment, one block never split, is one piece
// (three calls: create, map, access).
// Invariants (CheckInvariants): every segment has a piece table; its pieces are ordered, do not
// overlap, lie inside the segment and have handles; a granule lies in a piece iff its block is not
// a hole; holes are granule-aligned; no table belongs to a segment the pool no longer has; spares
// have handles and sizes of whole granules. A plain segment holds granule pieces but for the prefix
// a failed map left of a tier segment's (rare: it is plain memory from then on).
// Thread-safety: none; the device lock guards it.
//
// Example:
//   LargePool pool(ctx, config, std::make_unique<VirtualBacking>(ctx, kLargePool, config.granularity));
//   // at the cap, inside the pool's Serve:
//   std::optional<absl::StatusOr<Block*>> b = backing_->ServeAtCap(*this, ss, stream, 12 << 20, -1);
#ifndef BUCKETALLOC_POOL_VIRTUAL_BACKING_H_
#define BUCKETALLOC_POOL_VIRTUAL_BACKING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/units.h"
#include "memory/segment.h"
#include "pool/memory_source.h"
#include "pool/segment_backing.h"

namespace bucketalloc::internal {

class Stitcher;
struct LargePoolConfig;

class VirtualBacking final : public SegmentBacking {
 public:
  // The segments of pool `pool` (its memory is counted there), of whole granules of `granule` bytes
  // (a power of two: the pool's granularity); a grow that is not at the cap creates pieces of
  // `grow_piece` bytes (a multiple of `granule`).
  VirtualBacking(const PoolContext& ctx, PoolIndex pool, std::size_t granule, std::size_t grow_piece);
  VirtualBacking(const PoolContext& ctx, PoolIndex pool, std::size_t granule)
      : VirtualBacking(ctx, pool, granule, granule) {}
  ~VirtualBacking() override;
  VirtualBacking(const VirtualBacking&) = delete;
  VirtualBacking& operator=(const VirtualBacking&) = delete;

  absl::StatusOr<Segment*> Grow(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t bytes,
                                int tier) override;
  // Its stream must have passed the last use of its blocks before they are unmapped; its free
  // blocks lie between holes or the segment's ends, so they are whole pieces.
  bool Release(LargePool& pool, Segment* seg) override;
  void Forget(Segment* seg) override;
  std::size_t spare_bytes() const override { return spare_bytes_; }
  absl::Status CheckInvariants(const LargePool& pool) const override;
  bool virtual_memory() const override { return true; }
  // A stitch (Stitcher::Stitch), but not during a capture: it unmaps granules, which CUDA forbids
  // then (nullopt). A failed stitch's message is prefixed "stitching: ".
  std::optional<absl::StatusOr<Block*>> ServeAtCap(LargePool& pool, LargeStreamState& ss, Stream stream,
                                                   std::size_t rounded, int tier) override;
  // Stitcher::ReleaseFreeGranules: the spares and the whole pieces of free blocks.
  void ReleaseFreeMemory(LargePool& pool) override;
  // A plain request grows a segment in place (Stitcher::Extend); nullopt when plain segments do not
  // grow in place (GrowsInPlace).
  std::optional<absl::StatusOr<Block*>> Extend(LargePool& pool, LargeStreamState& ss, Stream stream,
                                               std::size_t rounded) override;
  // Bytes of the pieces wholly inside free blocks: what a stitch or a release can move (a walk).
  std::size_t MovableBytes(const LargePool& pool) const override;
  // Granule pieces, created now and kept as spares (taken first by grows and stitches).
  absl::StatusOr<std::size_t> Prefetch(std::size_t spare_target, std::size_t max_create) override;
  absl::Status PiecesUnder(const LargePool& pool, const Block* block, std::uintptr_t* first_va,
                           std::vector<PhysicalPiece>* out) const override;

  // Its stitcher (the slow path reaches it through ServeAtCap and ReleaseFreeMemory).
  Stitcher* stitcher() { return stitcher_.get(); }

  // ---- The operations of a stitch (pool/stitcher.h) ----
  PoolIndex pool_index() const { return pool_; }
  std::size_t granule() const { return granule_; }
  std::size_t grow_piece() const { return grow_piece_; }
  // The whole granules inside `block`, as [*g0, *g1) of its segment.
  std::size_t WholeGranules(const Block* block, std::size_t* g0 = nullptr, std::size_t* g1 = nullptr) const;
  // The pieces of `seg`, by address (holes are the gaps).
  absl::Span<const Piece> pieces(const Segment* seg) const;
  // The pieces wholly inside free `block`: [*first, *last) of pieces(block->segment), side by side.
  // Returns their bytes (0: none).
  std::size_t WholePieces(const Block* block, std::size_t* first, std::size_t* last) const;
  // The bytes of the spares TakeSpares(bytes, max_piece, ...) would take.
  std::size_t SpareBytesWithin(std::size_t bytes, std::size_t max_piece) const;
  // Appends the spares of at most `max_piece` bytes to `out` while they fit in `*bytes` (which
  // shrinks by theirs), the newest first.
  void TakeSpares(std::size_t* bytes, std::size_t max_piece, std::vector<PhysicalPiece>* out);
  // After a grow or stitch that gathered `*pieces` failed: the `spares` pieces from index `first`
  // on (what TakeSpares appended) stay spares (a prefetch's memory is not given back and made again
  // on the next request's path); every other piece (moved or created) goes back to the device, and
  // `*pieces` is left empty.
  void GiveBackAfterFailure(std::vector<PhysicalPiece>* pieces, std::size_t first, std::size_t spares);
  // Creates the physical memory of `bytes` (within the cap) in pieces of `piece` bytes (the last
  // may be smaller) and appends them to `out`; on failure `out` keeps what was created.
  absl::Status Create(std::size_t bytes, std::size_t piece, std::vector<PhysicalPiece>* out);
  // Maps `pieces` (their bytes add up to `bytes`) into the fresh range [base, base + bytes) and
  // adds it to `pool` as a segment. On a failed map the mapped prefix stays as a free segment (a
  // hole after it) or, when nothing mapped, the range is released; the unmapped pieces are
  // released. The segment, or the error.
  // With `mapped` < bytes the pieces cover its first `mapped` bytes, the rest is a hole.
  absl::StatusOr<Segment*> MapNewSegment(LargePool& pool, LargeStreamState& ss, Stream stream, std::uintptr_t base,
                                         std::size_t bytes, int tier, std::vector<PhysicalPiece> pieces,
                                         std::size_t mapped = kUnlimited);
  // Maps `pieces` from `lo` (a granule of `hole`) on (LargePool::FillHole): the free block that
  // holds them, or the error (a failed map leaves the mapped prefix filled and releases the rest;
  // DataLoss, mappings that could not be undone, also marks the segment: its holes are never
  // mapped again, and its range is abandoned, not released, when it goes).
  absl::StatusOr<Block*> MapIntoHole(LargePool& pool, Block* hole, std::uintptr_t lo,
                                     std::vector<PhysicalPiece> pieces);
  // True when a map into `seg`'s holes could not be undone (MapIntoHole).
  bool Unusable(const Segment* seg) const { return unusable_.contains(seg); }
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
  // Whether plain segments grow in place: not with max_split_size set (a block grown in place may
  // pass it, and would never be split).
  static bool GrowsInPlace(const LargePool& pool);
  // The piece table entries of `mapped`, mapped side by side from granule g0 of a segment.
  std::vector<Piece> TableOf(std::size_t g0, absl::Span<const PhysicalPiece> mapped) const;
  void AttachPieces(Segment* seg, std::vector<Piece> table);
  void AddSpare(const PhysicalPiece& piece);

  PoolContext ctx_;
  const PoolIndex pool_;
  const std::size_t granule_;
  const std::size_t grow_piece_;
  const int shift_;  // log2(granule_)
  // Each segment's pieces, by address, and the spare pieces.
  absl::flat_hash_map<const Segment*, std::unique_ptr<std::vector<Piece>>> pieces_;
  std::vector<PhysicalPiece> spare_;
  std::size_t spare_bytes_ = 0;
  // Segments a map into a hole left with mappings it could not undo (MapIntoHole's DataLoss).
  absl::flat_hash_set<const Segment*> unusable_;
  std::unique_ptr<Stitcher> stitcher_;
};

// What backs the segments of a pool configured by `config` (the large pool's, or the packed small
// pool's): granule ranges of config.granularity grown in pieces of config.grow_piece, their memory
// counted in config.index's stats, when `virtual_memory` (stitching); else one backend allocation
// per segment (PlainBacking).
std::unique_ptr<SegmentBacking> MakeSegmentBacking(const PoolContext& ctx, const LargePoolConfig& config,
                                                   bool virtual_memory);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_VIRTUAL_BACKING_H_
