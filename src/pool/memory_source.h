// src/pool/memory_source.h — what a pool needs from the front end (layer L3 contract).
//
// Owns: `MemorySource`, through which the pools obtain and return backend memory (the front end
// implements it: the capacity cap, the backend call, the reserved/segment stats, the address
// registry), and `PoolContext`, the shared pieces every pool updates (stats, the release clock).
// Thread-safety: called under the device lock only.
//
// Example:
//   absl::StatusOr<std::uintptr_t> base = ctx.source->AllocateSegment(kSlabBytes, kSmallPool);
#ifndef BUCKETALLOC_POOL_MEMORY_SOURCE_H_
#define BUCKETALLOC_POOL_MEMORY_SOURCE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "bucketalloc/stats.h"

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
};

// Adds `delta` to a pool's gauge and to the "all" gauge.
inline void StatAdd(StatArray& stat, PoolIndex pool, std::int64_t delta) {
  stat[kAllPools].Add(delta);
  stat[pool].Add(delta);
}

struct PoolContext {
  DeviceStats* stats = nullptr;
  MemorySource* source = nullptr;
  const std::uint64_t* clock = nullptr;  // advances on every free; orders cached memory by age
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_MEMORY_SOURCE_H_
