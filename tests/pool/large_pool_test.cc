// The large pool (src/pool/large_pool.cc): splitting, coalescing, oversize rules, tiers, PyTorch's
// best fit (the first bin with a fit read whole), the release order; stitching is
// tests/pool/stitcher_test.cc.
#include "pool/large_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

// ---- TakeAt: a block carved at a given address (restoring a checkpoint) ----------------------

// What TakeAt must keep true, read from the ledger and the pool: nothing else may change on a
// refusal, and the kept figures equal a walk's after a carve.
struct TakeAtView {
  std::int64_t active = 0, active_bytes = 0, cached_bytes = 0, split_bytes = 0, split = 0, splits = 0;
  PoolFragmentation frag;
  bool operator==(const TakeAtView& o) const {
    return active == o.active && active_bytes == o.active_bytes && cached_bytes == o.cached_bytes &&
           split_bytes == o.split_bytes && split == o.split && splits == o.splits &&
           frag.free_count == o.frag.free_count && frag.free_bytes == o.frag.free_bytes &&
           frag.total_free == o.frag.total_free;
  }
};

class LargePoolTakeAtTest : public LargePoolTest {
 protected:
  // The configurations the large pool's tests use: PyTorch's defaults, stitching (every remainder
  // split off), tiers, a max_split_size.
  struct NamedConfig {
    const char* name;
    LargePoolConfig config;
    Backing backing = Backing::kPlain;
  };
  static std::vector<NamedConfig> Configs() {
    std::vector<NamedConfig> c;
    c.push_back({"default", LargePoolConfig{}});
    c.push_back({"stitching", LargePoolConfig{.keep_remainder = 0}, Backing::kVirtual});
    c.push_back({"tiers", LargePoolConfig{.tiers = {64 * kMiB, 128 * kMiB}}});
    c.push_back({"max_split_size", LargePoolConfig{.max_split_size = 32 * kMiB}});
    return c;
  }
  TakeAtView View() const {
    const DeviceStats s = Stats();
    TakeAtView v;
    v.active = s.active[kLargePool].current;
    v.active_bytes = s.active_bytes[kLargePool].current;
    v.cached_bytes = s.cached_bytes[kLargePool].current;
    v.split_bytes = s.inactive_split_bytes[kLargePool].current;
    v.split = s.inactive_split[kLargePool].current;
    v.splits = s.num_splits;
    FragmentationReport frag;
    pool_->AddFragmentation(&frag);
    v.frag = frag.pools[kLargePool];
    return v;
  }
  // The invariants, and the inactive_split gauges against a walk.
  void CheckAll(std::int64_t active) {
    Check(active);
    const InactiveSplit walked = pool_->inactive_split();
    EXPECT_EQ(Stats().inactive_split_bytes[kLargePool].current, walked.bytes);
    EXPECT_EQ(Stats().inactive_split[kLargePool].current, walked.count);
  }
  // Refused, naming the address and size, and nothing changed.
  void ExpectRefused(std::uintptr_t addr, std::size_t size, absl::StatusCode code, Stream stream = nullptr) {
    const TakeAtView before = View();
    absl::StatusOr<LargePool::Handle> h = pool_->TakeAt(addr, size, stream);
    ASSERT_FALSE(h.ok()) << "took " << size << " at " << addr;
    EXPECT_EQ(h.status().code(), code) << h.status();
    EXPECT_NE(h.status().message().find(absl::StrCat(size, " bytes at 0x", absl::Hex(addr))), absl::string_view::npos)
        << h.status();
    EXPECT_TRUE(View() == before) << h.status();
  }
};

TEST_F(LargePoolTakeAtTest, FreedBlocksComeBackAtTheirAddressesInEveryConfiguration) {
  for (const auto& [name, config, backing] : Configs()) {
    SCOPED_TRACE(name);
    Init(config, 1024 * kMiB, backing);
    Block* a = Allocate(3 * kMiB);
    Block* b = Allocate(5 * kMiB);
    Block* c = Allocate(4 * kMiB);
    ASSERT_TRUE(a != nullptr && b != nullptr && c != nullptr);
    ASSERT_EQ(a->segment, c->segment);
    const std::uintptr_t pa = a->ptr, pb = b->ptr, pc = c->ptr;
    const std::size_t sa = a->size, sb = b->size, sc = c->size;
    Return(a);
    Return(b);
    Return(c);
    CheckAll(0);
    // The middle block first: free remainders on both sides.
    absl::StatusOr<LargePool::Handle> hb = pool_->TakeAt(pb, sb, nullptr);
    ASSERT_TRUE(hb.ok()) << hb.status();
    EXPECT_EQ(LargePool::Address(*hb), pb);
    EXPECT_EQ(LargePool::BlockSize(*hb), sb);
    CheckAll(1);
    absl::StatusOr<LargePool::Handle> ha = pool_->TakeAt(pa, sa, nullptr);
    ASSERT_TRUE(ha.ok()) << ha.status();
    absl::StatusOr<LargePool::Handle> hc = pool_->TakeAt(pc, sc, nullptr);
    ASSERT_TRUE(hc.ok()) << hc.status();
    EXPECT_EQ(Stats().active_bytes[kLargePool].current, static_cast<std::int64_t>(sa + sb + sc));
    EXPECT_EQ(Stats().active[kLargePool].current, 3);
    CheckAll(3);
    // The rest of the segment is one free block after c; the normal path still serves from it.
    Block* d = Allocate(2 * kMiB);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->ptr, pc + sc);
    CheckAll(4);
    for (Block* blk : {ha->block, hb->block, hc->block, d}) Return(blk);
    CheckAll(0);
    EXPECT_EQ(Stats().active_bytes[kLargePool].current, 0);
    EXPECT_EQ(pool_->largest_free_block(), 20 * kMiB);
  }
}

TEST_F(LargePoolTakeAtTest, RefusesRangesOutsideOneFreeBlockAndChangesNothing) {
  for (const auto& [name, config, backing] : Configs()) {
    SCOPED_TRACE(name);
    Init(config, 1024 * kMiB, backing);
    Block* a = Allocate(3 * kMiB);
    Block* b = Allocate(5 * kMiB);
    ASSERT_TRUE(a != nullptr && b != nullptr);
    const std::uintptr_t base = a->segment->base;
    Return(a);  // [a free 3 MiB][b live 5 MiB][free 12 MiB]
    CheckAll(1);
    // Overlaps the live block b, or straddles the free a into it.
    ExpectRefused(b->ptr, b->size, absl::StatusCode::kFailedPrecondition);
    ExpectRefused(b->ptr + kMiB, kMiB, absl::StatusCode::kFailedPrecondition);
    ExpectRefused(base + 2 * kMiB, 2 * kMiB, absl::StatusCode::kFailedPrecondition);
    // Runs past the end of the segment.
    ExpectRefused(b->ptr + b->size, 13 * kMiB, absl::StatusCode::kFailedPrecondition);
    // Not a size or offset the pool produces.
    ExpectRefused(base, 1000, absl::StatusCode::kInvalidArgument);
    ExpectRefused(base + 100, kMiB, absl::StatusCode::kInvalidArgument);
    ExpectRefused(base, 0, absl::StatusCode::kInvalidArgument);
    // No segment holds it.
    ExpectRefused(base + 20 * kMiB + 512, kMiB, absl::StatusCode::kNotFound);
    ExpectRefused(base - kMiB, 512, absl::StatusCode::kNotFound);
    // Another stream's memory.
    ExpectRefused(base, kMiB, absl::StatusCode::kFailedPrecondition, reinterpret_cast<Stream>(0x5));
    CheckAll(1);
    // A range inside the free block is accepted.
    absl::StatusOr<LargePool::Handle> h = pool_->TakeAt(base + kMiB, kMiB, nullptr);
    ASSERT_TRUE(h.ok()) << h.status();
    CheckAll(2);
    Return(h->block);
    Return(b);
    CheckAll(0);
  }
}

TEST_F(LargePoolTakeAtTest, TierAndOversizeBlocksAreTakenOnlyWhole) {
  Init({.max_split_size = 32 * kMiB, .tiers = {64 * kMiB}});
  Block* t = Allocate(40 * kMiB);  // the 64 MiB tier
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->segment->tier, 0);
  Block* big = Allocate(100 * kMiB);  // oversize: never split
  ASSERT_NE(big, nullptr);
  const std::uintptr_t pt = t->ptr, pbig = big->ptr;
  Return(t);
  Return(big);
  CheckAll(0);
  ExpectRefused(pt, 32 * kMiB, absl::StatusCode::kFailedPrecondition);
  ExpectRefused(pbig + 2 * kMiB, 50 * kMiB, absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<LargePool::Handle> ht = pool_->TakeAt(pt, 64 * kMiB, nullptr);
  ASSERT_TRUE(ht.ok()) << ht.status();
  absl::StatusOr<LargePool::Handle> hbig = pool_->TakeAt(pbig, 100 * kMiB, nullptr);
  ASSERT_TRUE(hbig.ok()) << hbig.status();
  EXPECT_TRUE(pool_->Oversize(*hbig));
  FragmentationReport frag;
  pool_->AddFragmentation(&frag);
  ASSERT_EQ(frag.tiers.size(), 1u);
  EXPECT_EQ(frag.tiers[0].in_use, 1);
  EXPECT_EQ(frag.tiers[0].cached, 0);
  CheckAll(2);
  Return(ht->block);
  Return(hbig->block);
  CheckAll(0);
}

// Over virtual memory, a carve that cuts granules keeps every invariant: the pool's (lists, counts,
// gauges) and the backing's (each granule's mapping matches its block).
TEST_F(LargePoolTakeAtTest, AnOddCarveOverVirtualMemoryKeepsTheInvariants) {
  LargePoolConfig config;
  config.keep_remainder = 0;
  Init(config, 1024 * kMiB, Backing::kVirtual);
  Block* a = Allocate(6 * kMiB);
  ASSERT_NE(a, nullptr);
  const std::uintptr_t base = a->segment->base;
  Return(a);
  CheckAll(0);
  EXPECT_EQ(pool_->movable_bytes(), 20 * kMiB);
  // An odd carve: 1.5 MiB into the segment, 3 MiB long, across three granules. The free rests
  // [0, 1.5) and [4.5, 6) MiB hold no whole granule; [6, 20) MiB holds seven.
  absl::StatusOr<LargePool::Handle> h = pool_->TakeAt(base + 3 * kMiB / 2, 3 * kMiB, nullptr);
  ASSERT_TRUE(h.ok()) << h.status();
  CheckAll(1);
  EXPECT_EQ(pool_->movable_bytes(), 14 * kMiB);
  Return(h->block);
  CheckAll(0);
  EXPECT_EQ(pool_->movable_bytes(), 20 * kMiB);
}

// ---- The deferred free block (the hit path of an alloc+free pair) ----

// One pool and everything it needs, so that two can run side by side.
struct PoolTwin {
  explicit PoolTwin(const LargePoolConfig& config, std::size_t limit)
      : source(&ledger, limit),
        pool(PoolContext{&ledger, &source, &clock}, config, std::make_unique<PlainBacking>(&source)),
        ss(pool) {}
  StatLedger ledger;
  std::uint64_t clock = 0;
  PoolSource source;
  LargePool pool;
  LargePool::StreamState ss;

  Block* Allocate(std::size_t size) {
    const LargePool::Request r = pool.RequestFor(size);
    Served served;
    absl::StatusOr<LargePool::Handle> h = pool.Serve(ss, nullptr, r, &served);
    return h.ok() ? h->block : nullptr;
  }
};

// Every stat, counter and device gauge of two ledgers, field by field; the first difference.
std::string FirstStatDifference(const DeviceStats& a, const DeviceStats& b) {
  std::string diff;
  auto stat = [&](const char* name, int pool, const Stat& x, const Stat& y) {
    if (diff.empty() &&
        (x.current != y.current || x.peak != y.peak || x.allocated != y.allocated || x.freed != y.freed)) {
      diff = absl::StrCat(name, "[", pool, "]: ", x.current, "/", x.peak, " vs ", y.current, "/", y.peak);
    }
  };
#define BUCKETALLOC_TEST_POOL_STAT(name, doc) \
  for (int p = 0; p < kNumPoolIndices; ++p) stat(#name, p, a.name[p], b.name[p]);
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_TEST_POOL_STAT)
#undef BUCKETALLOC_TEST_POOL_STAT
#define BUCKETALLOC_TEST_COUNTER(name, doc) \
  if (diff.empty() && a.name != b.name) diff = absl::StrCat(#name, ": ", a.name, " vs ", b.name);
  BUCKETALLOC_COUNTERS(BUCKETALLOC_TEST_COUNTER)
#undef BUCKETALLOC_TEST_COUNTER
#define BUCKETALLOC_TEST_DEVICE_STAT(name, doc) stat(#name, -1, a.name, b.name);
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_TEST_DEVICE_STAT)
#undef BUCKETALLOC_TEST_DEVICE_STAT
  return diff;
}

// Every block of a pool by address: (address, size, state, free_since) (a read: it settles).
std::vector<std::tuple<std::uintptr_t, std::size_t, int, std::uint64_t>> Layout(const LargePool& pool) {
  std::vector<std::tuple<std::uintptr_t, std::size_t, int, std::uint64_t>> blocks;
  for (const Segment* seg : pool.segments()) {
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      blocks.emplace_back(b->ptr, b->size, static_cast<int>(b->state),
                          b->state == BlockState::kFree ? b->free_since : 0);
    }
  }
  std::sort(blocks.begin(), blocks.end());
  return blocks;
}

// The pool with its deferred free block against the plain algorithm (defer_free false: every free
// merges at once), through a random churn in the packed small pool's configuration and two large
// pool ones: the same block (address and size) for every request, the same stats, histogram,
// inactive split and release order after every step, and every 97 steps the same blocks, states
// and free times (which the stitcher orders by).
TEST(LargePoolDeferredTest, TheDeferredFreeChangesNoChoiceAndNoFigure) {
  struct Case {
    const char* name;
    LargePoolConfig config;
    std::vector<std::size_t> sizes;
  };
  std::vector<Case> cases(3);
  cases[0].name = "packed";
  cases[0].config.index = kSmallPool;
  cases[0].config.large_segment_size = kSlabBytes;
  cases[0].config.keep_remainder = kMinBlockSize - 1;
  cases[0].sizes = {512, 1024, 1536, 4096, 8192, 65536, 300 << 10, kMiB};
  cases[1].name = "large";
  cases[1].sizes = {kMiB + 512, 2 * kMiB, 3 * kMiB, 7 * kMiB, 17 * kMiB, 30 * kMiB};
  cases[2].name = "large, max_split_size and tiers";
  cases[2].config.max_split_size = 40 * kMiB;
  cases[2].config.tiers = {32 * kMiB, 64 * kMiB};
  cases[2].sizes = {kMiB + 512, 3 * kMiB, 7 * kMiB, 17 * kMiB, 30 * kMiB, 60 * kMiB, 90 * kMiB};
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    c.config.roundup_power2_divisions.assign(16, 0);
    PoolTwin deferred(c.config, 1024 * kMiB);
    LargePoolConfig plain_config = c.config;
    plain_config.defer_free = false;
    PoolTwin plain(plain_config, 1024 * kMiB);
    std::mt19937_64 rng(41);
    std::vector<std::pair<Block*, Block*>> live;  // (deferred's, plain's)
    std::vector<std::size_t> last_freed;          // sizes freed lately: a pair's reuse is the common case
    for (int step = 0; step < 6000; ++step) {
      ++deferred.clock;
      ++plain.clock;
      const auto dice = rng() % 20;
      bool freed = false;
      if (rng() % 8 == 0) {  // peaks at the current figures: the next pair's own peaks decide them
        deferred.ledger.ResetPeaks();
        plain.ledger.ResetPeaks();
      }
      if (dice < 9 || live.empty()) {
        const std::size_t size = !last_freed.empty() && rng() % 2 == 0 ? last_freed[rng() % last_freed.size()]
                                                                       : c.sizes[rng() % c.sizes.size()];
        Block* a = deferred.Allocate(size);
        Block* b = plain.Allocate(size);
        ASSERT_EQ(a == nullptr, b == nullptr) << "step " << step;
        if (a != nullptr) {
          ASSERT_EQ(a->ptr, b->ptr) << "step " << step;  // both sources start at the same address
          ASSERT_EQ(a->size, b->size) << "step " << step;
          live.emplace_back(a, b);
        }
      } else if (dice < 19) {
        const std::size_t i = rng() % live.size();
        last_freed.push_back(live[i].first->size);
        if (last_freed.size() > 4) last_freed.erase(last_freed.begin());
        deferred.pool.Return({live[i].first});
        plain.pool.Return({live[i].second});
        freed = true;
        live[i] = live.back();
        live.pop_back();
      } else {
        ASSERT_EQ(deferred.pool.ReleaseOldest(), plain.pool.ReleaseOldest()) << "step " << step;
      }
      // Every read settles a waiting return: after a free, read only now and then, so that most
      // frees are followed by the next request with the return still waiting.
      if (freed && rng() % 4 != 0) continue;
      if (step % 97 == 0) {
        ASSERT_EQ(Layout(deferred.pool), Layout(plain.pool)) << "step " << step;
      }
      ASSERT_EQ(FirstStatDifference(deferred.ledger.Snapshot(), plain.ledger.Snapshot()), "") << "step " << step;
      FragmentationReport kd, ks;
      deferred.pool.AddFragmentation(&kd);
      plain.pool.AddFragmentation(&ks);
      ASSERT_EQ(kd.pools[c.config.index].free_count, ks.pools[c.config.index].free_count) << "step " << step;
      ASSERT_EQ(kd.pools[c.config.index].free_bytes, ks.pools[c.config.index].free_bytes) << "step " << step;
      ASSERT_EQ(deferred.pool.inactive_split().bytes, plain.pool.inactive_split().bytes) << "step " << step;
      ASSERT_EQ(deferred.pool.OldestFree(), plain.pool.OldestFree()) << "step " << step;
    }
    EXPECT_GT(deferred.pool.taken_back(), 100u);  // pairs took the fast path
    EXPECT_EQ(plain.pool.taken_back(), 0u);
    EXPECT_GT(deferred.ledger.Snapshot().num_splits, 0);
    EXPECT_GT(deferred.ledger.Snapshot().num_merges, 0);
    const auto active = static_cast<std::int64_t>(live.size());
    EXPECT_TRUE(deferred.pool.CheckInvariants(active).ok()) << deferred.pool.CheckInvariants(active);
    EXPECT_TRUE(deferred.pool.CheckStreamState(deferred.ss).ok()) << deferred.pool.CheckStreamState(deferred.ss);
    for (auto& [a, b] : live) {
      deferred.pool.Return({a});
      plain.pool.Return({b});
    }
    EXPECT_EQ(deferred.pool.LargestFree(deferred.ss), plain.pool.LargestFree(plain.ss));
    EXPECT_TRUE(deferred.pool.CheckInvariants(0).ok()) << deferred.pool.CheckInvariants(0);
  }
}

// The pair itself touches no tree: the block freed last stays as it was (its return waits), its
// free neighbour in the tree as the remainder, and the next request of its size takes it back,
// counted as the return and the take; a read of the stats settles a waiting return.
TEST_F(LargePoolTest, AFreedBlockWaitsOutOfTheTreeForTheNextRequestOfItsSize) {
  LargePoolConfig config;
  config.keep_remainder = kMinBlockSize - 1;
  Init(config);
  Block* a = Allocate(2 * kMiB);  // a 20 MiB segment: the block and an 18 MiB remainder
  ASSERT_NE(a, nullptr);
  const std::uintptr_t at = a->ptr;
  Return(a);
  ASSERT_EQ(ss_->tree.size(), 1u);
  EXPECT_EQ(ss_->tree.Last()->size, 18 * kMiB);  // the remainder, not yet merged with it
  EXPECT_EQ(a->state, BlockState::kAllocated);   // the return waits
  Block* again = TryAllocate(2 * kMiB, -1);
  ASSERT_EQ(again, a);
  EXPECT_EQ(pool_->taken_back(), 1u);  // taken back as it was, the tree untouched
  EXPECT_EQ(again->ptr, at);
  ASSERT_EQ(ss_->tree.size(), 1u);
  EXPECT_EQ(Stats().num_splits, 2);  // the first take's and the pair's
  EXPECT_EQ(Stats().num_merges, 1);  // the pair's
  EXPECT_EQ(Stats().active_bytes[kLargePool].allocated, static_cast<std::int64_t>(4 * kMiB));
  EXPECT_EQ(Stats().active_bytes[kLargePool].freed, static_cast<std::int64_t>(2 * kMiB));
  Check(1);
  Return(again);
  EXPECT_EQ(again->state, BlockState::kAllocated);                                            // waits again
  EXPECT_EQ(Stats().cached_bytes[kLargePool].current, static_cast<std::int64_t>(20 * kMiB));  // read: settled
  EXPECT_EQ(again->state, BlockState::kFree);
  EXPECT_EQ(pool_->LargestFree(*ss_), 20 * kMiB);  // one free block again
  EXPECT_EQ(ss_->tree.Last()->size, 20 * kMiB);
  // A request of another size settles it first: best fit over the merged block.
  Block* other = TryAllocate(4 * kMiB, -1);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->ptr, at);
  Check(1);
  Return(other);
  Check(0);
}

}  // namespace
}  // namespace bucketalloc::internal
