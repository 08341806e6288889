#include "pool/small_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "test_util.h"

namespace bucketalloc::internal {
namespace {

class SmallPoolTest : public ::testing::Test {
 protected:
  StatLedger ledger_;
  std::uint64_t clock_ = 0;
  bucketalloc::testing::FakeSource source_{&ledger_, 8 * kSlabBytes};
  SmallPool pool_{PoolContext{&ledger_, &source_, &clock_}};
  SmallPool::StreamState ss_{pool_};

  DeviceStats Stats() const { return ledger_.Snapshot(); }
  // Allocates like the front end: the fast path, else the slow path.
  SmallPool::Handle Allocate(std::size_t size) {
    const SmallPool::Request r = pool_.RequestFor(size);
    if (std::optional<SmallPool::Handle> h = pool_.TryAllocate(ss_, r)) return *h;
    Served served;
    absl::StatusOr<SmallPool::Handle> h = pool_.Serve(ss_, nullptr, r, &served);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : SmallPool::Handle{};
  }
  void Check(std::int64_t active) {
    ASSERT_TRUE(pool_.CheckInvariants(active).ok()) << pool_.CheckInvariants(active);
    ASSERT_TRUE(pool_.CheckStreamState(ss_).ok()) << pool_.CheckStreamState(ss_);
  }
};

TEST_F(SmallPoolTest, PacksOneClassPerSlabAndReusesEmptySlabs) {
  std::vector<SmallPool::Handle> slots;
  const std::size_t size = 64 * kKiB;
  const std::uint32_t per_slab = kSlabBytes / (64 * kKiB);
  for (std::uint32_t i = 0; i < per_slab + 1; ++i) slots.push_back(Allocate(size));
  EXPECT_EQ(source_.allocs, 2);  // the second slab only after the first is full
  EXPECT_EQ(slots[0].slab, slots[per_slab - 1].slab);
  EXPECT_NE(slots[0].slab, slots[per_slab].slab);
  EXPECT_EQ(Stats().active[kSmallPool].current, per_slab + 1);
  EXPECT_EQ(Stats().inactive_split_bytes[kSmallPool].current, static_cast<std::int64_t>((per_slab - 1) * size));
  Check(per_slab + 1);

  for (const auto& s : slots) pool_.Return(s);
  EXPECT_EQ(Stats().inactive_split_bytes[kSmallPool].current, 0);
  EXPECT_EQ(Stats().cached_bytes[kSmallPool].current, 0 + 2 * static_cast<std::int64_t>(kSlabBytes));
  Check(0);

  // An empty slab serves another class without a backend call.
  Allocate(3000);
  EXPECT_EQ(source_.allocs, 2);
  Check(1);
}

TEST_F(SmallPoolTest, ReleasesEmptySlabsOldestFirst) {
  SmallPool::Handle a = Allocate(kMiB);
  SmallPool::Handle b = Allocate(512 * kKiB);
  ++clock_;
  pool_.Return(b);  // b's slab empties first: the oldest
  ++clock_;
  pool_.Return(a);
  EXPECT_LT(pool_.OldestFree(), clock_);
  EXPECT_EQ(ReleaseOldestUntil(pool_, 1), kSlabBytes);  // one slab covers the target
  EXPECT_EQ(source_.frees, 1);
  EXPECT_EQ(source_.used(), kSlabBytes);
  Check(0);
  EXPECT_EQ(ReleaseOldestUntil(pool_, ~std::size_t{0}), kSlabBytes);
  EXPECT_EQ(source_.used(), 0u);
  EXPECT_EQ(Stats().cached_bytes[kSmallPool].current, 0);
}

// The free-slot histogram a scrape reads is kept as slots move: through a churn of several classes
// (slabs filling, emptying, re-assigned to another class, released) it equals a walk's, and the
// largest free block is an empty slab's or the largest class with a free slot.
TEST_F(SmallPoolTest, KeptFragmentationEqualsAWalkThroughChurn) {
  std::mt19937_64 rng(27);
  const std::size_t sizes[] = {512, 3000, 64 * kKiB, 300 * kKiB, kMiB};
  std::vector<SmallPool::Handle> live;
  for (int step = 0; step < 2000; ++step) {
    const auto dice = rng() % 10;
    if ((dice < 5 || live.empty())) {
      const SmallPool::Request r = pool_.RequestFor(sizes[rng() % std::size(sizes)]);
      std::optional<SmallPool::Handle> h = pool_.TryAllocate(ss_, r);
      if (!h.has_value()) {
        Served served;
        absl::StatusOr<SmallPool::Handle> s = pool_.Serve(ss_, nullptr, r, &served);
        if (s.ok()) h = *s;
      }
      if (h.has_value()) live.push_back(*h);
    } else if (dice < 9) {
      const std::size_t i = rng() % live.size();
      pool_.Return(live[i]);
      live[i] = live.back();
      live.pop_back();
    } else {
      pool_.ReleaseOldest();
    }
    FragmentationReport kept;
    FragmentationReport walked;
    pool_.AddFragmentation(&kept);
    pool_.WalkFragmentation(&walked);
    ASSERT_EQ(kept.small_pool().free_count, walked.small_pool().free_count) << "step " << step;
    ASSERT_EQ(kept.small_pool().free_bytes, walked.small_pool().free_bytes) << "step " << step;
    ASSERT_EQ(kept.small_pool().total_free, walked.small_pool().total_free) << "step " << step;
    ASSERT_EQ(static_cast<std::int64_t>(pool_.LargestFree(ss_)), walked.small_pool().largest_free) << "step " << step;
  }
  Check(static_cast<std::int64_t>(live.size()));
  for (const auto& h : live) pool_.Return(h);
}

TEST_F(SmallPoolTest, ExhaustedSourceIsReported) {
  std::vector<SmallPool::Handle> slots;
  for (int i = 0; i < 8 * 2; ++i) slots.push_back(Allocate(kMiB));  // 8 slabs of 2
  Served served;
  absl::StatusOr<SmallPool::Handle> extra = pool_.Serve(ss_, nullptr, pool_.RequestFor(kMiB), &served);
  EXPECT_TRUE(absl::IsResourceExhausted(extra.status())) << extra.status();
  Check(16);
  FragmentationReport frag;
  pool_.AddFragmentation(&frag);
  EXPECT_EQ(frag.small_pool().total_free, 0);
  for (const auto& slot : slots) pool_.Return(slot);
}

// TakeAt (restoring a checkpoint): a free slot comes back at its address when the range is exactly
// that slot; an empty slab takes the class of the size first; anything else is refused and nothing
// changes.
TEST_F(SmallPoolTest, TakeAtTakesExactlyOneFreeSlot) {
  const std::size_t size = 64 * kKiB;
  SmallPool::Handle s0 = Allocate(size);
  SmallPool::Handle s1 = Allocate(size);
  SmallPool::Handle s2 = Allocate(size);
  Slab* slab = s0.slab;
  const std::uintptr_t p1 = SmallPool::Address(s1);
  pool_.Return(s1);
  Check(2);
  auto view = [&] {
    FragmentationReport f;
    pool_.AddFragmentation(&f);
    const DeviceStats s = Stats();
    return std::tuple(s.active_bytes[kSmallPool].current, s.cached_bytes[kSmallPool].current,
                      s.inactive_split_bytes[kSmallPool].current, f.pools[kSmallPool].free_count, slab->free_top,
                      slab->cls);
  };
  const auto before = view();
  for (auto [addr, bytes] : std::vector<std::pair<std::uintptr_t, std::size_t>>{
           {SmallPool::Address(s0), size},          // live
           {p1, size / 2},                          // not the slot size
           {p1 + 512, size},                        // inside a slot
           {slab->base + kSlabBytes + 4096, size},  // no slab
       }) {
    absl::StatusOr<SmallPool::Handle> h = pool_.TakeAt(addr, bytes, nullptr);
    EXPECT_FALSE(h.ok()) << addr << " " << bytes;
    EXPECT_TRUE(view() == before) << h.status();
  }
  EXPECT_TRUE(absl::IsNotFound(pool_.TakeAt(slab->base + kSlabBytes + 4096, size, nullptr).status()));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(pool_.TakeAt(p1, size, reinterpret_cast<Stream>(0x5)).status()));  // another stream
  absl::StatusOr<SmallPool::Handle> h1 = pool_.TakeAt(p1, size, nullptr);
  ASSERT_TRUE(h1.ok()) << h1.status();
  EXPECT_EQ(SmallPool::Address(*h1), p1);
  EXPECT_EQ(h1->slab, slab);
  Check(3);
  EXPECT_EQ(Stats().inactive_split_bytes[kSmallPool].current, pool_.inactive_split().bytes);
  // The slab empties; it is then given the class of a 4 KiB slot at an address of its own.
  for (SmallPool::Handle h : {s0, *h1, s2}) pool_.Return(h);
  Check(0);
  absl::StatusOr<SmallPool::Handle> small = pool_.TakeAt(slab->base + 3 * 4096, 4096, nullptr);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(slab->slot_size, 4096u);
  EXPECT_EQ(small->slot, 3u);
  Check(1);
  SmallPool::Handle next = Allocate(4096);  // the same slab serves the class on the fast path
  EXPECT_EQ(next.slab, slab);
  EXPECT_NE(next.slot, 3u);
  Check(2);
  EXPECT_EQ(Stats().inactive_split_bytes[kSmallPool].current, pool_.inactive_split().bytes);
  pool_.Return(*small);
  pool_.Return(next);
  Check(0);
}

}  // namespace
}  // namespace bucketalloc::internal
