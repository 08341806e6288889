// src/pool/memory_source.h — what a pool needs from the front end (layer L3 contract).
//
// Owns: `MemorySource`, through which the pools obtain and return backend memory (the front end's
// segment registry implements it: the capacity cap, the backend call, the reserved/segment stats,
// the address registry), and `PoolContext`, the shared pieces every pool updates (the stat ledger,
// the release clock).
// Thread-safety: called under the device lock only.
//
// Example:
//   absl::StatusOr<std::uintptr_t> base = ctx.source->AllocateSegment(kSlabBytes, kSmallPool);
#ifndef BUCKETALLOC_POOL_MEMORY_SOURCE_H_
#define BUCKETALLOC_POOL_MEMORY_SOURCE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/stat_types.h"
#include "internal/stat_ledger.h"

namespace bucketalloc::internal {

class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // Allocates `bytes` from the backend for `pool`, within the cap. ResourceExhausted on failure.
  virtual absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t bytes, PoolIndex pool) = 0;
  // Returns a segment to the backend.
  // Returns false when the backend refused (a lost context, a capture in another thread): the
  // caller keeps the memory cached and stops releasing.
  virtual bool ReleaseSegment(std::uintptr_t base, std::size_t bytes, PoolIndex pool) = 0;

  // Virtual memory: the pools' segments when stitching is on (`pool` names whose memory it is, for
  // the per-pool stats; a range's pool is the one it was reserved for). A segment is an address range
  // mapped by pieces, each one physical allocation of whole granules (Granularity() bytes) mapped
  // whole, or by none (a hole). reserved_bytes counts the physical memory that exists (mapped or
  // spare), so moving a piece from one range to another changes no stat.
  //
  // Runs garbage collection for `to_map` bytes about to be mapped (none when 0: a stitch reserves
  // its range with its free blocks already chosen, which a collection must not release), then
  // reserves and registers an address range of `bytes` (FailedPrecondition during a capture).
  virtual absl::StatusOr<std::uintptr_t> ReserveRange(std::size_t bytes, std::size_t to_map, PoolIndex pool) = 0;
  // Runs garbage collection for `to_map` bytes about to be mapped into a range reserved before (a
  // plain segment growing into its hole), as ReserveRange does for a new range.
  virtual void CollectFor(std::size_t to_map) {}
  // The bytes of a plain virtual segment's address range (0: just what it maps): mapped only where
  // it holds memory, so that it grows in place as PyTorch's expandable segments do (pool/stitcher.h).
  virtual std::size_t GrowableRangeBytes() const { return 0; }
  // Releases a registered range that has nothing mapped.
  virtual void ReleaseRange(std::uintptr_t va, std::size_t bytes) = 0;
  // Forgets a registered range whose mappings could not be undone (a DataLoss from MapPieces): its
  // addresses are never handed out again.
  virtual void AbandonRange(std::uintptr_t va, std::size_t bytes) = 0;
  // Creates a physical allocation of `bytes` (whole granules) within the cap (ResourceExhausted
  // past it or when the device refuses).
  virtual absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes, PoolIndex pool) = 0;
  // Releases an unmapped physical allocation; false (it still exists) when the backend refused.
  virtual bool ReleasePhysical(const PhysicalPiece& piece, PoolIndex pool) = 0;
  // Maps `pieces` one after another from `va`, inside a registered range (Backend::MapRun: on a
  // failure `*mapped` pieces, a prefix, stay mapped; DataLoss: the rest of the range is unusable).
  virtual absl::Status MapPieces(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces, std::size_t* mapped) = 0;
  // Unmaps [va, va + bytes), whole pieces side by side, with one call; on failure nothing is unmapped.
  virtual absl::Status Unmap(std::uintptr_t va, std::size_t bytes) = 0;
  // Waits until the work queued on `stream` so far has completed (before an unmap).
  virtual absl::Status SynchronizeStream(Stream stream) = 0;
  // Bytes that may still be created or allocated under the cap.
  virtual std::size_t Headroom() const = 0;
  // True while the slow path runs during a CUDA graph capture: the source grows (in relaxed capture
  // mode) but collects nothing, and the pools release and stitch nothing.
  virtual bool Capturing() const { return false; }
};

struct PoolContext {
  StatLedger* stats = nullptr;
  MemorySource* source = nullptr;
  const std::uint64_t* clock = nullptr;  // advances on every free; orders cached memory by age
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_MEMORY_SOURCE_H_
