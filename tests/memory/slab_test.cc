#include "memory/slab.h"

#include <gtest/gtest.h>

#include <set>

namespace bucketalloc::internal {
namespace {

TEST(SlabTest, AssignGivesEverySlotOnce) {
  Slab slab;
  slab.base = 1 << 30;
  const int cls = SmallSizeClasses::ClassOf(3000);
  slab.Assign(cls);
  EXPECT_EQ(slab.slot_size, SmallSizeClasses::ClassSize(cls));
  EXPECT_EQ(slab.capacity, kSlabBytes / slab.slot_size);
  std::set<std::uint32_t> seen;
  std::uintptr_t prev = 0;
  while (!slab.full()) {
    const std::uint32_t s = slab.PopSlot();
    EXPECT_TRUE(seen.insert(s).second);
    EXPECT_GT(slab.SlotAddress(s) + 1, prev);  // ascending addresses
    EXPECT_LE(slab.SlotAddress(s) + slab.slot_size, slab.base + kSlabBytes);
    prev = slab.SlotAddress(s);
  }
  EXPECT_EQ(seen.size(), slab.capacity);
  for (std::uint32_t s : seen) slab.PushSlot(s);
  EXPECT_EQ(slab.live, 0u);
  // Re-assigning an empty slab to another class works.
  slab.Assign(SmallSizeClasses::kNumClasses - 1);
  EXPECT_EQ(slab.capacity, 2u);
}

}  // namespace
}  // namespace bucketalloc::internal
