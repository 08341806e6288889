// The history ring (src/frontend/observability/history.cc): off by default, a ring of its capacity, oldest first.
#include "frontend/observability/history.h"

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
  ASSERT_TRUE(h.Reset(3).ok());
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
  ASSERT_TRUE(h.Reset(2).ok());  // a new ring forgets the old history
  EXPECT_TRUE(h.Entries().empty());
  h.Record(TraceAction::kOom, 0, 7, nullptr, 99);
  ASSERT_EQ(h.Entries().size(), 1u);
  EXPECT_EQ(h.Entries()[0].device_free, 99u);
  ASSERT_TRUE(h.Reset(0).ok());
  EXPECT_FALSE(h.enabled());
}

// The largest ring costs nothing up front (2^24 entries were 768 MiB per device, allocated when
// recording was turned on): it grows by doubling as events come, keeps every event in order
// while it grows, and wraps once full, also when its capacity is not a power of two.
TEST(HistoryRingTest, ALargeRingGrowsWithTheHistory) {
  HistoryRing h;
  ASSERT_TRUE(h.Reset(std::size_t{1} << 24).ok());
  EXPECT_LE(h.allocated_entries(), 1024u);
  for (std::uintptr_t i = 1; i <= 3000; ++i) h.Record(TraceAction::kAlloc, i, 1, nullptr);
  EXPECT_LE(h.allocated_entries(), 4096u);
  std::vector<TraceEntry> e = h.Entries();
  ASSERT_EQ(e.size(), 3000u);
  for (std::size_t i = 0; i < e.size(); ++i) ASSERT_EQ(e[i].addr, i + 1);
  EXPECT_TRUE(h.CheckInvariants().ok());
  ASSERT_TRUE(h.Reset(2500).ok());
  for (std::uintptr_t i = 1; i <= 6000; ++i) {
    h.Record(TraceAction::kAlloc, i, 1, nullptr);
    if (i % 500 == 0) {
      ASSERT_TRUE(h.CheckInvariants().ok()) << h.CheckInvariants();
    }
  }
  EXPECT_EQ(h.allocated_entries(), 2500u);
  e = h.Entries();
  ASSERT_EQ(e.size(), 2500u);
  for (std::size_t i = 0; i < e.size(); ++i) ASSERT_EQ(e[i].addr, 3501 + i);
}

}  // namespace
}  // namespace bucketalloc::internal
