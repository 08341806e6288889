// What backs the large pool's segments (src/pool/segment_backing.cc): a plain segment whose release
// the source refuses stays cached; a virtual-memory segment maps one granule piece per granule, a
// map that fails part-way leaves its mapped prefix as cached memory and gives the rest back, and one
// that cannot be undone abandons its range.
#include "pool/segment_backing.h"

#include <gtest/gtest.h>

#include "pool/large_pool_fixture.h"

namespace bucketalloc::internal {
namespace {

TEST_F(LargePoolTest, APlainSegmentWhoseReleaseIsRefusedStaysCached) {
  Init({});
  Block* a = Allocate(30 * kMiB);
  ASSERT_NE(a, nullptr);
  Return(a);
  source_->fail_segment_release_in = 1;
  EXPECT_EQ(pool_->ReleaseOldest(), 0u) << "refused: nothing released";
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, static_cast<std::int64_t>(30 * kMiB));
  EXPECT_EQ(pool_->OldestFree(), 0u) << "still first in the release order";
  Check(0);
  EXPECT_EQ(pool_->ReleaseOldest(), 30 * kMiB);
  EXPECT_EQ(source_->used(), 0u);
  Check(0);
}

TEST_F(StitchingPoolTest, AMapThatFailsPartWayLeavesItsMappedPrefixCached) {
  InitStitching(64 * kMiB);
  source_->fail_map_in = 4;  // the fourth of ten maps of a 20 MiB segment
  absl::StatusOr<Block*> grown = pool_->Grow(*ss_, nullptr, 20 * kMiB, 3 * kMiB, -1);
  EXPECT_FALSE(grown.ok());
  // Three granules mapped stay as a free segment with a hole after them; seven went back.
  EXPECT_EQ(source_->mapped(), 3u);
  EXPECT_EQ(source_->handles(), 3u);
  EXPECT_EQ(Stats().num_granules_released, 7);
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, static_cast<std::int64_t>(6 * kMiB));
  int segments = 0;
  pool_->ForEachSegment([&](const Segment& s) {
    ++segments;
    EXPECT_EQ(pool_->MappedBytes(s), 6 * kMiB);
    EXPECT_EQ(s.first->next->state, BlockState::kUnmapped);
  });
  EXPECT_EQ(segments, 1);
  Check(0);
  // The prefix serves a request, and everything goes back in the end.
  Block* b = Allocate(3 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(source_->handles(), 3u) << "served from the prefix, no new granule";
  Return(b);
  EXPECT_EQ(ReleaseAll(), 6 * kMiB);
  EXPECT_EQ(source_->handles(), 0u);
  Check(0);
}

// A map that fails and cannot be undone (the vmm backend's DataLoss: pieces that could not be made
// accessible could not be unmapped either): the range is abandoned, never carved again, and every
// piece is released (CUDA frees a released handle's memory when its last mapping goes).
TEST_F(StitchingPoolTest, AMapThatCannotBeUndoneAbandonsItsRange) {
  InitStitching(64 * kMiB);
  source_->fail_map_in = 4;
  source_->map_failure_is_data_loss = true;
  absl::StatusOr<Block*> grown = pool_->Grow(*ss_, nullptr, 20 * kMiB, 3 * kMiB, -1);
  EXPECT_TRUE(absl::IsDataLoss(grown.status())) << grown.status();
  EXPECT_EQ(source_->abandoned_ranges, 1);
  EXPECT_EQ(source_->handles(), 0u);
  EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, 0);
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, 0);
  int segments = 0;
  pool_->ForEachSegment([&](const Segment&) { ++segments; });
  EXPECT_EQ(segments, 0);
  Check(0);
}

}  // namespace
}  // namespace bucketalloc::internal
