// The packed part of the small pool (src/pool/packed_pool.h): PyTorch's small pool, each case
// computed by hand from reference/pytorch.md §1.3-§1.7 (2 MiB segments, 512-byte rounding, best fit
// by size and address, a split whenever 512 B or more remain, coalescing), counted in the small
// pool's stats.
#include "pool/packed_pool.h"

#include <gtest/gtest.h>

#include <tuple>
#include <utility>
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

// TakeAt (restoring a checkpoint): freed blocks come back at their addresses and sizes, split out
// of the coalesced free block with remainders on both sides; a range that is not inside one free
// block, or not a 512-byte multiple at a 512-byte offset, is refused and nothing changes.
TEST_F(PackedPoolTest, TakeAtCarvesFreedBlocksBackAndRefusesTheRest) {
  PackedPool::Handle a = Allocate(1);           // 512 B
  PackedPool::Handle b = Allocate(700);         // 1024 B
  PackedPool::Handle c = Allocate(300 * kKiB);  // 300 KiB
  const std::uintptr_t pa = PackedPool::Address(a), pb = PackedPool::Address(b), pc = PackedPool::Address(c);
  Return(a);
  Return(b);
  Return(c);
  Check(0);
  auto view = [&] {
    FragmentationReport f;
    pool_.AddFragmentation(&f);
    const DeviceStats s = Stats();
    return std::tuple(s.active_bytes[kSmallPool].current, s.cached_bytes[kSmallPool].current,
                      s.inactive_split_bytes[kSmallPool].current, s.num_splits, f.pools[kSmallPool].free_count,
                      f.pools[kSmallPool].total_free);
  };
  absl::StatusOr<PackedPool::Handle> hb = pool_.TakeAt(pb, 1024, nullptr);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(PackedPool::Address(*hb), pb);
  EXPECT_EQ(PackedPool::BlockSize(*hb), 1024u);
  Check(1);
  EXPECT_EQ(Stats().inactive_split_bytes[kSmallPool].current, pool_.inactive_split().bytes);
  const auto before = view();
  for (auto [addr, size] : std::vector<std::pair<std::uintptr_t, std::size_t>>{
           {pb, 1024},                   // live
           {pa, 1024},                   // runs into the live block
           {pa, 700},                    // not a block size
           {pa + 100, 512},              // not at a block offset
           {pa + kSlabBytes + 512, 512}  // no segment
       }) {
    absl::StatusOr<PackedPool::Handle> h = pool_.TakeAt(addr, size, nullptr);
    EXPECT_FALSE(h.ok()) << addr << " " << size;
    EXPECT_TRUE(view() == before) << h.status();
  }
  absl::StatusOr<PackedPool::Handle> ha = pool_.TakeAt(pa, 512, nullptr);
  ASSERT_TRUE(ha.ok()) << ha.status();
  absl::StatusOr<PackedPool::Handle> hc = pool_.TakeAt(pc, 300 * kKiB, nullptr);
  ASSERT_TRUE(hc.ok()) << hc.status();
  EXPECT_EQ(Stats().active_bytes[kSmallPool].current, static_cast<std::int64_t>(512 + 1024 + 300 * kKiB));
  Check(3);
  EXPECT_EQ(Stats().inactive_split_bytes[kSmallPool].current, pool_.inactive_split().bytes);
  EXPECT_EQ(Stats().inactive_split[kSmallPool].current, pool_.inactive_split().count);
  Return(*ha);
  Return(*hb);
  Return(*hc);
  Check(0);
  EXPECT_EQ(source_.allocs, 1);
}

}  // namespace
}  // namespace bucketalloc::internal
