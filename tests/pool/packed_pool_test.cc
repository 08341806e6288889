// The packed part of the small pool (src/pool/packed_pool.h): PyTorch's small pool, each case
// computed by hand from reference/pytorch.md §1.3-§1.7 (2 MiB segments, 512-byte rounding, best fit
// by size and address, a split whenever 512 B or more remain, coalescing), counted in the small
// pool's stats.
#include "pool/packed_pool.h"

#include <gtest/gtest.h>

#include <vector>

#include "test_util.h"

namespace bucketalloc::internal {
namespace {

class PackedPoolTest : public ::testing::Test {
 protected:
  StatLedger ledger_;
  std::uint64_t clock_ = 0;
  bucketalloc::testing::FakeSource source_{&ledger_, 4 * kSlabBytes};
  PackedPool pool_{PoolContext{&ledger_, &source_, &clock_}, {}};
  PackedPool::StreamState ss_{pool_};
  PackedPool::StreamState other_{pool_};

  DeviceStats Stats() const { return ledger_.Snapshot(); }
  // Allocates like the front end: the fast path, else the slow path.
  PackedPool::Handle Allocate(std::size_t size, PackedPool::StreamState* ss = nullptr) {
    if (ss == nullptr) ss = &ss_;
    const PackedPool::Request r = pool_.RequestFor(size);
    if (std::optional<PackedPool::Handle> h = pool_.TryAllocate(*ss, r)) return *h;
    Served served;
    absl::StatusOr<PackedPool::Handle> h = pool_.Serve(*ss, nullptr, r, &served);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : PackedPool::Handle{};
  }
  void Return(PackedPool::Handle h) {
    ++clock_;
    pool_.Return(h);
  }
  void Check(std::int64_t active) {
    ASSERT_TRUE(pool_.CheckInvariants(active).ok()) << pool_.CheckInvariants(active);
    ASSERT_TRUE(pool_.CheckStreamState(ss_).ok()) << pool_.CheckStreamState(ss_);
  }
};

TEST_F(PackedPoolTest, AnySizesShareOne2MiBSegmentSplitDownTo512Bytes) {
  PackedPool::Handle a = Allocate(1);     // 512 B
  PackedPool::Handle b = Allocate(700);   // 1024 B
  PackedPool::Handle c = Allocate(kMiB);  // the rest of the segment holds it
  PackedPool::Handle d = Allocate(300 * kKiB);
  EXPECT_EQ(source_.allocs, 1);
  EXPECT_EQ(PackedPool::BlockSize(a), 512u);
  EXPECT_EQ(PackedPool::BlockSize(b), 1024u);
  EXPECT_EQ(PackedPool::Address(b), PackedPool::Address(a) + 512);
  EXPECT_EQ(PackedPool::Address(c), PackedPool::Address(b) + 1024);
  EXPECT_EQ(PackedPool::Address(d), PackedPool::Address(c) + kMiB);
  // Counted in the small pool, as PyTorch's small pool counts every request up to 1 MiB.
  EXPECT_EQ(Stats().reserved_bytes[kSmallPool].current, static_cast<std::int64_t>(kSlabBytes));
  EXPECT_EQ(Stats().active_bytes[kSmallPool].current, static_cast<std::int64_t>(512 + 1024 + kMiB + 300 * kKiB));
  EXPECT_EQ(Stats().active_bytes[kLargePool].current, 0);
  EXPECT_EQ(Stats().cached_bytes[kSmallPool].current,
            static_cast<std::int64_t>(kSlabBytes - 512 - 1024 - kMiB - 300 * kKiB));
  Check(4);
  // 512 B less than what is left: still split off (PyTorch's small pool keeps no remainder inside).
  const std::size_t left = kSlabBytes - 512 - 1024 - kMiB - 300 * kKiB;
  PackedPool::Handle e = Allocate(left - 512);
  EXPECT_EQ(PackedPool::BlockSize(e), left - 512);
  EXPECT_EQ(source_.allocs, 1);
  Check(5);
  for (PackedPool::Handle h : {a, b, c, d, e}) Return(h);
  Check(0);
  EXPECT_EQ(pool_.inactive_split().bytes, 0);
  EXPECT_EQ(pool_.ReleaseOldest(), kSlabBytes) << "coalesced into one wholly free segment";
  EXPECT_EQ(source_.used(), 0u);
}

TEST_F(PackedPoolTest, BestFitBySizeThenAddressAndStreamsApart) {
  PackedPool::Handle a = Allocate(64 * kKiB);
  PackedPool::Handle x = Allocate(512);
  PackedPool::Handle b = Allocate(32 * kKiB);
  PackedPool::Handle y = Allocate(512);
  Return(a);  // free: 64 KiB at the start, 32 KiB after x, and the segment's tail
  Return(b);
  PackedPool::Handle c = Allocate(20 * kKiB);
  EXPECT_EQ(PackedPool::Address(c), PackedPool::Address(x) + 512) << "the smallest free block that fits: 32 KiB";
  PackedPool::Handle d = Allocate(40 * kKiB);
  EXPECT_EQ(PackedPool::Address(d), PackedPool::Address(a)) << "then the 64 KiB one";
  // Another stream never takes this stream's free blocks.
  PackedPool::Handle e = Allocate(512, &other_);
  EXPECT_EQ(source_.allocs, 2);
  for (PackedPool::Handle h : {x, y, c, d, e}) Return(h);
  Check(0);
  pool_.ReleaseAll();
  EXPECT_EQ(source_.used(), 0u);
}

TEST_F(PackedPoolTest, AFullCardIsResourceExhaustedAndNothingChanges) {
  std::vector<PackedPool::Handle> held;
  for (int i = 0; i < 8; ++i) held.push_back(Allocate(kMiB));  // four segments, each two 1 MiB blocks
  EXPECT_EQ(source_.allocs, 4);
  Served served;
  absl::StatusOr<PackedPool::Handle> more = pool_.Serve(ss_, nullptr, pool_.RequestFor(512), &served);
  EXPECT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_EQ(pool_.OomSizes(pool_.RequestFor(700)), std::make_pair(std::size_t{1024}, kSlabBytes));
  Check(8);
  for (PackedPool::Handle h : held) Return(h);
  pool_.ReleaseAll();
  EXPECT_EQ(source_.used(), 0u);
}

}  // namespace
}  // namespace bucketalloc::internal
