// What backs the large pool's segments, through the interface the pool calls
// (src/pool/segment_backing.h): a plain segment (src/pool/plain_backing.cc) whose release the source
// refuses stays cached, and a plain backing keeps every optional call's default; a virtual-memory
// segment (src/pool/virtual_backing.cc) maps one granule piece per granule, a map that fails
// part-way leaves its mapped prefix as cached memory and gives the rest back, and one that cannot be
// undone abandons its range.
#include "pool/segment_backing.h"

#include <gtest/gtest.h>

#include <vector>

#include "pool/large_pool_fixture.h"
#include "pool/plain_backing.h"
#include "pool/virtual_backing.h"

namespace bucketalloc::internal {
namespace {

// A plain backing has no other way at the cap, nothing to give back inside segments, nothing to
// move and no pieces: the pool's slow path at the cap returns the grow's error as it is.
TEST_F(LargePoolTest, APlainBackingKeepsTheDefaults) {
  Init({}, 20 * kMiB);
  Block* a = Allocate(20 * kMiB);
  ASSERT_NE(a, nullptr);
  PlainBacking plain(source_.get());
  EXPECT_FALSE(plain.virtual_memory());
  EXPECT_FALSE(plain.ServeAtCap(*pool_, *ss_, nullptr, 2 * kMiB, -1).has_value());
  EXPECT_EQ(plain.MovableBytes(*pool_), 0u);
  EXPECT_EQ(pool_->movable_bytes(), 0u);
  std::uintptr_t first_va = 0;
  std::vector<PhysicalPiece> pieces;
  EXPECT_EQ(pool_->PiecesUnder(a, &first_va, &pieces).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(pieces.empty());
  Served served;
  absl::StatusOr<LargePool::Handle> more = pool_->Serve(*ss_, nullptr, pool_->RequestFor(4 * kMiB), &served);
  ASSERT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_EQ(more.status().message(), "fake source: limit");
  std::vector<SpanView> spans;
  pool_->Describe(&spans);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_FALSE(spans[0].virtual_memory);
  Return(a);
  Check(0);
}

// A virtual backing names the pieces under a block, in address order, whole.
TEST_F(StitchingPoolTest, AVirtualBackingNamesThePiecesUnderABlock) {
  InitStitching(64 * kMiB);
  Block* a = Allocate(3 * kMiB);  // [0, 3) MiB of a 20 MiB segment: granules 0 and 1
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(virtual_->virtual_memory());
  std::uintptr_t first_va = 0;
  std::vector<PhysicalPiece> pieces;
  ASSERT_TRUE(pool_->PiecesUnder(a, &first_va, &pieces).ok());
  EXPECT_EQ(first_va, a->ptr);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].handle, source_->HandleAt(a->ptr));
  EXPECT_EQ(pieces[1].handle, source_->HandleAt(a->ptr + kG));
  for (const PhysicalPiece& p : pieces) EXPECT_EQ(p.bytes, kG);
  std::vector<SpanView> spans;
  pool_->Describe(&spans);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_TRUE(spans[0].virtual_memory);
  Return(a);
  Check(0);
}

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
