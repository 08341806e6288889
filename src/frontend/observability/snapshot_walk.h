// src/frontend/observability/snapshot_walk.h — the segments of a device in the layout of PyTorch's memory
// snapshot (layer L4).
//
// Owns: `AppendSegmentSnapshots`, which turns the pools' spans (pool/pool.h: segments, slabs, and
// the mapped runs of stitched ranges, each with its blocks in address order) into SegmentSnapshots
// of torch.cuda.memory._snapshot(): a block in use is active_allocated or active_pending_free with
// its requested size, as `use_of` says; free blocks side by side read as one inactive block; the
// device's segments are appended in address order.
// Thread-safety: pure (the caller holds the device lock while it reads the pools).
//
// Example:
//   std::vector<SpanView> spans;  pools.ForEach([&](const auto& p) { p.Describe(&spans); });
//   AppendSegmentSnapshots(device, spans, use_of, &snapshot.segments);
#ifndef BUCKETALLOC_FRONTEND_OBSERVABILITY_SNAPSHOT_WALK_H_
#define BUCKETALLOC_FRONTEND_OBSERVABILITY_SNAPSHOT_WALK_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "bucketalloc/snapshot.h"
#include "pool/pool.h"

namespace bucketalloc::internal {

// What the front end knows of a block in use.
struct BlockUse {
  BlockSnapshotState state = BlockSnapshotState::kActiveAllocated;  // or kActivePendingFree
  std::size_t requested = 0;
};

void AppendSegmentSnapshots(int device, std::vector<SpanView> spans,
                            absl::FunctionRef<BlockUse(std::uintptr_t ptr)> use_of,
                            std::vector<SegmentSnapshot>* segments);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_OBSERVABILITY_SNAPSHOT_WALK_H_
