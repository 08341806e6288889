// The OOM log (src/frontend/observability/oom_log.h): the last report whole, the recent OOMs as
// events, at most DeviceMetrics::kRecentOoms of them, oldest first.
#include "frontend/observability/oom_log.h"

#include <gtest/gtest.h>

namespace bucketalloc::internal {
namespace {

OomReport Report(OomCause cause, std::size_t requested, bool at_tenant_cap = false) {
  OomReport r;
  r.cause = cause;
  r.requested = requested;
  r.tenant = "long";
  r.tenant_cap = 12 << 20;
  r.at_tenant_cap = at_tenant_cap;
  return r;
}

TEST(OomLogTest, StartsEmpty) {
  OomLog log;
  EXPECT_FALSE(log.last().has_value());
  EXPECT_TRUE(log.recent().empty());
}

TEST(OomLogTest, KeepsTheLastReportAndTheRecentEventsOldestFirst) {
  OomLog log;
  const std::size_t n = DeviceMetrics::kRecentOoms + 3;
  for (std::size_t i = 1; i <= n; ++i) log.Record(Report(OomCause::kFragmentation, i * 512), i, i * 512);
  ASSERT_TRUE(log.last().has_value());
  EXPECT_EQ(log.last()->requested, n * 512);
  const std::vector<OomEvent> recent = log.recent();
  ASSERT_EQ(recent.size(), DeviceMetrics::kRecentOoms);
  EXPECT_EQ(recent.front().seq, n - DeviceMetrics::kRecentOoms + 1);
  EXPECT_EQ(recent.back().seq, n);
  EXPECT_EQ(recent.back().size, n * 512);
  for (std::size_t i = 1; i < recent.size(); ++i) EXPECT_LT(recent[i - 1].seq, recent[i].seq);
  EXPECT_GT(recent.back().time_s, 1.6e9);  // seconds since the epoch
}

TEST(OomLogTest, AnEventNamesTheTenantOnlyWhenItsCapRefused) {
  OomLog log;
  log.Record(Report(OomCause::kCapacity, 4096), 1, 4096);
  log.Record(Report(OomCause::kTenantCap, 8192, /*at_tenant_cap=*/true), 2, 8192);
  const std::vector<OomEvent> recent = log.recent();
  ASSERT_EQ(recent.size(), 2u);
  EXPECT_EQ(recent[0].tenant, "");
  EXPECT_EQ(recent[0].tenant_cap, 0u);
  EXPECT_EQ(recent[1].tenant, "long");
  EXPECT_EQ(recent[1].tenant_cap, 12u << 20);
  EXPECT_EQ(recent[1].cause, OomCause::kTenantCap);
}

}  // namespace
}  // namespace bucketalloc::internal
