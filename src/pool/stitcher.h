// src/pool/stitcher.h — stitching: serving a large request at the cap from the whole physical
// pieces of free blocks, wherever they lie (layer L3; docs/vmm.md).
//
// Owns: the choice of pieces (the whole pieces inside free blocks, oldest first, each taken while
// it fits in what is still needed; a tier block's pieces as one unit, since it moves whole; then
// the smallest unit that covers the rest, whose surplus goes back to the device; a piece larger
// than a granule is not mapped into a plain segment but given back and created anew in granules),
// the stream waits before an unmap (each stream synchronized once; a stream that cannot be
// synchronized keeps its blocks' pieces and the choice is made again), the stitch itself (a fresh
// range, the chosen pieces unmapped into holes, one call per run side by side, what is missing
// created within the headroom, all mapped there), and giving back the free pieces of partly used
// segments (empty_cache, release-and-retry).
// Its VirtualBacking (pool/virtual_backing.h) owns it and calls it (ServeAtCap, ReleaseFreeMemory);
// the large pool never sees it. It works on the pool's blocks through the pool's block-level calls
// (pool/large_pool.h) and on pieces through the backing. Live blocks are never touched.
// Depends on: large_pool.h and virtual_backing.h; neither includes this header.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   absl::StatusOr<Block*> b = stitcher.Stitch(pool, ss, stream, 12 << 20, /*tier=*/-1);
#ifndef BUCKETALLOC_POOL_STITCHER_H_
#define BUCKETALLOC_POOL_STITCHER_H_

#include <cstddef>

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

  // After a grow of the request failed: serves `rounded` bytes from a fresh range whose granules
  // are created within the cap's headroom (none when the headroom would have fit the grow: the
  // device refused) and, for the rest, moved from free blocks. Returns ResourceExhausted, having
  // changed nothing, when too few granules can move; another error when a backend call failed
  // (the granules unmapped by then go back to the device, a refused release keeps one as a spare).
  absl::StatusOr<Block*> Stitch(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t rounded, int tier);
  // Unmaps and releases the spare pieces and the whole pieces of the free blocks of the
  // segments left (partly used ones, and wholly free ones whose release failed), once each
  // segment's stream has passed their last use.
  void ReleaseFreeGranules(LargePool& pool);

 private:
  PoolContext ctx_;
  VirtualBacking* backing_;
  const std::size_t granule_;
  const int shift_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_STITCHER_H_
