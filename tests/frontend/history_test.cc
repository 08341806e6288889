// The history ring (src/frontend/history.cc): off by default, a ring of its capacity, oldest first.
#include "frontend/history.h"

#include <gtest/gtest.h>

namespace bucketalloc::internal {
namespace {

TEST(HistoryRingTest, OffRecordsNothing) {
  HistoryRing h;
  EXPECT_FALSE(h.enabled());
  h.Record(TraceAction::kAlloc, 0x1000, 10, nullptr);
  EXPECT_TRUE(h.Entries().empty());
  EXPECT_TRUE(h.CheckInvariants().ok());
}

TEST(HistoryRingTest, KeepsTheLastEntriesOldestFirst) {
  HistoryRing h;
  h.Reset(3);
  EXPECT_TRUE(h.enabled());
  for (std::uintptr_t i = 1; i <= 5; ++i) h.Record(TraceAction::kAlloc, i, i * 10, nullptr, /*device_free=*/i);
  const std::vector<TraceEntry> e = h.Entries();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].addr, 3u);
  EXPECT_EQ(e[1].addr, 4u);
  EXPECT_EQ(e[2].addr, 5u);
  EXPECT_EQ(e[2].size, 50u);
  EXPECT_LE(e[0].time_us, e[2].time_us);
  EXPECT_TRUE(h.CheckInvariants().ok());
  h.Reset(2);  // a new ring forgets the old history
  EXPECT_TRUE(h.Entries().empty());
  h.Record(TraceAction::kOom, 0, 7, nullptr, 99);
  ASSERT_EQ(h.Entries().size(), 1u);
  EXPECT_EQ(h.Entries()[0].device_free, 99u);
  h.Reset(0);
  EXPECT_FALSE(h.enabled());
}

}  // namespace
}  // namespace bucketalloc::internal
