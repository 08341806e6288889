#include "workload/kv_workload.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace bucketalloc::workload {
namespace {

TEST(KvWorkloadTest, DeterministicAndFreesEverything) {
  auto run = [] {
    auto allocator = testing::MakeAllocator("sim_total_memory:64GiB", /*backed=*/false);
    KvWorkloadConfig config;
    config.steps = 60;
    KvWorkloadResult r = RunKvWorkload(*allocator, config);
    const DeviceStats s = *allocator->GetStats(0);
    EXPECT_EQ(s.allocated_bytes[kAllPools].current, 0);
    EXPECT_EQ(s.allocation[kAllPools].allocated, r.allocations);
    EXPECT_GT(s.allocation[kSmallPool].allocated, 0);  // per-request metadata uses the small pool
    EXPECT_TRUE(allocator->CheckInvariants(0).ok());
    return r;
  };
  const KvWorkloadResult a = run();
  const KvWorkloadResult b = run();
  EXPECT_EQ(a.steps_completed, 60);
  EXPECT_EQ(a.failures, 0);
  EXPECT_EQ(a.allocations, b.allocations);
  EXPECT_EQ(a.peak_requested, b.peak_requested);
  EXPECT_GT(a.peak_requested, 0u);
  EXPECT_LE(a.peak_requested, a.peak_allocated);
  EXPECT_LE(a.peak_allocated, a.peak_reserved);
}

TEST(KvWorkloadTest, ReportsTheFirstOom) {
  auto allocator = testing::MakeAllocator("capacity:1GiB,sim_total_memory:64GiB", /*backed=*/false);
  KvWorkloadResult r = RunKvWorkload(*allocator, KvWorkloadConfig{});
  ASSERT_TRUE(r.oom.has_value());
  EXPECT_EQ(r.failures, 1);
  EXPECT_LT(r.steps_completed, 300);
  EXPECT_EQ(allocator->GetStats(0)->allocated_bytes[kAllPools].current, 0);
}

}  // namespace
}  // namespace bucketalloc::workload
