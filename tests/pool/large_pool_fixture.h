// tests/pool/large_pool_fixture.h — the large pool over a fake memory source, allocating as the
// front end does, with the segment backing the test chooses: plain (pool/plain_backing.h) or
// virtual memory over fake 2 MiB granules (pool/virtual_backing.h, whose stitcher the stitching
// tests call directly) (large_pool_test, segment_backing_test, stitcher_test).
#ifndef BUCKETALLOC_TESTS_POOL_LARGE_POOL_FIXTURE_H_
#define BUCKETALLOC_TESTS_POOL_LARGE_POOL_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "internal/stat_ledger.h"
#include "pool/large_pool.h"
#include "pool/plain_backing.h"
#include "pool/segment_backing.h"
#include "pool/stitcher.h"
#include "pool/virtual_backing.h"
#include "test_util.h"

namespace bucketalloc::internal {

// The fake source, which can also say that a graph capture is under way.
class PoolSource : public bucketalloc::testing::FakeSource {
 public:
  using FakeSource::FakeSource;
  bool Capturing() const override { return capturing; }
  bool capturing = false;
};

class LargePoolTest : public ::testing::Test {
 protected:
  // What backs the pool's segments: plain allocations, or virtual memory in granules of the
  // config's granularity (the front end's choice with stitching).
  enum class Backing { kPlain, kVirtual };

  void Init(LargePoolConfig config, std::size_t limit = 1024 * kMiB, Backing backing = Backing::kPlain) {
    config.roundup_power2_divisions.assign(16, 0);
    ledger_ = StatLedger();
    source_ = std::make_unique<PoolSource>(&ledger_, limit);
    const PoolContext ctx{&ledger_, source_.get(), &clock_};
    std::unique_ptr<SegmentBacking> segments;
    virtual_ = nullptr;
    if (backing == Backing::kVirtual) {
      auto v = std::make_unique<VirtualBacking>(ctx, config.index, config.granularity, config.grow_piece);
      virtual_ = v.get();
      segments = std::move(v);
    } else {
      segments = std::make_unique<PlainBacking>(source_.get());
    }
    pool_ = std::make_unique<LargePool>(ctx, config, std::move(segments));
    ss_ = std::make_unique<LargePool::StreamState>(*pool_);
  }
  DeviceStats Stats() const { return ledger_.Snapshot(); }
  // Allocates like the front end: cached block, else grow once and take.
  Block* Allocate(std::size_t size) {
    const LargePool::Request r = pool_->RequestFor(size);
    if (std::optional<LargePool::Handle> h = pool_->TryAllocate(*ss_, r)) return h->block;
    const std::size_t seg = r.tier >= 0 ? r.rounded : pool_->SegmentSizeFor(r.rounded);
    absl::StatusOr<Block*> grown = pool_->Grow(*ss_, nullptr, RoundUp(seg, 2 * kMiB), r.rounded, r.tier);
    return grown.ok() ? *grown : nullptr;
  }
  // The fast path alone: a cached block or nullptr.
  Block* TryAllocate(std::size_t rounded, int tier) {
    std::optional<LargePool::Handle> h = pool_->TryAllocate(*ss_, {rounded, tier});
    return h.has_value() ? h->block : nullptr;
  }
  void Return(Block* b) { pool_->Return({b}); }
  void Check(std::int64_t active) {
    ASSERT_TRUE(pool_->CheckInvariants(active).ok()) << pool_->CheckInvariants(active);
    ASSERT_TRUE(pool_->CheckStreamState(*ss_).ok()) << pool_->CheckStreamState(*ss_);
  }
  // Releases everything, as release-and-retry does; returns the bytes the source got back.
  std::size_t ReleaseAll() {
    const std::size_t before = source_->used();
    pool_->ReleaseAll();
    return before - source_->used();
  }

  StatLedger ledger_;
  std::uint64_t clock_ = 0;
  std::unique_ptr<PoolSource> source_;
  std::unique_ptr<LargePool> pool_;
  VirtualBacking* virtual_ = nullptr;  // the pool's backing when it is virtual memory
  std::unique_ptr<LargePool::StreamState> ss_;
};

// Stitching: the fake source maps 2 MiB granules as bookkeeping.

class StitchingPoolTest : public LargePoolTest {
 protected:
  static constexpr std::size_t kG = bucketalloc::testing::FakeSource::kGranule;
  void InitStitching(std::size_t limit, LargePoolConfig config = {}) {
    config.granularity = kG;
    Init(std::move(config), limit, Backing::kVirtual);
  }
  // A stitch of `rounded` bytes (the slow path runs it, through the backing's ServeAtCap, after a
  // grow at the cap failed).
  absl::StatusOr<Block*> Stitch(std::size_t rounded, int tier) {
    return virtual_->stitcher()->Stitch(*pool_, *ss_, nullptr, rounded, tier);
  }
  // An 8 MiB tier, a 16 MiB cap reached by two tier blocks; the first is freed, the second returned.
  Block* TwoTierBlocksTheFirstFreed() {
    LargePoolConfig config;
    config.tiers = {8 * kMiB};
    InitStitching(16 * kMiB, config);
    Block* t1 = Allocate(8 * kMiB);
    Block* t2 = Allocate(8 * kMiB);
    if (t1 == nullptr || t2 == nullptr) return nullptr;
    Return(t1);
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
        Return(blocks[i]);
      } else {
        live.push_back(blocks[i]);
      }
    }
    return live;
  }
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_TESTS_POOL_LARGE_POOL_FIXTURE_H_
