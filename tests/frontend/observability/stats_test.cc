#include "bucketalloc/stats.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/types/span.h"
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

// The memory figures are declared once: each has its member's name and its key with its unit, in
// the timeline's order, and the names are found from the member at compile time.
TEST(MemoryFiguresTest, EachFigureHasItsNameAndKey) {
  std::vector<std::string> names, keys;
  ForEachMemoryFigure([&](const MemoryFigureName& n, auto) {
    names.push_back(n.name);
    keys.push_back(n.key);
  });
  EXPECT_EQ(names, (std::vector<std::string>{"reserved", "allocated", "active", "cached", "requested", "largest_free",
                                             "live_allocations"}));
  EXPECT_EQ(keys, (std::vector<std::string>{"reserved_bytes", "allocated_bytes", "active_bytes", "cached_bytes",
                                            "requested_bytes", "largest_free_block_bytes", "live_allocations"}));
  static_assert(std::string_view(MemoryFigureNameOf(&MemoryFigures::largest_free).key) == "largest_free_block_bytes");
  static_assert(std::string_view(MemoryFigureNameOf(&MemoryFigures::live_allocations).name) == "live_allocations");
}

TEST(MemoryFiguresTest, ADevicesFiguresAreItsAllPoolsStatsAndLargestFreeBlock) {
  DeviceStats s;
  s.reserved_bytes[kLargePool].Add(40 << 20);
  s.reserved_bytes[kSmallPool].Add(2 << 20);
  s.allocated_bytes[kLargePool].Add(20 << 20);
  s.active_bytes[kLargePool].Add(24 << 20);
  s.cached_bytes[kLargePool].Add(16 << 20);
  s.cached_bytes[kSmallPool].Add(2 << 20);
  s.requested_bytes[kLargePool].Add((20 << 20) - 100);
  s.allocation[kLargePool].Add(3);
  for (StatArray DeviceStats::*stat :
       {&DeviceStats::reserved_bytes, &DeviceStats::allocated_bytes, &DeviceStats::active_bytes,
        &DeviceStats::cached_bytes, &DeviceStats::requested_bytes, &DeviceStats::allocation}) {
    (s.*stat)[kAllPools].Add((s.*stat)[kSmallPool].current + (s.*stat)[kLargePool].current);
  }
  FragmentationReport f;
  f.all().largest_free = 10 << 20;
  const MemoryFigures m = MemoryFiguresOf(s, f);
  EXPECT_EQ(m.reserved, std::size_t{42} << 20);
  EXPECT_EQ(m.allocated, std::size_t{20} << 20);
  EXPECT_EQ(m.active, std::size_t{24} << 20);
  EXPECT_EQ(m.cached, m.reserved - m.active);
  EXPECT_EQ(m.requested, (std::size_t{20} << 20) - 100);
  EXPECT_EQ(m.largest_free, std::size_t{10} << 20);
  EXPECT_EQ(m.live_allocations, 3);
}

// Figures of distinct values for the renderings (not consistent memory): figure i of the list
// (from 1) is i MiB, or i for a count.
MemoryFigures DistinctFigures() {
  MemoryFigures m;
  std::size_t i = 0;
  ForEachMemoryFigure([&](const MemoryFigureName&, auto member) {
    using Value = std::remove_reference_t<decltype(m.*member)>;
    ++i;
    m.*member = static_cast<Value>(std::is_same_v<Value, std::size_t> ? i << 20 : i);
  });
  return m;
}

// The OOM report is its figures plus the request: its JSON and text list the figures by their
// names and labels, and `requested` is the request's (the live allocations' is figures()).
TEST(OomReportTest, ListsItsFiguresByTheirNames) {
  OomReport r;
  static_cast<MemoryFigures&>(r) = DistinctFigures();
  r.requested = 10 << 20;
  EXPECT_EQ(r.figures().requested, std::size_t{5} << 20) << "the live allocations'";
  const nlohmann::json j = nlohmann::json::parse(r.ToJson());
  EXPECT_EQ(j["requested"], 10 << 20);
  EXPECT_EQ(j["reserved"], 1 << 20);
  EXPECT_EQ(j["active"], 3 << 20);
  EXPECT_EQ(j["largest_free"], 6 << 20);
  EXPECT_TRUE(absl::StrContains(r.ToString(),
                                "  requested 10.00 MiB (rounded 0 B); cap 0 B; reserved 1.00 MiB; allocated 2.00 MiB; "
                                "active 3.00 MiB; cached 4.00 MiB; largest free block 6.00 MiB; device free 0 B\n"))
      << r.ToString();
}

// A tenant's JSON and its metrics list the same fields, the memory figures under their keys.
TEST(TenantStatsTest, JsonListsTheTenantFields) {
  TenantStats t;
  static_cast<MemoryFigures&>(t) = DistinctFigures();
  t.name = "long";
  t.cap = 64 << 20;
  t.peak_reserved = 12 << 20;
  t.ooms = 2;
  t.ooms_at_cap = 1;
  EXPECT_EQ(TenantStatsToJson({t}),
            "{\"tenants\":[{\"tenant\":\"long\",\"cap_bytes\":67108864,\"reserved_bytes\":1048576,"
            "\"peak_reserved_bytes\":12582912,\"allocated_bytes\":2097152,\"requested_bytes\":5242880,"
            "\"cached_bytes\":4194304,\"live_allocations\":7,\"ooms\":2,\"ooms_at_cap\":1}]}");
  std::vector<std::string> keys;
  ForEachTenantField(t, [&](const char* key, auto, const char* meaning) {
    keys.push_back(key);
    EXPECT_NE(std::string_view(meaning), "") << key;
  });
  EXPECT_EQ(keys.size(), 7u);
}

// The one pool writer is the fragmentation report's writer of each pool.
TEST(FragmentationTest, APoolsJsonIsTheReportsPoolObject) {
  FragmentationReport r;
  r.pools[kLargePool].AddFree(3 << 20, 2);
  r.pools[kLargePool].reserved = 10 << 20;
  const nlohmann::json report = nlohmann::json::parse(FragmentationToJson(r));
  const nlohmann::json pool = nlohmann::json::parse(PoolFragmentationToJson(r.pools[kLargePool]));
  EXPECT_EQ(report["large_pool"], pool);
  EXPECT_EQ(pool["histogram"][0]["min_bytes"], 2 << 20);
  EXPECT_EQ(pool["histogram"][0]["max_bytes"], (4 << 20) - 1);
  EXPECT_EQ(pool["histogram"][0]["count"], 2);
}

// Nearest rank: the smallest sample with at least a fraction q at or below it.
TEST(PercentileTest, IsTheNearestRank) {
  std::vector<std::uint32_t> v = {50, 10, 40, 20, 30};
  EXPECT_EQ(Percentile(absl::MakeSpan(v), 0.0), 10.0);
  EXPECT_EQ(Percentile(absl::MakeSpan(v), 0.2), 10.0);
  EXPECT_EQ(Percentile(absl::MakeSpan(v), 0.5), 30.0);
  EXPECT_EQ(Percentile(absl::MakeSpan(v), 0.99), 50.0);
  EXPECT_EQ(Percentile(absl::MakeSpan(v), 1.0), 50.0);
  std::vector<std::int64_t> many(10000);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = static_cast<std::int64_t>(many.size() - i);  // 10000..1
  EXPECT_EQ(Percentile(absl::MakeSpan(many), 0.99), 9900.0);
  std::vector<std::int64_t> none;
  EXPECT_EQ(Percentile(absl::MakeSpan(none), 0.5), 0.0);
}

}  // namespace
}  // namespace bucketalloc
