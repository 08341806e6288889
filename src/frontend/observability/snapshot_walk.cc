// src/frontend/observability/snapshot_walk.cc — spans to snapshot segments (frontend/observability/snapshot_walk.h).
#include "frontend/observability/snapshot_walk.h"

#include <algorithm>

namespace bucketalloc::internal {

void AppendSegmentSnapshots(int device, std::vector<SpanView> spans,
                            absl::FunctionRef<BlockUse(std::uintptr_t ptr)> use_of,
                            std::vector<SegmentSnapshot>* segments) {
  std::sort(spans.begin(), spans.end(), [](const SpanView& a, const SpanView& b) { return a.base < b.base; });
  for (const SpanView& span : spans) {
    SegmentSnapshot& seg = segments->emplace_back();
    seg.device = device;
    seg.address = span.base;
    seg.total_size = span.size;
    seg.stream = reinterpret_cast<std::uintptr_t>(span.stream);
    seg.small = span.pool == kSmallPool;
    seg.tier = span.tier;
    seg.expandable = span.virtual_memory;
    for (const SpanView::Block& b : span.blocks) {
      if (!b.in_use) {
        if (!seg.blocks.empty() && seg.blocks.back().state == BlockSnapshotState::kInactive) {
          seg.blocks.back().size += b.size;  // adjacent free pieces read as one free range
        } else {
          seg.blocks.push_back(BlockSnapshot{b.ptr, b.size, 0, BlockSnapshotState::kInactive});
        }
        continue;
      }
      const BlockUse use = use_of(b.ptr);
      seg.blocks.push_back(BlockSnapshot{b.ptr, b.size, use.requested, use.state});
      seg.active_size += b.size;
      seg.requested_size += use.requested;
      if (use.state == BlockSnapshotState::kActiveAllocated) seg.allocated_size += b.size;
    }
  }
}

}  // namespace bucketalloc::internal
