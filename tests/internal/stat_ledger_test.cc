// The stat ledger (src/internal/stat_ledger.h): per-pool gauges, the "all" entry derived when read
// with its peak kept as it happens, resets, and the checks that catch an inconsistent gauge.
#include "internal/stat_ledger.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace bucketalloc::internal {
namespace {

TEST(StatLedgerTest, TheSumOfThePoolsIsDerivedAndItsPeakKept) {
  StatLedger ledger;
  ledger.Increase(&DeviceStats::active_bytes, kSmallPool, 100);
  ledger.Increase(&DeviceStats::active_bytes, kLargePool, 50);  // all: 150, its peak
  ledger.Decrease(&DeviceStats::active_bytes, kSmallPool, 100);
  ledger.Increase(&DeviceStats::active_bytes, kLargePool, 60);  // all: 110; small peaked at 100, large at 110
  const DeviceStats s = ledger.Snapshot();
  const Stat& all = s.active_bytes[kAllPools];
  EXPECT_EQ(all.current, 110);
  EXPECT_EQ(all.peak, 150) << "the peak of the sum, not the sum of the peaks (210)";
  EXPECT_EQ(all.allocated, 210);
  EXPECT_EQ(all.freed, 100);
  EXPECT_EQ(s.active_bytes[kSmallPool].peak, 100);
  EXPECT_EQ(s.active_bytes[kLargePool].peak, 110);
  EXPECT_EQ(ledger.Current(&DeviceStats::active_bytes, kAllPools), 110);
  EXPECT_EQ(ledger.Current(&DeviceStats::active_bytes, kLargePool), 110);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(StatLedgerTest, AddTakesEitherSignAndResetPeaksKeepsTheSums) {
  StatLedger ledger;
  ledger.Add(&DeviceStats::inactive_split, kSmallPool, 7);
  ledger.Add(&DeviceStats::inactive_split, kSmallPool, -3);
  ledger.Add(&DeviceStats::inactive_split, kLargePool, 0);
  ledger.device(&DeviceStats::oversize_segments).Increase(2);
  ledger.device(&DeviceStats::oversize_segments).Decrease(1);
  ledger.ResetPeaks();
  const DeviceStats s = ledger.Snapshot();
  EXPECT_EQ(s.inactive_split[kSmallPool].current, 4);
  EXPECT_EQ(s.inactive_split[kSmallPool].peak, 4);
  EXPECT_EQ(s.inactive_split[kAllPools].peak, 4);
  EXPECT_EQ(s.oversize_segments.peak, 1);
  ledger.Count(&DeviceStats::num_ooms, 2);
  EXPECT_EQ(ledger.counter(&DeviceStats::num_ooms), 2);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(StatLedgerTest, TheFreedTotalsAreDerivedThroughResetsAndSinceTheStart) {
  StatLedger ledger;
  const PoolGauge g = &DeviceStats::active_bytes;
  ledger.Increase(g, kSmallPool, 100);
  ledger.Decrease(g, kSmallPool, 40);
  ledger.Rise(g, kSmallPool, 30);  // up and down: both totals, and the peak if it rose past it
  ledger.Dip(g, kSmallPool, 10);   // down and up: both totals, no peak
  DeviceStats s = ledger.Snapshot();
  EXPECT_EQ(s.active_bytes[kSmallPool].current, 60);
  EXPECT_EQ(s.active_bytes[kSmallPool].allocated, 140);
  EXPECT_EQ(s.active_bytes[kSmallPool].freed, 80);
  EXPECT_EQ(s.active_bytes[kSmallPool].peak, 100);
  EXPECT_EQ(s.active_bytes[kAllPools].freed, 80);
  ledger.ResetAccumulated();  // PyTorch's resetAccumulatedStats: the totals to 0, the current stays
  ledger.Decrease(g, kSmallPool, 20);
  ledger.Rise(g, kSmallPool, 70);  // 40 + 70 passes the peak of 100
  s = ledger.Snapshot();
  EXPECT_EQ(s.active_bytes[kSmallPool].current, 40);
  EXPECT_EQ(s.active_bytes[kSmallPool].allocated, 70);
  EXPECT_EQ(s.active_bytes[kSmallPool].freed, 90);
  EXPECT_EQ(s.active_bytes[kSmallPool].peak, 110);
  EXPECT_EQ(s.active_bytes[kAllPools].peak, 110);
  const DeviceStats since_start = ledger.Snapshot(/*since_start=*/true);
  EXPECT_EQ(since_start.active_bytes[kSmallPool].allocated, 210);
  EXPECT_EQ(since_start.active_bytes[kSmallPool].freed, 170);
  EXPECT_EQ(since_start.active_bytes[kAllPools].freed, 170);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(StatLedgerTest, AGaugeBelowZeroOrAnInconsistentDeviceGaugeIsCaught) {
  StatLedger ledger;
  ledger.Decrease(&DeviceStats::segment, kLargePool, 1);
  absl::Status s = ledger.CheckInvariants();
  EXPECT_TRUE(absl::IsInternal(s));
  EXPECT_TRUE(absl::StrContains(s.message(), "segment.large_pool is inconsistent")) << s;
  ledger.Increase(&DeviceStats::segment, kLargePool, 1);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
  ledger.device(&DeviceStats::oversize_allocations).current = 3;  // without its increments
  s = ledger.CheckInvariants();
  EXPECT_TRUE(absl::StrContains(s.message(), "oversize_allocations is inconsistent")) << s;
}

}  // namespace
}  // namespace bucketalloc::internal
