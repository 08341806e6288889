// The large pool (src/pool/large_pool.cc): splitting, coalescing, oversize rules, tiers, PyTorch's
// best fit (the first bin with a fit read whole), the release order; stitching is
// tests/pool/stitcher_test.cc.
#include "pool/large_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "pool/large_pool_fixture.h"

namespace bucketalloc::internal {
namespace {

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
  EXPECT_EQ(Stats().num_splits, 2);
  EXPECT_EQ(Stats().inactive_split_bytes[kLargePool].current, static_cast<std::int64_t>(12 * kMiB));
  Check(2);
  Return(a);
  Return(b);  // coalesces with both neighbours
  EXPECT_EQ(Stats().num_merges, 2);
  EXPECT_EQ(Stats().inactive_split_bytes[kLargePool].current, 0);
  Check(0);
  EXPECT_EQ(pool_->largest_free_block(), 20 * kMiB);
  EXPECT_EQ(ReleaseAll(), 20 * kMiB);
  EXPECT_EQ(source_->used(), 0u);
}

TEST_F(LargePoolTest, RemainderOfAtMost1MiBIsNotSplitOff) {
  Init({});
  Block* a = Allocate(19 * kMiB + 512);  // remainder < 1 MiB: the whole 20 MiB block is handed out
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->size, 20 * kMiB);
  EXPECT_EQ(Stats().num_splits, 0);
  Return(a);
  Check(0);
}

TEST_F(LargePoolTest, OversizeBlocksAreNotSplitAndServeOnlyCloseSizes) {
  Init({.max_split_size = 32 * kMiB, .max_non_split_rounding = 4 * kMiB});
  Block* big = Allocate(100 * kMiB);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->size, 100 * kMiB);
  EXPECT_EQ(Stats().oversize_segments.current, 1);
  Return(big);
  // 50 MiB may not take (or split) the cached 100 MiB block: a new segment is made.
  Block* mid = Allocate(50 * kMiB);
  ASSERT_NE(mid, nullptr);
  EXPECT_NE(mid->segment->size, 100 * kMiB);
  // 97 MiB is within 4 MiB of it: served whole, no split.
  Block* close = Allocate(97 * kMiB);
  ASSERT_NE(close, nullptr);
  EXPECT_EQ(close->size, 100 * kMiB);
  EXPECT_EQ(Stats().num_splits, 0);
  Check(2);
  Return(mid);
  Return(close);
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
  Return(a);
  Block* b = Allocate(100 * kMiB);  // same tier: the same block, no new segment
  EXPECT_EQ(b->ptr, addr);
  EXPECT_EQ(source_->allocs, 1);
  Block* c = Allocate(40 * kMiB);  // another tier: its own segment
  EXPECT_EQ(c->size, 64 * kMiB);
  EXPECT_EQ(Stats().num_splits, 0);
  Check(2);
  FragmentationReport frag;
  pool_->AddFragmentation(&frag);
  std::vector<TierUsage> tiers = frag.tiers;
  ASSERT_EQ(tiers.size(), 3u);
  EXPECT_EQ(tiers[0].in_use, 1);
  EXPECT_EQ(tiers[1].in_use, 1);
  Return(b);
  Return(c);
  pool_->AddFragmentation(&frag);
  tiers = frag.tiers;
  EXPECT_EQ(tiers[1].cached, 1);
  Check(0);
}

// The fragmentation figures a scrape reads are kept as blocks move (no walk): after every step of a
// random churn of split, merged, tiered and oversize blocks, and releases, they equal a walk's.
TEST_F(LargePoolTest, KeptFragmentationEqualsAWalkThroughChurn) {
  LargePoolConfig config;
  config.max_split_size = 40 * kMiB;
  config.tiers = {32 * kMiB, 64 * kMiB};
  Init(config, 2048 * kMiB);
  std::mt19937_64 rng(27);
  const std::size_t sizes[] = {kMiB + 512, 3 * kMiB, 7 * kMiB, 17 * kMiB, 30 * kMiB, 60 * kMiB, 90 * kMiB};
  std::vector<Block*> live;
  auto expect_kept_equals_walk = [&](int step) {
    FragmentationReport kept;
    FragmentationReport walked;
    pool_->AddFragmentation(&kept);
    pool_->WalkFragmentation(&walked);
    const PoolFragmentation& k = kept.pools[kLargePool];
    const PoolFragmentation& w = walked.pools[kLargePool];
    ASSERT_EQ(k.free_count, w.free_count) << "step " << step;
    ASSERT_EQ(k.free_bytes, w.free_bytes) << "step " << step;
    ASSERT_EQ(k.total_free, w.total_free) << "step " << step;
    ASSERT_EQ(static_cast<std::int64_t>(pool_->LargestFree(*ss_)), w.largest_free) << "step " << step;
    ASSERT_EQ(kept.tiers.size(), walked.tiers.size());
    for (std::size_t t = 0; t < kept.tiers.size(); ++t) {
      ASSERT_EQ(kept.tiers[t].in_use, walked.tiers[t].in_use) << "step " << step << " tier " << t;
      ASSERT_EQ(kept.tiers[t].cached, walked.tiers[t].cached) << "step " << step << " tier " << t;
    }
  };
  for (int step = 0; step < 3000; ++step) {
    const auto dice = rng() % 10;
    if (dice < 5 || live.empty()) {
      if (Block* b = Allocate(sizes[rng() % std::size(sizes)])) live.push_back(b);
    } else if (dice < 9) {
      const std::size_t i = rng() % live.size();
      Return(live[i]);
      live[i] = live.back();
      live.pop_back();
    } else {
      pool_->ReleaseOldest();
    }
    expect_kept_equals_walk(step);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(Stats().num_splits, 0);
  EXPECT_GT(Stats().num_merges, 0);
  Check(static_cast<std::int64_t>(live.size()));
  for (Block* b : live) Return(b);
  expect_kept_equals_walk(-1);
}

TEST_F(LargePoolTest, BestFitPrefersTheSmallestFittingBlock) {
  Init({});
  // Three separate segments, freed: 30, 24 and 40 MiB.
  Block* x = Allocate(30 * kMiB);
  Block* y = Allocate(24 * kMiB);
  Block* z = Allocate(40 * kMiB);
  for (Block* b : {x, y, z}) Return(b);
  Block* got = Allocate(23 * kMiB + 1);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->segment->size, 24 * kMiB);
  Check(1);
  Return(got);
}

TEST_F(LargePoolTest, ALargerBinGivesItsSmallestBlockThenItsLowestAddress) {
  // PyTorch's rule, whatever the order of the bin's list: the request's own bin is empty and the next
  // one holds a 26 and a 24 MiB segment, the 26 MiB one at the front of the list.
  Init({});
  Block* b26 = Allocate(26 * kMiB);
  Block* b24 = Allocate(24 * kMiB);
  Return(b24);
  Return(b26);
  Block* got = Allocate(22 * kMiB);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->segment->size, 24 * kMiB);
  Return(got);
  Check(0);

  // Two equal free blocks of `size`, the higher one at the front: a request of 22 MiB takes the
  // lower one, from the next bin (24 MiB) or from its own bin (an exact fit).
  for (std::size_t size : {24 * kMiB, 22 * kMiB}) {
    SCOPED_TRACE(size);
    Init({});
    Block* low = Allocate(size);
    Block* high = Allocate(size);
    ASSERT_LT(low->ptr, high->ptr);
    Return(low);
    Return(high);
    Block* again = Allocate(22 * kMiB);
    ASSERT_NE(again, nullptr);
    EXPECT_EQ(again->ptr, low->ptr);
    Return(again);
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
  Return(b20);
  Return(b24);
  Return(b26);
  Block* got = Allocate(22 * kMiB);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->segment->size, 24 * kMiB);
  EXPECT_EQ(source_->allocs, 3) << "served from the cache";
  Return(got);
  Check(0);
}

TEST_F(LargePoolTest, TheFastPathReadsTheWholeFirstBin) {
  // 33 blocks of 16.5 MiB in front of one of 18.5 MiB, all in the same bin: a fast-path scan
  // bounded at 32 entries (as it once was) missed the fitting block; the whole bin is read now.
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
  Return(fits);
  for (Block* b : small_holes) Return(b);  // pushed in front of `fits` in the bin
  const int allocs = source_->allocs;
  Block* found = TryAllocate(18 * kMiB, -1);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(source_->allocs, allocs) << "found in the cache, not grown";
  EXPECT_EQ(found->ptr, fits->ptr);
  Check(35);
  Return(found);
  Return(fits_pin);
  for (Block* b : keep) Return(b);
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
  Return(b);
}

TEST_F(LargePoolTest, ReleaseOrderIsOldestFirst) {
  Init({});
  Block* a = Allocate(30 * kMiB);
  Block* b = Allocate(40 * kMiB);
  clock_ = 5;
  Return(b);
  clock_ = 9;
  Return(a);
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
  Return(a);
}

}  // namespace
}  // namespace bucketalloc::internal
