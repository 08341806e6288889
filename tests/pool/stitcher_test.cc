// Stitching (src/pool/stitcher.cc, src/pool/virtual_backing.cc): a large pool over fake 2 MiB
// granules; pieces (granule pieces for plain segments, one piece for a tier segment), the choice of
// pieces, oldest first, partial granules, tier blocks, one unmap per run, unmap and map faults,
// split remainders, spares; the pool's slow path at the cap (the backing's ServeAtCap), refused
// during a capture; a full release that has nothing to give back waits on no stream.
#include "pool/stitcher.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pool/large_pool_fixture.h"
#include "pool/virtual_backing.h"

namespace bucketalloc::internal {
namespace {

TEST_F(StitchingPoolTest, GrowMapsOneGranulePerGranuleOfThePlainSegment) {
  InitStitching(64 * kMiB);
  Block* a = Allocate(3 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->segment->size, 20 * kMiB);
  EXPECT_EQ(source_->handles(), 10u);
  EXPECT_EQ(source_->mapped(), 10u);
  EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, static_cast<std::int64_t>(20 * kMiB));
  Check(1);
  Return(a);
  EXPECT_EQ(ReleaseAll(), 20 * kMiB);
  EXPECT_EQ(source_->handles(), 0u);
  EXPECT_EQ(source_->mapped(), 0u);
  EXPECT_EQ(Stats().num_granules_released, 10);
  EXPECT_EQ(source_->unmaps, 1) << "one unmap for the ten mappings side by side";
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, 0);
  Check(0);
}

// Away from the cap a grow creates pieces of grow_piece (the last one what is left); at the cap a
// stitch moves and creates granules, so the stitched block's memory is granule pieces whatever it
// was before (a larger free piece goes back to the device and is created anew in granules).
TEST_F(StitchingPoolTest, AGrowAwayFromTheCapCreatesGrowPiecesAndAStitchGranules) {
  LargePoolConfig config;
  config.grow_piece = 8 * kMiB;
  InitStitching(40 * kMiB, config);
  Served served = Served::kFromCache;
  absl::StatusOr<LargePool::Handle> a = pool_->Serve(*ss_, nullptr, pool_->RequestFor(12 * kMiB), &served);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(served, Served::kFromNewMemory);
  EXPECT_EQ(source_->creates, 2) << "12 MiB: a piece of 8 MiB and one of 4";
  absl::StatusOr<LargePool::Handle> b = pool_->Serve(*ss_, nullptr, pool_->RequestFor(12 * kMiB), &served);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(source_->creates, 4);
  std::set<std::size_t> sizes;
  for (const Piece& p : *a->block->segment->pieces) sizes.insert(p.n * kG);
  EXPECT_EQ(sizes, (std::set<std::size_t>{4 * kMiB, 8 * kMiB}));
  Check(2);
  // 24 MiB of the 40 used; the first block freed, then 20 MiB: the grow fails at the cap, and the
  // stitch takes the free block's pieces.
  Return(a->block);
  absl::StatusOr<LargePool::Handle> c = pool_->Serve(*ss_, nullptr, pool_->RequestFor(20 * kMiB), &served);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Stats().num_stitches, 1);
  Check(2);
  const Segment* seg = c->block->segment;
  for (const Piece& p : *seg->pieces) {
    const std::uintptr_t lo = seg->base + p.g0 * kG;
    if (lo >= c->block->ptr && lo < c->block->ptr + c->block->size) {
      EXPECT_EQ(p.n, 1u) << "a piece of the stitched block at +" << (lo - c->block->ptr) << " is not a granule";
    }
  }
  EXPECT_LE(source_->used(), 40 * kMiB);
}

TEST_F(StitchingPoolTest, ATierSegmentIsOnePiece) {
  LargePoolConfig config;
  config.tiers = {8 * kMiB};
  InitStitching(64 * kMiB, config);
  Block* t = Allocate(8 * kMiB);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(source_->creates, 1);
  EXPECT_EQ(source_->maps, 1);
  ASSERT_NE(t->segment->pieces, nullptr);
  ASSERT_EQ(t->segment->pieces->size(), 1u);
  EXPECT_EQ((*t->segment->pieces)[0].n, 4u);
  Check(1);
  Return(t);
  EXPECT_EQ(ReleaseAll(), 8 * kMiB);
  EXPECT_EQ(source_->unmaps, 1);
  EXPECT_EQ(source_->handles(), 0u);
  Check(0);
}

TEST_F(StitchingPoolTest, StitchMovesTheGranulesOfFreeBlocksIntoOneRange) {
  InitStitching(40 * kMiB);
  std::vector<Block*> live = FragmentTwoSegments();
  Check(5);
  // No cached block fits 12 MiB and the cap is reached: growing fails, stitching serves it.
  EXPECT_LT(pool_->largest_free_block(), 12 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(pool_->Grow(*ss_, nullptr, 12 * kMiB, 12 * kMiB, -1).status()));
  const std::set<PhysicalHandle> before = [&] {
    std::set<PhysicalHandle> h;
    for (Block* b : live) h.insert(source_->HandleAt(b->ptr));
    return h;
  }();
  absl::StatusOr<Block*> s = Stitch(12 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  Block* big = *s;
  EXPECT_EQ(big->size, 12 * kMiB);
  EXPECT_EQ(Stats().num_stitches, 1);
  EXPECT_EQ(Stats().num_granules_stitched, 6);
  EXPECT_EQ(source_->handles(), 20u) << "no granule was created or released";
  EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, static_cast<std::int64_t>(40 * kMiB));
  for (std::size_t g = 0; g < 6; ++g) {
    const PhysicalHandle h = source_->HandleAt(big->ptr + g * kG);
    EXPECT_NE(h, 0u);
    EXPECT_FALSE(before.contains(h)) << "a granule of a live block was taken";
  }
  for (Block* b : live) EXPECT_EQ(b->state, BlockState::kAllocated);
  EXPECT_EQ(source_->synced.size(), 1u) << "the free blocks' stream is synchronized once before the unmaps";
  EXPECT_EQ(source_->unmaps, 3) << "one unmap per free block: its two granules side by side";
  Check(6);
  // Everything frees and releases; the holes leave nothing behind.
  Return(big);
  for (Block* b : live) Return(b);
  Check(0);
  ReleaseAll();
  EXPECT_EQ(source_->handles(), 0u);
  EXPECT_EQ(source_->mapped(), 0u);
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, 0);
  Check(0);
}

TEST_F(StitchingPoolTest, StitchTakesTheOldestFreeGranulesFirst) {
  InitStitching(40 * kMiB);
  std::vector<Block*> live = FragmentTwoSegments();  // freed in address order: blocks 0, 2, 4, 6, 8
  absl::StatusOr<Block*> s = Stitch(4 * kMiB, -1);
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
  Return(blocks[1]);  // [3, 6) MiB: whole granule [4, 6)
  Return(blocks[3]);  // [9, 12) MiB: whole granule [10, 12)
  Check(4);
  absl::StatusOr<Block*> s = Stitch(4 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Stats().num_granules_stitched, 2);
  // The oldest (all equally old: the lowest addresses) whole granules moved; what stays cached is
  // the free pieces [3, 4) and [9, 10) MiB, below a granule, and the free tail [18, 20) MiB.
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, static_cast<std::int64_t>(4 * kMiB));
  Check(5);
  // More than the whole free granules (one left, no headroom): refused, nothing changed.
  const std::int64_t cached = Stats().cached_bytes[kLargePool].current;
  EXPECT_TRUE(absl::IsResourceExhausted(Stitch(6 * kMiB, -1).status()));
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, cached);
  Check(5);
}

TEST_F(StitchingPoolTest, ATierBlockMovesWholeAndItsSegmentGoes) {
  Block* t2 = TwoTierBlocksTheFirstFreed();
  ASSERT_NE(t2, nullptr);
  // A 6 MiB non-tier request at the cap takes the whole tier block (tier segments are never split).
  // It is one 8 MiB piece, more than needed: it goes back to the device, and the 6 MiB are created
  // anew in granules, so that no free granule shares a piece with the live block.
  absl::StatusOr<Block*> s = Stitch(6 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Stats().num_granules_stitched, 0);
  EXPECT_EQ(Stats().num_granules_released, 4);
  EXPECT_EQ(source_->handles(), 4u) << "the other tier block's piece and three granules";
  EXPECT_EQ(source_->used(), 14 * kMiB);
  int segments = 0;
  pool_->ForEachSegment([&](const Segment&) { ++segments; });
  EXPECT_EQ(segments, 2) << "the all-hole tier segment was released";
  Check(2);
}

// A plain segment is granule pieces whatever it is stitched from: a tier block's 8 MiB piece goes
// back to the device and the 8 MiB are created anew in granules, so that a block later carved from
// the stitched segment leaves its free granules movable.
TEST_F(StitchingPoolTest, APlainStitchNeverMapsATierBlocksPieceWhole) {
  Block* t2 = TwoTierBlocksTheFirstFreed();
  ASSERT_NE(t2, nullptr);
  const int creates = source_->creates;
  absl::StatusOr<Block*> s = Stitch(8 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_NE((*s)->segment->pieces, nullptr);
  EXPECT_EQ((*s)->segment->pieces->size(), 4u);
  for (const Piece& p : *(*s)->segment->pieces) EXPECT_EQ(p.n, 1u);
  EXPECT_EQ(source_->creates - creates, 4);
  EXPECT_EQ(Stats().num_granules_released, 4);
  Check(2);
  // Freed, and a 3 MiB block carved from it: the two granules above it can move.
  Return(*s);
  Block* a = Allocate(3 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(pool_->movable_bytes(), 4 * kMiB);
  EXPECT_TRUE(Stitch(4 * kMiB, -1).ok());
  Check(3);
}

// A spare larger than a granule is not mapped into a plain segment, so it is not counted as the
// stitch's own memory: the stitch moves free granules instead of creating past the cap.
TEST_F(StitchingPoolTest, ASpareTooLargeForAPlainSegmentIsNotCountedAsOwn) {
  LargePoolConfig config;
  config.tiers = {8 * kMiB};
  InitStitching(28 * kMiB, config);
  Block* t1 = Allocate(8 * kMiB);
  Block* t2 = Allocate(8 * kMiB);
  ASSERT_TRUE(t1 != nullptr && t2 != nullptr);
  Return(t1);
  source_->fail_release_in = 1;
  ReleaseOldestUntil(*pool_, 1);
  ASSERT_EQ(pool_->spare_bytes(), 8 * kMiB);
  Block* p = Allocate(12 * kMiB);  // a plain segment of six granules: the spare is not taken
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(pool_->spare_bytes(), 8 * kMiB);
  Return(p);
  ASSERT_EQ(source_->used(), 28 * kMiB);
  const int creates = source_->creates;
  absl::StatusOr<Block*> s = Stitch(4 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(source_->creates, creates) << "two free granules moved";
  EXPECT_EQ(Stats().num_granules_stitched, 2);
  Check(2);
}

TEST_F(StitchingPoolTest, AFailedUnmapOrMapLeavesLiveBlocksAndTheStatsTrue) {
  for (int fail : {1, 2, 3}) {  // the first, the middle and the last unmap of three (a free block each)
    SCOPED_TRACE(fail);
    InitStitching(40 * kMiB);
    std::vector<Block*> live = FragmentTwoSegments();
    source_->fail_unmap_in = fail;
    absl::StatusOr<Block*> s = Stitch(12 * kMiB, -1);
    EXPECT_FALSE(s.ok());
    for (Block* b : live) EXPECT_EQ(b->state, BlockState::kAllocated);
    Check(5);
    EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, static_cast<std::int64_t>(source_->used()));
    EXPECT_EQ(Stats().num_granules_released, 2 * (fail - 1)) << "the pieces unmapped before the failure went back";
    // A map failure: the unmapped granules go back to the device, the fresh range is released.
    source_->fail_map_in = 2;
    s = Stitch(12 * kMiB, -1);
    EXPECT_FALSE(s.ok());
    Check(5);
    EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, static_cast<std::int64_t>(source_->used()));
    // The next stitch has headroom and whatever free granules are left.
    s = Stitch(12 * kMiB, -1);
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
  EXPECT_EQ(Stats().num_splits, 1);
  Check(1);
}

TEST_F(StitchingPoolTest, AFailedUnmapOfATierBlockChangesNothing) {
  Block* t2 = TwoTierBlocksTheFirstFreed();
  ASSERT_NE(t2, nullptr);
  source_->fail_unmap_in = 1;  // the one unmap of the tier block's piece
  EXPECT_FALSE(Stitch(6 * kMiB, -1).ok());
  Check(1);
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, static_cast<std::int64_t>(8 * kMiB));
  Block* again = TryAllocate(8 * kMiB, 0);
  ASSERT_NE(again, nullptr) << "still a whole tier block in its list";
  EXPECT_EQ(again->size, 8 * kMiB);
  Return(again);
  Return(t2);
  // A release that fails leaves it cached and whole too.
  source_->fail_unmap_in = 1;
  ReleaseOldestUntil(*pool_, 8 * kMiB);
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
  Return(t1);
  clock_ += 5;
  Block* a = Allocate(3 * kMiB);  // a 20 MiB segment: [3, 20) MiB free, eight whole granules
  ASSERT_NE(a, nullptr);
  // 4 MiB of headroom: a 6 MiB request needs one granule from free blocks.
  absl::StatusOr<Block*> s = Stitch(6 * kMiB, -1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Stats().num_granules_stitched, 1);
  EXPECT_EQ(Stats().num_granules_released, 0);
  EXPECT_FALSE(ss_->tier_free[0].empty()) << "the tier block was kept";
  Check(2);
}

TEST_F(StitchingPoolTest, ARefusedReleaseKeepsASpareThatTheNextGrowUses) {
  InitStitching(40 * kMiB);
  Block* a = Allocate(12 * kMiB);
  ASSERT_NE(a, nullptr);
  Return(a);
  source_->fail_release_in = 2;
  ReleaseOldestUntil(*pool_, 1);  // the oldest segment (GC's call; a full release would retry the spare)
  EXPECT_EQ(pool_->spare_bytes(), kG);
  EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, static_cast<std::int64_t>(kG)) << "a spare is reserved";
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, static_cast<std::int64_t>(kG)) << "and cached";
  Check(0);
  Block* b = Allocate(12 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(pool_->spare_bytes(), 0u) << "the grow used the spare";
  EXPECT_EQ(source_->handles(), 6u);
  Check(1);
  Return(b);
  ReleaseAll();
  EXPECT_EQ(source_->handles(), 0u);
  EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, 0);
  Check(0);
}

// The pool's slow path at the cap: the grow fails and the backing stitches; when too few pieces
// can move, the error names the grow's failure and the stitch's.
TEST_F(StitchingPoolTest, ServeStitchesAtTheCapAndNamesBothFailures) {
  InitStitching(40 * kMiB);
  FragmentTwoSegments();
  Served served = Served::kFromCache;
  absl::StatusOr<LargePool::Handle> h = pool_->Serve(*ss_, nullptr, pool_->RequestFor(12 * kMiB), &served);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(served, Served::kFromNewMemory);
  EXPECT_EQ(LargePool::BlockSize(*h), 12 * kMiB);
  EXPECT_EQ(Stats().num_stitches, 1);
  Check(6);
  // Two free blocks of two granules are left: 8 MiB can move, 20 MiB cannot.
  EXPECT_EQ(pool_->movable_bytes(), 8 * kMiB);
  const std::int64_t cached = Stats().cached_bytes[kLargePool].current;
  absl::StatusOr<LargePool::Handle> more = pool_->Serve(*ss_, nullptr, pool_->RequestFor(20 * kMiB), &served);
  ASSERT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_EQ(more.status().message(),
            absl::StrCat("fake source: limit; stitching: bucketalloc: stitching ", 20 * kMiB, " bytes needs ",
                         20 * kMiB, " bytes of free pieces; ", 8 * kMiB, " bytes are free in whole pieces"));
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, cached) << "nothing changed";
  EXPECT_EQ(source_->synced.size(), 1u) << "the refused stitch waited on no stream";
  Check(6);
}

// During a capture nothing is unmapped: the grow's error, as it is.
TEST_F(StitchingPoolTest, ServeDoesNotStitchDuringACapture) {
  InitStitching(40 * kMiB);
  FragmentTwoSegments();
  source_->capturing = true;
  Served served;
  absl::StatusOr<LargePool::Handle> h = pool_->Serve(*ss_, nullptr, pool_->RequestFor(12 * kMiB), &served);
  ASSERT_TRUE(absl::IsResourceExhausted(h.status())) << h.status();
  EXPECT_EQ(h.status().message(), "fake source: limit");
  EXPECT_EQ(Stats().num_stitches, 0);
  EXPECT_EQ(source_->unmaps, 0);
  EXPECT_TRUE(source_->synced.empty());
  Check(5);
}

// A full release whose segments' free blocks hold no whole granule, and no spare, waits on no
// stream; once a free block holds one, its stream is waited on and the granule goes back.
TEST_F(StitchingPoolTest, AReleaseWithNoFreeGranuleWaitsOnNoStream) {
  LargePoolConfig config;
  config.keep_remainder = 0;
  InitStitching(64 * kMiB, config);
  Block* a = Allocate(3 * kMiB);   // [0, 3) MiB of a 20 MiB segment
  Block* b = Allocate(16 * kMiB);  // [3, 19) MiB: the free rest [19, 20) MiB holds no whole granule
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_EQ(a->segment, b->segment);
  EXPECT_EQ(ReleaseAll(), 0u);
  EXPECT_TRUE(source_->synced.empty());
  Return(a);  // [0, 3) MiB free: granule [0, 2) MiB is whole
  EXPECT_EQ(ReleaseAll(), kG);
  EXPECT_EQ(source_->synced.size(), 1u);
  EXPECT_EQ(Stats().num_granules_released, 1);
  Check(1);
}

// ---- A plain request grows its stream's segment in place (Stitcher::Extend), as PyTorch's
// expandable segments do: through the pool's slow path, with a range of 64 MiB per segment.

class GrowInPlaceTest : public StitchingPoolTest {
 protected:
  void Init(std::size_t cap) {
    LargePoolConfig config;
    config.keep_remainder = 0;  // as the front end configures a virtual-memory pool
    InitStitching(cap, config);
    source_->growable_range = 64 * kMiB;
  }
  Block* Serve(std::size_t size) {
    Served served;
    absl::StatusOr<LargePool::Handle> h = pool_->Serve(*ss_, nullptr, pool_->RequestFor(size), &served);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? h->block : nullptr;
  }
};

TEST_F(GrowInPlaceTest, EachRequestMapsWhatTheFreeTailBeforeItLacks) {
  Init(64 * kMiB);
  Block* a = Serve(3 * kMiB);
  ASSERT_NE(a, nullptr);
  Segment* seg = a->segment;
  EXPECT_EQ(seg->size, 64 * kMiB) << "one range for the stream, mapped where it holds memory";
  EXPECT_EQ(a->ptr, seg->base);
  EXPECT_EQ(source_->handles(), 2u) << "3 MiB: two granules, not a 20 MiB segment's ten";
  // The next one starts in the free megabyte after the first and maps one granule more.
  Block* b = Serve(3 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->segment, seg);
  EXPECT_EQ(b->ptr, a->ptr + 3 * kMiB);
  EXPECT_EQ(source_->handles(), 3u);
  EXPECT_EQ(source_->ranges(), 1u);
  EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, static_cast<std::int64_t>(6 * kMiB));
  Check(2);
  Return(a);
  Return(b);
  Check(0);
  EXPECT_EQ(ReleaseAll(), 6 * kMiB);
  EXPECT_EQ(source_->handles(), 0u);
  EXPECT_EQ(source_->ranges(), 0u) << "a wholly free segment gives its range back";
  Check(0);
}

// A request the free bytes before the hole would save no granule (4 MiB after a 3 MiB block: two
// granules either way) starts on a granule: it holds whole granules of its own, which can move
// when it is freed, and the free megabyte stays for a smaller request.
TEST_F(GrowInPlaceTest, ARequestThatTheFreeBytesBeforeItSaveNoGranuleStartsOnAGranule) {
  Init(64 * kMiB);
  Block* a = Serve(3 * kMiB);
  ASSERT_NE(a, nullptr);
  Block* b = Serve(4 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->segment, a->segment);
  EXPECT_EQ(b->ptr, a->ptr + 4 * kMiB);
  EXPECT_EQ(source_->handles(), 4u);
  EXPECT_EQ(pool_->largest_free_block(), kMiB) << "the megabyte after the first block";
  Check(2);
}

// Five 4 MiB blocks fill a 20 MiB cap side by side; blocks 0 and 2 are freed, then block 4.
TEST_F(GrowInPlaceTest, AtTheCapTheHoleBesideAFreeBlockTakesOnlyWhatItLacks) {
  Init(20 * kMiB);
  std::vector<Block*> b;
  for (int i = 0; i < 5; ++i) b.push_back(Serve(4 * kMiB));
  for (Block* x : b) ASSERT_NE(x, nullptr);
  const std::uintptr_t base = b[0]->segment->base;
  for (int i : {0, 2, 4}) {
    ++clock_;
    Return(b[i]);
  }
  Check(2);
  // 6 MiB fits no free block; beside the free [16, 20) MiB it lacks one granule, and the oldest
  // free block's top granule moves there.
  Block* c = Serve(6 * kMiB);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->ptr, base + 16 * kMiB);
  EXPECT_EQ(c->size, 6 * kMiB);
  EXPECT_EQ(Stats().num_stitches, 1);
  EXPECT_EQ(Stats().num_granules_stitched, 1);
  EXPECT_EQ(source_->handles(), 10u) << "nothing created or released";
  EXPECT_EQ(source_->ranges(), 1u) << "no new range";
  EXPECT_EQ(source_->HandleAt(base + 2 * kMiB), 0u) << "block 0's top granule moved";
  EXPECT_NE(source_->HandleAt(base + 20 * kMiB), 0u);
  Check(3);
  // Then 8 MiB, beside nothing free (c ends the mapped part): it needs 4 granules, and 3 can move
  // (block 0's last and block 2's two): refused, having changed nothing.
  Served served;
  absl::StatusOr<LargePool::Handle> d = pool_->Serve(*ss_, nullptr, pool_->RequestFor(8 * kMiB), &served);
  ASSERT_TRUE(absl::IsResourceExhausted(d.status())) << d.status();
  EXPECT_EQ(source_->handles(), 10u);
  Check(3);
  Return(c);
  Return(b[1]);
  Return(b[3]);
  Check(0);
  ReleaseAll();
  EXPECT_EQ(source_->handles(), 0u);
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, 0);
  Check(0);
}

// A map that fails part-way leaves the granules it mapped as free memory of the segment, the rest
// back to the device, and the pool consistent.
TEST_F(GrowInPlaceTest, AMapThatFailsPartWayKeepsWhatItMappedFree) {
  Init(64 * kMiB);
  Block* a = Serve(3 * kMiB);
  ASSERT_NE(a, nullptr);
  source_->fail_map_in = 2;
  Served served;
  absl::StatusOr<LargePool::Handle> h = pool_->Serve(*ss_, nullptr, pool_->RequestFor(9 * kMiB), &served);
  EXPECT_FALSE(h.ok());
  EXPECT_EQ(source_->handles(), 3u) << "the granule mapped stays, the three others went back";
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, static_cast<std::int64_t>(3 * kMiB));
  Check(1);
  Return(a);
  ReleaseAll();
  EXPECT_EQ(source_->handles(), 0u);
  Check(0);
}

// A map into a hole that could not be undone (DataLoss) leaves mappings there that the pool does
// not know: that segment's holes are never mapped again (the next request gets a new segment), and
// its range is abandoned, never handed out again, when it goes.
TEST_F(GrowInPlaceTest, AMapIntoAHoleThatCannotBeUndoneRetiresTheSegmentsHoles) {
  Init(64 * kMiB);
  Block* a = Serve(3 * kMiB);
  ASSERT_NE(a, nullptr);
  source_->fail_map_in = 2;
  source_->map_failure_is_data_loss = true;
  Served served;
  absl::StatusOr<LargePool::Handle> h = pool_->Serve(*ss_, nullptr, pool_->RequestFor(9 * kMiB), &served);
  EXPECT_TRUE(absl::IsDataLoss(h.status())) << h.status();
  Check(1);
  Block* b = Serve(9 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(b->segment, a->segment) << "not into the hole whose mappings are unknown";
  EXPECT_EQ(source_->ranges(), 2u);
  Check(2);
  Return(a);
  Return(b);
  ReleaseAll();
  EXPECT_EQ(source_->abandoned_ranges, 1);
  EXPECT_EQ(source_->ranges(), 0u);
  Check(0);
}

// With max_split_size set a block grown in place could pass it and never be split: plain requests
// get segments of their own, as before.
TEST_F(GrowInPlaceTest, WithMaxSplitSizeAPlainRequestGetsASegmentOfItsOwn) {
  LargePoolConfig config;
  config.max_split_size = 64 * kMiB;
  config.keep_remainder = 0;
  InitStitching(64 * kMiB, config);
  source_->growable_range = 64 * kMiB;
  Block* a = Serve(3 * kMiB);
  Block* b = Serve(30 * kMiB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->segment, b->segment);
  EXPECT_EQ(a->segment->size, 20 * kMiB);
  Check(2);
}

}  // namespace
}  // namespace bucketalloc::internal
