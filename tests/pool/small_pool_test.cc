#include "pool/small_pool.h"

#include <gtest/gtest.h>

#include <vector>

#include "test_util.h"

namespace bucketalloc::internal {
namespace {

class SmallPoolTest : public ::testing::Test {
 protected:
  DeviceStats stats_;
  std::uint64_t clock_ = 0;
  bucketalloc::testing::FakeSource source_{&stats_, 8 * kSlabBytes};
  SmallPool pool_{PoolContext{&stats_, &source_, &clock_}};
  SmallPool::StreamState ss_;

  SmallPool::Slot Allocate(std::size_t size) {
    const int cls = SmallSizeClasses::ClassOf(size);
    SmallPool::Slot slot;
    if (!pool_.TryAllocate(ss_, cls, &slot)) {
      bool from_cache = false;
      absl::Status s = pool_.AllocateSlow(ss_, nullptr, cls, &slot, &from_cache);
      EXPECT_TRUE(s.ok()) << s;
    }
    return slot;
  }
};

TEST_F(SmallPoolTest, PacksOneClassPerSlabAndReusesEmptySlabs) {
  std::vector<SmallPool::Slot> slots;
  const std::size_t size = 64 * kKiB;
  const std::uint32_t per_slab = kSlabBytes / (64 * kKiB);
  for (std::uint32_t i = 0; i < per_slab + 1; ++i) slots.push_back(Allocate(size));
  EXPECT_EQ(source_.allocs, 2);  // the second slab only after the first is full
  EXPECT_EQ(slots[0].slab, slots[per_slab - 1].slab);
  EXPECT_NE(slots[0].slab, slots[per_slab].slab);
  EXPECT_EQ(stats_.active[kSmallPool].current, per_slab + 1);
  EXPECT_EQ(stats_.inactive_split_bytes[kSmallPool].current, static_cast<std::int64_t>((per_slab - 1) * size));
  ASSERT_TRUE(pool_.CheckInvariants(per_slab + 1).ok());

  for (const auto& s : slots) pool_.Return(s.slab, s.slot);
  EXPECT_EQ(stats_.inactive_split_bytes[kSmallPool].current, 0);
  EXPECT_EQ(stats_.cached_bytes[kSmallPool].current, 0 + 2 * static_cast<std::int64_t>(kSlabBytes));
  ASSERT_TRUE(pool_.CheckInvariants(0).ok());

  // An empty slab serves another class without a backend call.
  Allocate(3000);
  EXPECT_EQ(source_.allocs, 2);
  ASSERT_TRUE(pool_.CheckInvariants(1).ok());
}

TEST_F(SmallPoolTest, ReleasesEmptySlabsOldestFirst) {
  SmallPool::Slot a = Allocate(kMiB);
  SmallPool::Slot b = Allocate(512 * kKiB);
  ++clock_;
  pool_.Return(b.slab, b.slot);  // b's slab empties first: the oldest
  ++clock_;
  pool_.Return(a.slab, a.slot);
  EXPECT_LT(pool_.OldestEmpty(), clock_);
  EXPECT_EQ(pool_.ReleaseEmpty(1), kSlabBytes);  // one slab covers the target
  EXPECT_EQ(source_.frees, 1);
  EXPECT_EQ(source_.used(), kSlabBytes);
  ASSERT_TRUE(pool_.CheckInvariants(0).ok());
  EXPECT_EQ(pool_.ReleaseEmpty(~std::size_t{0}), kSlabBytes);
  EXPECT_EQ(source_.used(), 0u);
  EXPECT_EQ(stats_.cached_bytes[kSmallPool].current, 0);
}

TEST_F(SmallPoolTest, ExhaustedSourceIsReported) {
  std::vector<SmallPool::Slot> slots;
  for (int i = 0; i < 8 * 2; ++i) slots.push_back(Allocate(kMiB));  // 8 slabs of 2
  SmallPool::Slot extra;
  bool from_cache = false;
  absl::Status s = pool_.AllocateSlow(ss_, nullptr, SmallSizeClasses::ClassOf(kMiB), &extra, &from_cache);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  ASSERT_TRUE(pool_.CheckInvariants(16).ok());
  PoolFragmentation frag;
  pool_.Fragmentation(&frag);
  EXPECT_EQ(frag.total_free, 0);
  for (const auto& slot : slots) pool_.Return(slot.slab, slot.slot);
}

}  // namespace
}  // namespace bucketalloc::internal
