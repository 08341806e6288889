#include "pool/large_pool.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "test_util.h"

namespace bucketalloc::internal {
namespace {

class LargePoolTest : public ::testing::Test {
 protected:
  void Init(LargePoolConfig config, std::size_t limit = 1024 * kMiB) {
    config.roundup_power2_divisions.assign(16, 0);
    source_ = std::make_unique<bucketalloc::testing::FakeSource>(&stats_, limit);
    pool_ = std::make_unique<LargePool>(PoolContext{&stats_, source_.get(), &clock_}, config);
    ss_ = std::make_unique<LargePool::StreamState>(pool_->num_tiers());
  }
  // Allocates like the front end: cached block, else grow once and take.
  Block* Allocate(std::size_t size) {
    const int tier = pool_->TierOf(size);
    const std::size_t rounded = tier >= 0 ? pool_->tier_bytes(tier) : pool_->RoundSize(size);
    Block* b = pool_->TryAllocate(*ss_, rounded, tier);
    if (b != nullptr) return b;
    const std::size_t seg = tier >= 0 ? rounded : pool_->SegmentSizeFor(rounded);
    absl::StatusOr<Block*> grown = pool_->Grow(*ss_, nullptr, RoundUp(seg, 2 * kMiB), rounded, tier);
    return grown.ok() ? *grown : nullptr;
  }
  void Check(std::int64_t active) {
    ASSERT_TRUE(pool_->CheckInvariants(active).ok()) << pool_->CheckInvariants(active);
    ASSERT_TRUE(CheckStreamFreeLists(*ss_, pool_->num_tiers()).ok());
  }

  DeviceStats stats_;
  std::uint64_t clock_ = 0;
  std::unique_ptr<bucketalloc::testing::FakeSource> source_;
  std::unique_ptr<LargePool> pool_;
  std::unique_ptr<LargePool::StreamState> ss_;
};

TEST_F(LargePoolTest, SmallLargeRequestsShareA20MiBSegmentBySplitting) {
  Init({});
  Block* a = Allocate(3 * kMiB);
  Block* b = Allocate(5 * kMiB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(source_->allocs, 1);
  EXPECT_EQ(a->segment, b->segment);
  EXPECT_EQ(a->segment->size, 20 * kMiB);
  EXPECT_EQ(b->ptr, a->ptr + 3 * kMiB);
  EXPECT_EQ(stats_.num_splits, 2);
  EXPECT_EQ(stats_.inactive_split_bytes[kLargePool].current, static_cast<std::int64_t>(12 * kMiB));
  Check(2);
  pool_->Return(a);
  pool_->Return(b);  // coalesces with both neighbours
  EXPECT_EQ(stats_.num_merges, 2);
  EXPECT_EQ(stats_.inactive_split_bytes[kLargePool].current, 0);
  Check(0);
  EXPECT_EQ(pool_->largest_free_block(), 20 * kMiB);
  EXPECT_EQ(pool_->ReleaseFree(~std::size_t{0}), 20 * kMiB);
  EXPECT_EQ(source_->used(), 0u);
}

TEST_F(LargePoolTest, RemainderOfAtMost1MiBIsNotSplitOff) {
  Init({});
  Block* a = Allocate(19 * kMiB + 512);  // remainder < 1 MiB: the whole 20 MiB block is handed out
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->size, 20 * kMiB);
  EXPECT_EQ(stats_.num_splits, 0);
  pool_->Return(a);
  Check(0);
}

TEST_F(LargePoolTest, OversizeBlocksAreNotSplitAndServeOnlyCloseSizes) {
  Init({.max_split_size = 32 * kMiB, .max_non_split_rounding = 4 * kMiB});
  Block* big = Allocate(100 * kMiB);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->size, 100 * kMiB);
  EXPECT_EQ(stats_.oversize_segments.current, 1);
  pool_->Return(big);
  // 50 MiB may not take (or split) the cached 100 MiB block: a new segment is made.
  Block* mid = Allocate(50 * kMiB);
  ASSERT_NE(mid, nullptr);
  EXPECT_NE(mid->segment->size, 100 * kMiB);
  // 97 MiB is within 4 MiB of it: served whole, no split.
  Block* close = Allocate(97 * kMiB);
  ASSERT_NE(close, nullptr);
  EXPECT_EQ(close->size, 100 * kMiB);
  EXPECT_EQ(stats_.num_splits, 0);
  Check(2);
  pool_->Return(mid);
  pool_->Return(close);
  Check(0);
}

TEST_F(LargePoolTest, TiersAreReusedExactlyAndNeverSplit) {
  Init({.tiers = {64 * kMiB, 128 * kMiB, 256 * kMiB}});
  EXPECT_EQ(pool_->TierOf(40 * kMiB), 0);
  EXPECT_EQ(pool_->TierOf(31 * kMiB), -1);  // below half of the smallest tier: exact rounding
  EXPECT_EQ(pool_->TierOf(65 * kMiB), 1);
  EXPECT_EQ(pool_->TierOf(256 * kMiB), 2);
  EXPECT_EQ(pool_->TierOf(257 * kMiB), -1);  // above the largest tier
  Block* a = Allocate(70 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->size, 128 * kMiB);
  const std::uintptr_t addr = a->ptr;
  pool_->Return(a);
  Block* b = Allocate(100 * kMiB);  // same tier: the same block, no new segment
  EXPECT_EQ(b->ptr, addr);
  EXPECT_EQ(source_->allocs, 1);
  Block* c = Allocate(40 * kMiB);  // another tier: its own segment
  EXPECT_EQ(c->size, 64 * kMiB);
  EXPECT_EQ(stats_.num_splits, 0);
  Check(2);
  std::vector<TierUsage> tiers;
  PoolFragmentation frag;
  pool_->Fragmentation(&frag, &tiers);
  ASSERT_EQ(tiers.size(), 3u);
  EXPECT_EQ(tiers[0].in_use, 1);
  EXPECT_EQ(tiers[1].in_use, 1);
  pool_->Return(b);
  pool_->Return(c);
  tiers.clear();
  pool_->Fragmentation(&frag, &tiers);
  EXPECT_EQ(tiers[1].cached, 1);
  Check(0);
}

TEST_F(LargePoolTest, BestFitPrefersTheSmallestFittingBlock) {
  Init({});
  // Three separate segments, freed: 30, 24 and 40 MiB.
  Block* x = Allocate(30 * kMiB);
  Block* y = Allocate(24 * kMiB);
  Block* z = Allocate(40 * kMiB);
  for (Block* b : {x, y, z}) pool_->Return(b);
  Block* got = Allocate(23 * kMiB + 1);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->segment->size, 24 * kMiB);
  Check(1);
  pool_->Return(got);
}

TEST_F(LargePoolTest, ALargerBinGivesItsSmallestBlockThenItsLowestAddress) {
  // PyTorch's rule, whatever the order of the bin's list: the request's own bin is empty and the next
  // one holds a 26 and a 24 MiB segment, the 26 MiB one at the front of the list.
  Init({});
  Block* b26 = Allocate(26 * kMiB);
  Block* b24 = Allocate(24 * kMiB);
  ASSERT_EQ(BinOf(24 * kMiB), BinOf(26 * kMiB));
  ASSERT_LT(BinOf(22 * kMiB), BinOf(24 * kMiB));
  pool_->Return(b24);
  pool_->Return(b26);
  Block* got = Allocate(22 * kMiB);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->segment->size, 24 * kMiB);
  pool_->Return(got);
  Check(0);

  // Two equal free blocks of `size`, the higher one at the front: a request of 22 MiB takes the
  // lower one, from the next bin (24 MiB) or from its own bin (an exact fit).
  for (std::size_t size : {24 * kMiB, 22 * kMiB}) {
    SCOPED_TRACE(size);
    Init({});
    Block* low = Allocate(size);
    Block* high = Allocate(size);
    ASSERT_LT(low->ptr, high->ptr);
    pool_->Return(low);
    pool_->Return(high);
    Block* again = Allocate(22 * kMiB);
    ASSERT_NE(again, nullptr);
    EXPECT_EQ(again->ptr, low->ptr);
    pool_->Return(again);
    Check(0);
  }
}

TEST_F(LargePoolTest, ABinOfSmallerBlocksFallsThroughToTheNextBinsBestFit) {
  // The request's bin [20, 24) MiB holds only a 20 MiB block, too small for 22 MiB; the next bin's
  // 26 MiB block is in front of its 24 MiB one.
  Init({});
  Block* b20 = Allocate(20 * kMiB);
  Block* b24 = Allocate(24 * kMiB);
  Block* b26 = Allocate(26 * kMiB);
  ASSERT_EQ(BinOf(20 * kMiB), BinOf(22 * kMiB));
  pool_->Return(b20);
  pool_->Return(b24);
  pool_->Return(b26);
  Block* got = Allocate(22 * kMiB);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->segment->size, 24 * kMiB);
  EXPECT_EQ(source_->allocs, 3) << "served from the cache";
  pool_->Return(got);
  Check(0);
}

TEST_F(LargePoolTest, TheSlowPathScansTheWholeFirstBin) {
  // 33 blocks of 16.5 MiB in front of one of 18.5 MiB, all in the same bin: the bounded fast-path
  // scan misses the fitting block, the full scan finds it.
  Init({});
  std::vector<Block*> keep;
  Block* fits = Allocate(18 * kMiB + kMiB / 2);
  Block* fits_pin = Allocate(kMiB + kMiB / 2);  // keeps its segment from being wholly free
  ASSERT_NE(fits, nullptr);
  std::vector<Block*> small_holes;
  for (int i = 0; i < 33; ++i) {
    Block* hole = Allocate(16 * kMiB + kMiB / 2);
    keep.push_back(Allocate(kMiB + kMiB / 2));
    small_holes.push_back(hole);
  }
  pool_->Return(fits);
  for (Block* b : small_holes) pool_->Return(b);  // pushed in front of `fits` in the bin
  ASSERT_EQ(BinOf(16 * kMiB + kMiB / 2), BinOf(18 * kMiB + kMiB / 2));
  EXPECT_EQ(pool_->TryAllocate(*ss_, 18 * kMiB, -1), nullptr);
  Block* found = pool_->TryAllocate(*ss_, 18 * kMiB, -1, /*full_scan=*/true);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->ptr, fits->ptr);
  Check(35);
  pool_->Return(found);
  pool_->Return(fits_pin);
  for (Block* b : keep) pool_->Return(b);
  Check(0);
}

TEST_F(LargePoolTest, ANewSegmentServesItsRequestEvenWhenItIsOversize) {
  // 21 MiB + 1 rounds to a 22 MiB segment, larger than max_split_size and more than
  // max_non_split_rounding above the request: a cached block like it would not be admitted, but
  // the segment made for the request serves it.
  Init({.max_split_size = 20 * kMiB, .max_non_split_rounding = 0});
  Block* b = Allocate(21 * kMiB + 1);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->size, 22 * kMiB);
  Check(1);
  pool_->Return(b);
}

TEST_F(LargePoolTest, ReleaseOrderIsOldestFirst) {
  Init({});
  Block* a = Allocate(30 * kMiB);
  Block* b = Allocate(40 * kMiB);
  clock_ = 5;
  pool_->Return(b);
  clock_ = 9;
  pool_->Return(a);
  EXPECT_EQ(pool_->OldestFree(), 5u);
  EXPECT_EQ(pool_->ReleaseOldest(), 40 * kMiB);
  EXPECT_EQ(pool_->OldestFree(), 9u);
  Check(0);
}

TEST_F(LargePoolTest, GrowFailsCleanlyAtTheLimit) {
  Init({}, 40 * kMiB);
  Block* a = Allocate(30 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(absl::IsResourceExhausted(pool_->Grow(*ss_, nullptr, 20 * kMiB, 3 * kMiB, -1).status()));
  Check(1);
  pool_->Return(a);
}


// ---- Stitching (granule > 0): the fake source maps 2 MiB granules as bookkeeping.

class StitchingPoolTest : public LargePoolTest {
 protected:
  static constexpr std::size_t kG = bucketalloc::testing::FakeSource::kGranule;
  void InitStitching(std::size_t limit, LargePoolConfig config = {}) {
    config.granule = kG;
    Init(std::move(config), limit);
  }
  // An 8 MiB tier, a 16 MiB cap reached by two tier blocks; the first is freed, the second returned.
  Block* TwoTierBlocksTheFirstFreed() {
    LargePoolConfig config;
    config.tiers = {8 * kMiB};
    InitStitching(16 * kMiB, config);
    Block* t1 = Allocate(8 * kMiB);
    Block* t2 = Allocate(8 * kMiB);
    if (t1 == nullptr || t2 == nullptr) return nullptr;
    pool_->Return(t1);
    return t2;
  }
  // Fills two 20 MiB segments with ten 4 MiB blocks and frees every other one: 20 MiB free in
  // five pieces (ten whole granules) that no 12 MiB request fits, and the 40 MiB cap reached.
  std::vector<Block*> FragmentTwoSegments() {
    std::vector<Block*> blocks;
    for (int i = 0; i < 10; ++i) blocks.push_back(Allocate(4 * kMiB));
    for (Block* b : blocks) EXPECT_NE(b, nullptr);
    EXPECT_EQ(source_->used(), 40 * kMiB);
    std::vector<Block*> live;
    for (int i = 0; i < 10; ++i) {
      if (i % 2 == 0) {
        ++clock_;
        pool_->Return(blocks[i]);
      } else {
        live.push_back(blocks[i]);
      }
    }
    return live;
  }
};

TEST_F(StitchingPoolTest, GrowMapsOneGranulePerGranuleOfTheSegment) {
  InitStitching(64 * kMiB);
  Block* a = Allocate(3 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->segment->size, 20 * kMiB);
  EXPECT_EQ(source_->granules(), 10u);
  EXPECT_EQ(source_->mapped(), 10u);
  EXPECT_EQ(stats_.reserved_bytes[kLargePool].current, static_cast<std::int64_t>(20 * kMiB));
  Check(1);
  pool_->Return(a);
  EXPECT_EQ(pool_->ReleaseFree(~std::size_t{0}), 20 * kMiB);
  EXPECT_EQ(source_->granules(), 0u);
  EXPECT_EQ(source_->mapped(), 0u);
  EXPECT_EQ(stats_.num_granules_released, 10);
  EXPECT_EQ(stats_.cached_bytes[kLargePool].current, 0);
  Check(0);
}

TEST_F(StitchingPoolTest, StitchMovesTheGranulesOfFreeBlocksIntoOneRange) {
  InitStitching(40 * kMiB);
  std::vector<Block*> live = FragmentTwoSegments();
  Check(5);
  // No cached block fits 12 MiB and the cap is reached: growing fails, stitching serves it.
  EXPECT_EQ(pool_->TryAllocate(*ss_, 12 * kMiB, -1, true), nullptr);
  EXPECT_TRUE(absl::IsResourceExhausted(pool_->Grow(*ss_, nullptr, 12 * kMiB, 12 * kMiB, -1).status()));
  const std::set<PhysicalHandle> before = [&] {
    std::set<PhysicalHandle> h;
    for (Block* b : live) h.insert(source_->HandleAt(b->ptr));
    return h;
  }();
  absl::StatusOr<Block*> s = pool_->Stitch(*ss_, nullptr, 12 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  Block* big = *s;
  EXPECT_EQ(big->size, 12 * kMiB);
  EXPECT_EQ(stats_.num_stitches, 1);
  EXPECT_EQ(stats_.num_granules_stitched, 6);
  EXPECT_EQ(source_->granules(), 20u) << "no granule was created or released";
  EXPECT_EQ(stats_.reserved_bytes[kLargePool].current, static_cast<std::int64_t>(40 * kMiB));
  for (std::size_t g = 0; g < 6; ++g) {
    const PhysicalHandle h = source_->HandleAt(big->ptr + g * kG);
    EXPECT_NE(h, 0u);
    EXPECT_FALSE(before.contains(h)) << "a granule of a live block was taken";
  }
  for (Block* b : live) EXPECT_EQ(b->state, BlockState::kAllocated);
  EXPECT_EQ(source_->synced.size(), 1u) << "the free blocks' stream is synchronized once before the unmaps";
  Check(6);
  // Everything frees and releases; the holes leave nothing behind.
  pool_->Return(big);
  for (Block* b : live) pool_->Return(b);
  Check(0);
  pool_->ReleaseFree(~std::size_t{0});
  EXPECT_EQ(source_->granules(), 0u);
  EXPECT_EQ(source_->mapped(), 0u);
  EXPECT_EQ(stats_.cached_bytes[kLargePool].current, 0);
  Check(0);
}

TEST_F(StitchingPoolTest, StitchTakesTheOldestFreeGranulesFirst) {
  InitStitching(40 * kMiB);
  std::vector<Block*> live = FragmentTwoSegments();  // freed in address order: blocks 0, 2, 4, 6, 8
  absl::StatusOr<Block*> s = pool_->Stitch(*ss_, nullptr, 4 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  // The oldest free block (the first of the first segment) became a hole; the others stay free.
  Segment* first = live[0]->segment;
  ASSERT_EQ(first->first->state, BlockState::kUnmapped);
  EXPECT_EQ(first->first->size, 4 * kMiB);
  EXPECT_EQ(pool_->largest_free_block(), 4 * kMiB);
  Check(6);
}

TEST_F(StitchingPoolTest, PartialGranulesStayAndWholeOnesMove) {
  InitStitching(20 * kMiB);
  // 3 MiB blocks in one 20 MiB segment: the free ones cover whole granules only in part.
  std::vector<Block*> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(Allocate(3 * kMiB));
  for (Block* b : blocks) ASSERT_NE(b, nullptr);
  pool_->Return(blocks[1]);  // [3, 6) MiB: whole granule [4, 6)
  pool_->Return(blocks[3]);  // [9, 12) MiB: whole granule [10, 12)
  Check(4);
  absl::StatusOr<Block*> s = pool_->Stitch(*ss_, nullptr, 4 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(stats_.num_granules_stitched, 2);
  // The oldest (all equally old: the lowest addresses) whole granules moved; what stays cached is
  // the free pieces [3, 4) and [9, 10) MiB, below a granule, and the free tail [18, 20) MiB.
  EXPECT_EQ(stats_.cached_bytes[kLargePool].current, static_cast<std::int64_t>(4 * kMiB));
  Check(5);
  // More than the whole free granules (one left, no headroom): refused, nothing changed.
  const std::int64_t cached = stats_.cached_bytes[kLargePool].current;
  EXPECT_TRUE(absl::IsResourceExhausted(pool_->Stitch(*ss_, nullptr, 6 * kMiB, -1).status()));
  EXPECT_EQ(stats_.cached_bytes[kLargePool].current, cached);
  Check(5);
}

TEST_F(StitchingPoolTest, ATierBlockMovesWholeAndItsSegmentGoes) {
  Block* t2 = TwoTierBlocksTheFirstFreed();
  ASSERT_NE(t2, nullptr);
  // A 6 MiB non-tier request at the cap takes the whole tier block (tier segments are never split),
  // uses three granules and gives the fourth back to the device.
  absl::StatusOr<Block*> s = pool_->Stitch(*ss_, nullptr, 6 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(stats_.num_granules_stitched, 3);
  EXPECT_EQ(stats_.num_granules_released, 1);
  EXPECT_EQ(source_->granules(), 7u);
  int segments = 0;
  pool_->ForEachSegment([&](const Segment&) { ++segments; });
  EXPECT_EQ(segments, 2) << "the all-hole tier segment was released";
  Check(2);
}

TEST_F(StitchingPoolTest, AFailedUnmapOrMapLeavesLiveBlocksAndTheStatsTrue) {
  for (int fail : {1, 3, 6}) {  // the first, a middle and the last unmap of six
    SCOPED_TRACE(fail);
    stats_ = DeviceStats();
    InitStitching(40 * kMiB);
    std::vector<Block*> live = FragmentTwoSegments();
    source_->fail_unmap_in = fail;
    absl::StatusOr<Block*> s = pool_->Stitch(*ss_, nullptr, 12 * kMiB, -1);
    EXPECT_FALSE(s.ok());
    for (Block* b : live) EXPECT_EQ(b->state, BlockState::kAllocated);
    Check(5);
    EXPECT_EQ(stats_.reserved_bytes[kLargePool].current, static_cast<std::int64_t>(source_->used()));
    EXPECT_EQ(stats_.num_granules_released, fail - 1) << "the granules unmapped before the failure went back";
    // A map failure: the unmapped granules go back to the device, the fresh range is released.
    source_->fail_map_in = 2;
    s = pool_->Stitch(*ss_, nullptr, 12 * kMiB, -1);
    EXPECT_FALSE(s.ok());
    Check(5);
    EXPECT_EQ(stats_.reserved_bytes[kLargePool].current, static_cast<std::int64_t>(source_->used()));
    // The next stitch has headroom and whatever free granules are left.
    s = pool_->Stitch(*ss_, nullptr, 12 * kMiB, -1);
    ASSERT_TRUE(s.ok()) << s.status();
    Check(6);
  }
}


TEST_F(StitchingPoolTest, WithKeepRemainderZeroEveryRemainderIsSplitOff) {
  LargePoolConfig config;
  config.keep_remainder = 0;  // the front end's choice with stitching
  InitStitching(64 * kMiB, config);
  Block* a = Allocate(19 * kMiB + 512 * kKiB);  // PyTorch's rule would hand out all 20 MiB
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->size, 19 * kMiB + 512 * kKiB);
  EXPECT_EQ(stats_.num_splits, 1);
  Check(1);
}

TEST_F(StitchingPoolTest, AFailedUnmapOfATierBlockLeavesPlainFreeMemory) {
  Block* t2 = TwoTierBlocksTheFirstFreed();
  ASSERT_NE(t2, nullptr);
  source_->fail_unmap_in = 2;  // in the stitch: one granule goes, then the unmap fails
  EXPECT_FALSE(pool_->Stitch(*ss_, nullptr, 6 * kMiB, -1).ok());
  Check(1);
  EXPECT_TRUE(ss_->tier_free[0].empty()) << "a tier list would hand the 6 MiB rest out as 8 MiB";
  Block* again = pool_->TryAllocate(*ss_, 8 * kMiB, 0);
  EXPECT_TRUE(again == nullptr || again->size >= 8 * kMiB);
  if (again != nullptr) pool_->Return(again);
  pool_->Return(t2);
  // A release that fails part-way does the same.
  source_->fail_unmap_in = 3;
  pool_->ReleaseFree(8 * kMiB);
  Check(0);
  for (std::size_t t = 0; t < pool_->num_tiers(); ++t) {
    for (Block* b = ss_->tier_free[t].front(); b != nullptr; b = ss_->tier_free[t].next(b)) {
      EXPECT_EQ(b->size, pool_->tier_bytes(static_cast<int>(t)));
    }
  }
}

TEST_F(StitchingPoolTest, PlainFreeBlocksGoBeforeATierBlockThatWouldGiveMoreThanNeeded) {
  LargePoolConfig config;
  config.tiers = {16 * kMiB};
  InitStitching(40 * kMiB, config);
  Block* t1 = Allocate(16 * kMiB);  // a tier block, freed first (the oldest)
  ++clock_;
  pool_->Return(t1);
  clock_ += 5;
  Block* a = Allocate(3 * kMiB);  // a 20 MiB segment: [3, 20) MiB free, eight whole granules
  ASSERT_NE(a, nullptr);
  // 4 MiB of headroom: a 6 MiB request needs one granule from free blocks.
  absl::StatusOr<Block*> s = pool_->Stitch(*ss_, nullptr, 6 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(stats_.num_granules_stitched, 1);
  EXPECT_EQ(stats_.num_granules_released, 0);
  EXPECT_FALSE(ss_->tier_free[0].empty()) << "the tier block was kept";
  Check(2);
}

TEST_F(StitchingPoolTest, ARefusedReleaseKeepsASpareThatTheNextGrowUses) {
  InitStitching(40 * kMiB);
  Block* a = Allocate(12 * kMiB);
  ASSERT_NE(a, nullptr);
  pool_->Return(a);
  source_->fail_release_in = 2;
  pool_->ReleaseFree(1);  // the oldest segment (GC's call; a full release would retry the spare)
  EXPECT_EQ(pool_->spare_bytes(), kG);
  EXPECT_EQ(stats_.reserved_bytes[kLargePool].current, static_cast<std::int64_t>(kG)) << "a spare is reserved";
  EXPECT_EQ(stats_.cached_bytes[kLargePool].current, static_cast<std::int64_t>(kG)) << "and cached";
  Check(0);
  Block* b = Allocate(12 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(pool_->spare_bytes(), 0u) << "the grow used the spare";
  EXPECT_EQ(source_->granules(), 6u);
  Check(1);
  pool_->Return(b);
  pool_->ReleaseFree(~std::size_t{0});
  EXPECT_EQ(source_->granules(), 0u);
  EXPECT_EQ(stats_.reserved_bytes[kLargePool].current, 0);
  Check(0);
}

}  // namespace
}  // namespace bucketalloc::internal
