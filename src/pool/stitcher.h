// src/pool/stitcher.h — stitching: serving a large request at the cap from the whole physical
// pieces of free blocks, wherever they lie, and growing a stream's plain segment in place (layer
// L3; docs/vmm.md).
//
// Owns: where a plain request's new memory goes (the lowest hole of its stream's segments that
// holds it with the free bytes beside it, else a new segment whose range is the cap's size: the
// segment grows in place, as PyTorch's expandable segments do), the choice of pieces (the whole
// pieces inside free blocks, oldest first, each taken while it fits in what is still needed; a
// tier block's pieces as one unit, since it moves whole; then the smallest unit that covers the
// rest, whose surplus goes back to the device; a piece larger than a granule is not mapped into a
// plain segment but given back and created anew in granules), the stream waits before an unmap
// (each stream synchronized once; a stream that cannot be synchronized keeps its blocks' pieces and
// the choice is made again), the stitch itself (the chosen pieces unmapped into holes, one call per
// run side by side, what is missing created within the headroom, all mapped into the hole chosen,
// or a fresh range for a tier request), and giving back the free pieces of partly used segments
// (empty_cache, release-and-retry).
// Its VirtualBacking (pool/virtual_backing.h) owns it and calls it (Extend, ServeAtCap,
// ReleaseFreeMemory); the large pool never sees it. It works on the pool's blocks through the
// pool's block-level calls (pool/large_pool.h) and on pieces through the backing. Live blocks are
// never touched.
// Depends on: large_pool.h and virtual_backing.h; neither includes this header.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   absl::StatusOr<Block*> b = stitcher.Extend(pool, ss, stream, 12 << 20, /*at_cap=*/true);
#ifndef BUCKETALLOC_POOL_STITCHER_H_
#define BUCKETALLOC_POOL_STITCHER_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "memory/segment.h"
#include "pool/large_pool.h"
#include "pool/memory_source.h"
#include "pool/virtual_backing.h"

namespace bucketalloc::internal {

class Stitcher {
 public:
  // Stitches with the granules of `backing` (its granule size).
  Stitcher(const PoolContext& ctx, VirtualBacking* backing);

  // After a grow of a tier request (any, with max_split_size set) failed: serves `rounded` bytes
  // from a fresh range whose granules are created within the cap's headroom (none when the
  // headroom would have fit the grow: the device refused) and, for the rest, moved from free
  // blocks. ResourceExhausted, having changed nothing, when too few granules can move; another
  // error when a backend call failed (the granules unmapped by then go back to the device, a
  // refused release keeps one as a spare).
  absl::StatusOr<Block*> Stitch(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t rounded, int tier);
  // A plain request's new memory mapped beside free bytes, as PyTorch's expandable segments grow:
  // into the lowest hole of `stream`'s plain segments that holds it with the free blocks beside it
  // (after the one before it, before the one after it, or between both), or else a new segment
  // whose range is the cap's size (MemorySource::GrowableRangeBytes; just the request's granules
  // when that much address space cannot be had), mapped at its start, the rest a hole. Its
  // granules are spares and created ones; at the cap (`at_cap`: after a grow failed) also the whole
  // pieces of free blocks elsewhere, moved as Stitch moves them. ResourceExhausted, having changed
  // nothing, when they cannot be had; another error when a backend call failed (as Stitch; a map
  // that could not be undone, DataLoss, leaves its segment's holes unused from then on).
  absl::StatusOr<Block*> Extend(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t rounded, bool at_cap);
  // Unmaps and releases the spare pieces and the whole pieces of the free blocks of the
  // segments left (partly used ones, and wholly free ones whose release failed), once each
  // segment's stream has passed their last use.
  void ReleaseFreeGranules(LargePool& pool);

 private:
  // What a stitch of `bytes` (in pieces of at most `max_piece`) must move from free blocks: what the
  // cap's headroom and the spares leave.
  std::size_t BytesToMove(std::size_t bytes, std::size_t max_piece) const;
  // Counts a stitch that moved `stitched` bytes.
  void CountStitch(std::size_t stitched);
  // The `bytes` of memory a new segment or a hole is mapped with, in pieces of at most `max_piece`:
  // spares, then `moved` pieces while they fit (the rest go back to the device), then new ones.
  // `unmapped` is the unmap's status: on an error (it, or a failed create) every piece goes back.
  absl::Status Gather(std::size_t bytes, std::size_t max_piece, absl::Status unmapped, std::vector<PhysicalPiece> moved,
                      std::vector<PhysicalPiece>* pieces, std::size_t* stitched);

  PoolContext ctx_;
  VirtualBacking* backing_;
  const std::size_t granule_;
  const int shift_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_STITCHER_H_
