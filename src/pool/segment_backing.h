// src/pool/segment_backing.h — what backs the large pool's segments (layer L3).
//
// Owns: `SegmentBacking`, how a segment's memory is made, given back and forgotten, in two kinds:
//   - `PlainBacking`: one backend allocation per segment (cudaMalloc);
//   - `VirtualBacking` (stitching, the vmm backends): an address range with one physical granule
//     mapped per granule of it. It keeps each segment's granule table (0 for a hole) and the spare
//     granules (unmapped, not released: a release the backend refused; still reserved, used first),
//     and the granule operations a stitch is made of (take granules, map a new segment, unmap a run
//     into a hole, release granules).
// The large pool owns one backing and calls it on its slow paths only; the backing changes the
// pool's blocks only through the pool's block-level calls (AddSegment, MakeHole, Drop*).
// Invariants (VirtualBacking::CheckInvariants): every segment has a granule table covering it; a
// granule has a handle iff its block is not a hole; holes are granule-aligned; no table belongs to
// a segment the pool no longer has; spares have handles.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   absl::StatusOr<Segment*> seg = backing.Grow(pool, ss, stream, 20 << 20, /*tier=*/-1);
//   if (seg.ok() && (*seg)->active_blocks == 0) backing.Release(pool, *seg);
#ifndef BUCKETALLOC_POOL_SEGMENT_BACKING_H_
#define BUCKETALLOC_POOL_SEGMENT_BACKING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
  virtual void Forget(const Segment* seg) {}
  // Reserved bytes in no segment (virtual: the spare granules).
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
  // blocks lie between holes or the segment's ends, so they are whole granules.
  bool Release(LargePool& pool, Segment* seg) override;
  void Forget(const Segment* seg) override;
  std::size_t spare_bytes() const override { return spare_.size() * granule_; }
  absl::Status CheckInvariants(const LargePool& pool) const override;

  // ---- The granule operations of a stitch (pool/stitcher.h) ----
  std::size_t granule() const { return granule_; }
  std::size_t spares() const { return spare_.size(); }
  // Fills `out` up to `n` granules: spares first, then new ones within the cap. On failure `out`
  // keeps what it got.
  absl::Status TakeGranules(std::size_t n, std::vector<PhysicalHandle>* out);
  // Maps `granules` into the fresh range [base, base + bytes) and adds it to `pool` as a segment.
  // On a failed map the mapped prefix stays as a free segment (a hole after it) or, when nothing
  // mapped, the range is released; the unmapped granules are released. The segment, or the error.
  absl::StatusOr<Segment*> MapNewSegment(LargePool& pool, LargePool::StreamState& ss, Stream stream,
                                         std::uintptr_t base, std::size_t bytes, int tier,
                                         std::vector<PhysicalHandle> granules);
  // Unmaps granules [g0, g1) of the segment of free `block` (whole granules inside it), one at a
  // time, appending their handles to `out`; stops at the first failure. The unmapped run becomes a
  // hole (LargePool::MakeHole); the caller drops the segment if it is all hole now.
  absl::Status UnmapRun(LargePool& pool, Block* block, std::size_t g0, std::size_t g1,
                        std::vector<PhysicalHandle>* out);
  // Releases `handles` to the device (one the backend refuses stays a spare).
  void ReleaseGranules(std::vector<PhysicalHandle>* handles);
  // Takes every spare (they leave the cached bytes), for a release.
  std::vector<PhysicalHandle> TakeSpares();

 private:
  void AddSpare(PhysicalHandle handle);

  PoolContext ctx_;
  const std::size_t granule_;
  // Each segment's granules (0 = a hole), and the spare granules.
  absl::flat_hash_map<const Segment*, std::vector<PhysicalHandle>> granules_;
  std::vector<PhysicalHandle> spare_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_SEGMENT_BACKING_H_
