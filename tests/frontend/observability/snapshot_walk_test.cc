// The snapshot walk (src/frontend/observability/snapshot_walk.cc): spans become segments in address order, blocks
// in use take their state and request from the front end, free pieces side by side merge.
#include "frontend/observability/snapshot_walk.h"

#include <gtest/gtest.h>

namespace bucketalloc::internal {
namespace {

TEST(SnapshotWalkTest, SpansBecomeSegmentsWithTheirBlocksStates) {
  std::vector<SpanView> spans(2);
  spans[0] = {0x9000, 0x300, nullptr, kLargePool, 2, true, {{0x9000, 0x100, true}, {0x9100, 0x200, false}}};
  spans[1] = {0x1000,
              0x400,
              reinterpret_cast<Stream>(0x7),
              kSmallPool,
              -1,
              false,
              {{0x1000, 0x100, false}, {0x1100, 0x100, false}, {0x1200, 0x100, true}, {0x1300, 0x100, true}}};
  std::vector<SegmentSnapshot> out;
  AppendSegmentSnapshots(
      /*device=*/1, spans,
      [](std::uintptr_t ptr) {
        return ptr == 0x1300 ? BlockUse{BlockSnapshotState::kActivePendingFree, 60}
                             : BlockUse{BlockSnapshotState::kActiveAllocated, 50};
      },
      &out);
  ASSERT_EQ(out.size(), 2u);
  const SegmentSnapshot& slab = out[0];  // the lower address first
  EXPECT_EQ(slab.address, 0x1000u);
  EXPECT_TRUE(slab.small);
  EXPECT_EQ(slab.device, 1);
  EXPECT_EQ(slab.stream, 0x7u);
  ASSERT_EQ(slab.blocks.size(), 3u) << "the two free slots read as one";
  EXPECT_EQ(slab.blocks[0].size, 0x200u);
  EXPECT_EQ(slab.blocks[0].state, BlockSnapshotState::kInactive);
  EXPECT_EQ(slab.blocks[2].state, BlockSnapshotState::kActivePendingFree);
  EXPECT_EQ(slab.active_size, 0x200u);
  EXPECT_EQ(slab.allocated_size, 0x100u);
  EXPECT_EQ(slab.requested_size, 110u);
  const SegmentSnapshot& seg = out[1];
  EXPECT_FALSE(seg.small);
  EXPECT_EQ(seg.tier, 2);
  EXPECT_TRUE(seg.expandable);
  EXPECT_EQ(seg.total_size, 0x300u);
  EXPECT_EQ(seg.blocks[0].requested_size, 50u);
  EXPECT_EQ(seg.blocks[1].requested_size, 0u);
}

}  // namespace
}  // namespace bucketalloc::internal
