#include "bucketalloc/stats.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"

namespace bucketalloc {
namespace {

TEST(StatTest, TracksCurrentPeakAllocatedFreed) {
  Stat s;
  s.Add(10);
  s.Add(5);
  s.Add(-12);
  EXPECT_EQ(s.current, 3);
  EXPECT_EQ(s.peak, 15);
  EXPECT_EQ(s.allocated, 15);
  EXPECT_EQ(s.freed, 12);
  s.ResetPeak();
  EXPECT_EQ(s.peak, 3);
}

TEST(StatsJsonTest, UsesPyTorchKeys) {
  DeviceStats s;
  s.allocated_bytes[kAllPools].Add(4096);
  s.reserved_bytes[kLargePool].Add(20 << 20);
  s.num_alloc_retries = 2;
  const nlohmann::json j = nlohmann::json::parse(StatsToJson(s));
  EXPECT_EQ(j["allocated_bytes.all.current"], 4096);
  EXPECT_EQ(j["reserved_bytes.large_pool.peak"], 20 << 20);
  EXPECT_EQ(j["num_alloc_retries"], 2);
  for (const char* key : {"inactive_split_bytes.all.current", "requested_bytes.small_pool.freed", "num_ooms",
                          "active.large_pool.allocated", "segment.all.current", "num_device_alloc", "num_device_free",
                          "max_split_size", "cached_bytes.all.peak"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  const std::string summary = StatsSummary(s, 0);
  EXPECT_TRUE(absl::StartsWith(summary, TorchMemorySummary(s, 0, false))) << summary;
  EXPECT_TRUE(absl::StrContains(summary, "| Allocated memory      |   4096 B   |")) << summary;
  EXPECT_TRUE(absl::StrContains(summary, "cudaMalloc retries: 2 ")) << summary;
  EXPECT_TRUE(absl::StrContains(summary, "num_alloc_retries")) << summary;
  EXPECT_TRUE(absl::StrContains(summary, "cached_bytes")) << summary;
}

TEST(FragmentationTest, Ratios) {
  PoolFragmentation p;
  EXPECT_EQ(p.external_fragmentation(), 0.0);
  EXPECT_EQ(p.internal_fragmentation(), 0.0);
  p.total_free = 100;
  p.largest_free = 25;
  p.requested = 90;
  p.allocated = 120;
  EXPECT_DOUBLE_EQ(p.external_fragmentation(), 0.75);
  EXPECT_DOUBLE_EQ(p.internal_fragmentation(), 0.25);
  FragmentationReport r;
  r.pools[kLargePool] = p;
  r.pools[kLargePool].free_count[20] = 3;
  r.pools[kLargePool].free_bytes[20] = 3 << 20;
  r.tiers.push_back({64 << 20, 2, 1});
  const nlohmann::json j = nlohmann::json::parse(FragmentationToJson(r));
  EXPECT_DOUBLE_EQ(j["large_pool"]["external_fragmentation"].get<double>(), 0.75);
  EXPECT_EQ(j["large_pool"]["histogram"][0]["count"], 3);
  EXPECT_EQ(j["large_pool"]["histogram"][0]["min_bytes"], 1 << 20);
  EXPECT_EQ(j["tiers"][0]["in_use"], 2);
  const std::string table = FragmentationToTable(r);
  EXPECT_TRUE(absl::StrContains(table, "external fragmentation 75.0%")) << table;
}

TEST(OomReportTest, RendersCauseAndNumbers) {
  OomReport r;
  r.requested = 3 << 20;
  r.rounded = 3 << 20;
  r.cause = OomCause::kFragmentation;
  r.diagnosis = "fragmentation: ...";
  EXPECT_STREQ(OomCauseName(OomCause::kCacheHeld), "cache held");
  EXPECT_TRUE(absl::StrContains(r.ToString(), "fragmentation: ..."));
  const nlohmann::json j = nlohmann::json::parse(r.ToJson());
  EXPECT_EQ(j["cause"], "fragmentation");
  EXPECT_EQ(j["requested"], 3 << 20);
}

}  // namespace
}  // namespace bucketalloc
